"""`smlaunch plan --trace` end to end: the CLI starts `python -m container trace`, which builds rank 0
of the job's whole world on torch's fake process group with the runtime's own code and traces one
step; the bytes the rank holds are checked against arithmetic of the model's shapes, not against the
planner. The model is the tiny preset (llama3-tiny: hidden 64, 2 blocks, 4 heads, 2 key/value heads
of 16, MLP 176, vocabulary 256, untied head), so each trace takes a few seconds."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from launcher.config.jobfile import validate_job_file
from launcher.plan.trace import TraceError, request, trace_requests
from launcher.wire.trace_record import FIGURES

ROOT = Path(__file__).resolve().parents[2]
H, KV, MLP, VOCAB, LAYERS = 64, 2 * 16, 176, 256, 2
# every parameter's shape: FSDP2 shards dim 0 over the sharding group, padding it to equal shards
BLOCK = [(H, H), (KV, H), (KV, H), (H, H), (MLP, H), (MLP, H), (H, MLP), (H,), (H,)]
ROOT_PARAMS = [(VOCAB, H), (H,), (VOCAB, H)]
SHAPES = BLOCK * LAYERS + ROOT_PARAMS
PARAMETERS = sum(math.prod(s) for s in SHAPES)  # 125,248


def shard_bytes(group: int) -> int:
    """fp32 bytes of one rank's shards: dim 0 padded up to a multiple of the group, then split."""
    return sum(4 * math.ceil(s[0] / group) * math.prod(s[1:]) for s in SHAPES)


def job_file(tmp_path: Path, processes: int, hybrid_shard: int) -> Path:
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "ml.p5.48xlarge",
           "instance_count": 2, "processes_per_host": processes,
           "hyperparameters": {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 256,
                               "train_batch_size": 2, "max_steps": 2, "bf16": 1, "delayed_param": 1},
           "distribution": {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
               "enabled": True, "parameters": {"hybrid_shard_degree": hybrid_shard}}}}}
    path = tmp_path / f"tiny-{processes}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def plan_trace(tmp_path: Path, processes: int, hybrid_shard: int) -> dict:
    path = job_file(tmp_path, processes, hybrid_shard)
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "plan", str(path), "--trace", "--json"],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    return row["trace"]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trace")


@pytest.fixture(scope="module")
def traces(tmp) -> dict[int, dict]:
    return {8: plan_trace(tmp, 8, 8), 3: plan_trace(tmp, 3, 3)}


def test_rank_0_holds_an_eighth_of_the_parameters_gradients_and_optimizer_state(traces):
    trace = traces[8]
    assert trace["world_size"] == 16
    rank = trace["ranks"][0]
    assert rank["rank"] == 0 and rank["mesh"]["dp_shard"] == 8 and rank["mesh"]["dp_replicate"] == 2
    assert PARAMETERS % 8 == 0 and all(s[0] % 8 == 0 for s in SHAPES)  # no padding at 8
    assert rank["parameter_bytes"] == 4 * PARAMETERS // 8 == shard_bytes(8)
    assert rank["gradient_bytes"] == 4 * PARAMETERS // 8  # fp32 reduce-scattered gradients
    # AdamW: two fp32 moments per parameter, and each parameter's 4-byte step count
    assert rank["optimizer_bytes"] == 2 * 4 * PARAMETERS // 8 + 4 * len(SHAPES)
    assert rank["peak_bytes"] > rank["parameter_bytes"] + rank["gradient_bytes"]
    assert rank["planned_peak_bytes"] > 0 and rank["peak_at"]["phase"] in ("forward", "backward", "optimizer")


def test_a_group_of_3_pads_each_shard_as_fsdp2_does(traces):
    """The control: the same model over 3 ranks, where 64, 32 and 176 rows do not split evenly."""
    rank = traces[3]["ranks"][0]
    assert shard_bytes(3) > 4 * PARAMETERS / 3  # the padding is there to be seen
    assert rank["parameter_bytes"] == shard_bytes(3) != traces[8]["ranks"][0]["parameter_bytes"]


def test_the_step_issues_fsdp2s_collectives_once_per_unit(traces):
    """Three FSDP units (2 blocks and the root): 3 all-gathers in forward, 2 again in backward (a block
    is resharded after its forward; the root is not), 3 reduce-scatters; the gradients' all-reduce
    across the 2 replicas of HSDP, once per unit."""
    rows = {(c["kind"], c["group"]): c for c in traces[8]["ranks"][0]["collectives"]}
    gather, scatter = rows["_allgather_base", "dp_shard_cp"], rows["_reduce_scatter_base", "dp_shard_cp"]
    assert (gather["count"], scatter["count"], gather["group_size"]) == (5, 3, 8)
    assert rows["allreduce", "dp_replicate"]["count"] == 3
    # what rank 0 passes in: its bf16 shards to each all-gather, the fp32 unsharded gradients to each reduce-scatter
    block = sum(math.prod(s) for s in BLOCK)
    assert gather["bytes"] == 2 * (PARAMETERS + LAYERS * block) // 8
    assert scatter["bytes"] == 4 * PARAMETERS


def test_ranks_traced_in_one_process_are_what_a_process_each_traces_and_a_broken_one_is_named(tmp, traces):
    """Several requests to one `python -m container trace` (a pipelined job's ranks, a benchmark's
    jobs: launcher.plan.trace.trace_jobs): each rank is traced in a process forked from it, with the
    same figures, to the byte, as the CLI's process per job above; a request whose trace dies
    (here its model lacks a field) comes back as that rank's error, naming the exception, and the
    ranks beside it are still traced (the control: a process of their own each, above)."""
    jobs = {n: validate_job_file(job_file(tmp, n, n)) for n in (8, 3)}
    broken = replace(request(jobs[3], 0), model={"name": "no shapes"})
    got = trace_requests([request(jobs[8], 0), broken, request(jobs[3], 0)])
    for result, alone in ((got[0], traces[8]["ranks"][0]), (got[2], traces[3]["ranks"][0])):
        shared = (result.keys() & alone.keys()) - {"seconds"}  # the CLI's JSON leaves peak_kinds out
        assert {*FIGURES, "collectives", "mesh", "peak_at"} <= shared
        assert {k: result[k] for k in shared} == {k: alone[k] for k in shared}
    assert isinstance(got[1], TraceError) and "failed (exit 1): TypeError" in str(got[1]), got[1]
