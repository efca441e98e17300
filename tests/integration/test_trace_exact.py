"""The trace is exact where a real run can check it (issue 51, section 2): at worlds 2 and 4 on gloo, what
`plan --trace`'s runtime side (container.trace.step.trace_rank, which `python -m container trace` runs; each rank
forked from the fork server here) says each rank holds equals what a real
train.py run of the same job holds on that rank, as the run logs it after its first step
(container.holdings: "rank r holds ... (parameters / gradients / optimizer state B)"). The layouts
are each a family's: FSDP2 over both ranks, tensor parallelism (its norms are replicated, so the
figures change: the control), hybrid sharding that replicates the whole model on each rank,
context parallelism (its K/V all-gathers among the collectives), expert parallelism on the tiny
Mixtral (its tokens' all-to-alls among the collectives), pipeline parallelism (each rank one stage,
its sends and receives among the collectives), FSDP2 with two accumulation passes a step, LoRA
(all-linear adapters of rank 4 on the frozen base, sharded with it), QLoRA (the same on an NF4 base, a
tiny Llama whose linear layers NF4 quantizes whole: tests/support/nf4_reference.py), and at
world 4 HSDP: 2 replicas of a 2-way shard (the replicas' gradient all-reduce among the collectives).
The collectives are compared too: each rank's second step of the real run counted by the trace's own
counter (tests/support/counted_steps.py) against the trace's traced step: kind, group, count, bytes.
That step routes MoE tokens evenly, as the trace does (container.trace.routing): the all-to-alls'
sizes follow the routing, which a trace cannot know."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from container.args import parse_args
from container.distributed.runtime import distribution_parameters
from launcher.wire.trace_record import TraceRequest, spec_to_dict
from launcher.wire.training.degrees import script_arguments
from launcher.wire.training.hf_config import spec_from_hf_config
from launcher.wire.training.models import PRESETS
from tests.support.counted_steps import counted_rank, trace_world
from tests.support.hf_models import llama_config, save_llama
from tests.support.nf4_reference import QLORA_SHAPES
from tests.support.train_runs import TINY, run_train

HOLDS = re.compile(r"rank (\d+) holds .*\(([\d,]+) / ([\d,]+) / ([\d,]+) B\)")
# name: (world, mp_parameters)
LAYOUTS = {"fsdp2": (2, "hybrid_shard_degree=2"), "tp2": (2, "tensor_parallel_degree=2"),
           "replicated": (2, "hybrid_shard_degree=1"), "cp2": (2, "context_parallel_degree=2"),
           "hsdp4": (4, "hybrid_shard_degree=2"), "ep2": (2, "expert_parallel_degree=2"),
           "pp2": (2, "pipeline_parallel_degree=2,microbatches=2"), "fsdp2_accum2": (2, "hybrid_shard_degree=2"),
           "lora_fsdp2": (2, "hybrid_shard_degree=2"), "qlora_fsdp2": (2, "hybrid_shard_degree=2")}
EXTRA = {"ep2": {"model_preset": "mixtral-tiny", "train_batch_size": 2},  # its experts split over the 2 ranks
         "fsdp2_accum2": {"gradient_accumulation_steps": 2},  # the root's forward twice a step
         "lora_fsdp2": {"use_peft": 1, "lora_target_modules": "all-linear", "lora_r": 4},  # adapters on a frozen base
         "qlora_fsdp2": {"use_peft": 1, "lora_target_modules": "all-linear", "lora_r": 4, "load_in_4bit": 1,
                         "model_preset": None}}  # the base: QLORA_SHAPES' (the runs fixture writes it)


def logged_holdings(tmp: Path) -> dict[int, tuple[int, int, int]]:
    found = {}
    for log in sorted((tmp / "rank-logs").glob("rank*.log")):
        match = HOLDS.search(log.read_text())
        assert match, f"{log.name} has no holdings line"
        found[int(match[1])] = tuple(int(n.replace(",", "")) for n in match.groups()[1:])
    return found


def counted_collectives(tmp: Path, world: int) -> dict[int, list[dict]]:
    return {rank: json.loads((tmp / "rank-logs" / f"collectives-rank{rank}.json").read_text()) for rank in range(world)}


def traced_ranks(tmp: Path, world: int, mp_parameters: str, hyperparameters: dict) -> dict[int, dict]:
    argv = [f"--{k}={v}" for k, v in {**TINY, **hyperparameters}.items() if v is not None] + [
        f"--mp_parameters={mp_parameters}", f"--output_data_dir={tmp}/out", f"--model_dir={tmp}/model",
        f"--checkpoint_dir={tmp}/checkpoints"]
    hp, _, pairs = parse_args(argv)
    params = distribution_parameters(pairs["mp_parameters"], **script_arguments(hp))
    requests = [TraceRequest(rank=rank, world_size=world, processes_per_host=world,
                             hyperparameters=hp.model_dump(mode="json", exclude_unset=True),
                             mp_parameters=params.model_dump(mode="json", exclude_unset=True),
                             model=spec_to_dict(_spec(hp))).to_json() for rank in range(world)]
    return trace_world(requests, tmp)


def _spec(hp):
    if hp.model_preset:
        return PRESETS[hp.model_preset]
    config = json.loads((Path(hp.hf_pretrained_model_name_or_dir) / "config.json").read_text())
    return spec_from_hf_config(config, "tiny")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Each layout's real run (its directory) and its trace's results by rank."""
    out = {}
    for name, (world, layout) in LAYOUTS.items():
        tmp = tmp_path_factory.mktemp(name)
        extra = {"max_steps": 2, "bf16": 1, **EXTRA.get(name, {})}
        if extra.get("load_in_4bit"):
            save_llama(tmp / "base", llama_config(**QLORA_SHAPES))
            extra["hf_pretrained_model_name_or_dir"] = str(tmp / "base")
        run_train(tmp, world, rank=counted_rank, mp_parameters=layout, **extra)
        out[name] = (tmp, traced_ranks(tmp, world, layout, extra))
    return out


@pytest.fixture(scope="module")
def holdings(runs) -> dict[str, tuple[dict, dict]]:
    """Each layout's (real run's, trace's) holdings by rank."""
    return {name: (logged_holdings(tmp), {rank: (r["parameter_bytes"], r["gradient_bytes"], r["optimizer_bytes"])
                                          for rank, r in traced.items()})
            for name, (tmp, traced) in runs.items()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_trace_holds_what_a_real_run_holds_on_each_rank(holdings, layout):
    real, traced = holdings[layout]
    assert set(real) == set(range(LAYOUTS[layout][0]))
    assert traced == real


def test_the_layouts_hold_different_figures(holdings):
    """The control: a layout that changes what a rank holds changes both the run's and the trace's."""
    rank0 = {layout: holdings[layout][0][0] for layout in ("fsdp2", "tp2", "replicated")}
    assert len(set(rank0.values())) == len(rank0), rank0
    assert holdings["cp2"][0][0] == rank0["fsdp2"]  # cp ranks shard the parameters as dp_shard ranks do
    assert holdings["hsdp4"][0][0] == rank0["fsdp2"]  # 2 replicas of a 2-way shard: each rank holds half
    assert holdings["fsdp2_accum2"][0] == holdings["fsdp2"][0]  # accumulation holds what one pass holds
    lora, full = holdings["lora_fsdp2"][0][0], rank0["fsdp2"]
    assert holdings["qlora_fsdp2"][0][0][0] == 701_000  # the NF4 base's shards: the planner's figure (test_plan_memory)
    assert lora[0] > full[0] and lora[1] < full[1] / 10  # the base and its adapters; the adapters' gradients
    # pipeline stages hold their own layers whole: the embedding's stage and the head's differ
    assert holdings["pp2"][0][0] != holdings["pp2"][0][1]
    fsdp, replicated = rank0["fsdp2"][0], rank0["replicated"][0]
    assert replicated == 2 * fsdp  # the whole model (no padding: every dim 0 of the tiny model is even)



@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_trace_issues_the_collectives_a_real_step_issues(runs, layout):
    tmp, traced = runs[layout]
    world = LAYOUTS[layout][0]
    real = counted_collectives(tmp, world)
    for rank in range(world):
        assert traced[rank]["collectives"] == real[rank], f"rank {rank}"
    assert any(c["count"] for c in real[0])  # the counter saw the step's collectives at all
    # the control of expert parallelism: its tokens' all-to-alls (over "dp_shard": at world 2 the ep
    # group is that dimension's), which no dense layout has; of pipelining: its stages' sends
    assert any("to_all" in c["kind"] for c in real[0]) == (layout == "ep2")
    assert any(c["kind"] == "send" for c in real[0]) == (layout == "pp2")


def test_accumulation_gathers_the_blocks_again_for_each_pass(runs):
    """The control of the trace over two passes a step: FSDP's all-gathers and reduce-scatters
    twice over (the root's forward twice, which torch's tracker alone refuses)."""
    once, twice = ({c["kind"]: c["count"] for c in runs[name][1][0]["collectives"]}
                   for name in ("fsdp2", "fsdp2_accum2"))
    assert twice["_allgather_base"] > once["_allgather_base"]
