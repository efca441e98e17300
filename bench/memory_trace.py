"""The planner's memory model against the runtime's own tensors, traced on CPU (no GPU).

`launcher.plan` predicts a training step's peak of live tensors per accelerator from the model's
shapes (docs/planner.md). Here the runtime itself runs the job's training step: the model
build and parallelisation of delayed init (meta device, then FP8/TP/AC/FSDP2 as
container.trainer.parallelize does), context-parallel sharding, the chunked loss, clipping and
AdamW through `container.loop.train_step`. It runs on fake tensors (torch's FakeTensorMode:
shapes, dtypes and lifetimes, no memory and no arithmetic) and a fake process group of the
job's world size (torch's "fake" backend: rank 0 of that world in one process, collectives
return shaped outputs). torch's FSDPMemTracker counts the live tensors' bytes by kind and
keeps the snapshot at their peak. A job of 8 H100s with llama3.1-8b at 16K traces in ~18 s on a
2-core VM.

Compared with the planner's largest step phase (its "init" phase, model construction, is
not a training step and is not traced). What the trace does not show, by construction:

- CUDA streams: FSDP2 all-gathers the next block on its own stream on a GPU; on CPU there is
  one stream, so the prefetched block is not live beside the running one (the planner counts
  it: one block's bf16 parameters, ~2% of a 1B step);
- the caching allocator's rounding and fragmentation, the CUDA context and NCCL buffers (the
  planner's ALLOCATOR_RESERVE, CUDA_CONTEXT_GIB, NCCL_GIB: only a GPU measures those,
  bench/plan_calibration.py);
- attention kernels: CPU's flash kernel keeps what CUDA's does (output and log-sum-exp), not
  the math kernel's S x S scores.

FP8 (Transformer Engine and torchao need CUDA kernels), activation offload (CUDA streams),
pipeline parallelism (a schedule of point-to-point transfers) and MoE (the dispatch depends on
the router's data) are not traced: such a job is reported as not traced, with the reason.

AdamW's `foreach` is set on: it is torch's default on CUDA (one kernel per op over every
tensor, so sqrt(exp_avg_sq) exists for all parameters at once), while CPU's default is the
per-tensor loop. The first step runs untracked: DTensor's first sharding propagation of each
op runs it on fake tensors that the tracker would count as memory (it caches the result; on a
GPU that propagation allocates nothing).

Run: `.venv/bin/python bench/memory_trace.py [JOB.yaml ...] [--set KEY=VALUE ...] [--json FILE]`.
Without job files it traces the grid of issue 16's calibration (llama3.2-1b at 4K/8K/16K with
and without activation checkpointing and context parallelism, tensor parallel and hybrid-shard
jobs) and the seed's jobs (configs/seed), and prints a table and Markdown for BENCHMARKS.md.
Exit 1 when a traced job's error exceeds --tolerance (10%).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
P5 = "ml.p5.48xlarge"  # 8 H100s: any world of up to 8 ranks on one host


@dataclass(frozen=True)
class Case:
    label: str
    job: dict | None = None  # a job's fields, validated as `smlaunch validate` would
    file: Path | None = None  # or a job file
    overrides: tuple[str, ...] = ()

    def with_set(self, *overrides: str) -> Case:
        return Case(self.label, self.job, self.file, self.overrides + overrides)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "file": str(self.file) if self.file else None})

    @staticmethod
    def from_json(text: str) -> Case:
        d = json.loads(text)
        return Case(d["label"], d["job"], Path(d["file"]) if d["file"] else None, tuple(d["overrides"]))


def one_b(label: str, seq: int, ac: bool = False, ranks: int = 1, bf16: bool = True, **degrees) -> Case:
    hyperparameters = {"model_preset": "llama3.2-1b", "dataset_type": "synthetic", "max_context_width": seq,
                       "train_batch_size": 1, "max_steps": 2, "bf16": int(bf16), "delayed_param": 1,
                       "activation_checkpointing": int(ac)}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": P5,
           "processes_per_host": ranks, "hyperparameters": hyperparameters}
    if degrees:
        job["distribution"] = {"torch_distributed": {"enabled": True}, "smdistributed": {
            "modelparallel": {"enabled": True, "parameters": degrees}}}
    return Case(label, job=job)


def default_cases() -> list[Case]:
    cases = [one_b(f"1B {seq // 1024}K {'AC' if ac else 'no AC'}", seq, ac)
             for seq in (4096, 8192, 16384) for ac in (False, True)]
    cases += [one_b(f"1B 16K {'AC' if ac else 'no AC'} cp 2", 16384, ac, 2, context_parallel_degree=2)
              for ac in (False, True)]
    cases += [one_b("1B 8K no AC tp 2", 8192, False, 2, tensor_parallel_degree=2),
              one_b("1B 8K AC tp 2", 8192, True, 2, tensor_parallel_degree=2),
              one_b("1B 8K no AC hsd 2", 8192, False, 2, hybrid_shard_degree=2),
              one_b("1B 4K AC fp32 (no FSDP)", 4096, True, bf16=False),
              one_b("1B 8K no AC, whole logits", 8192, False).with_set("hyperparameters.loss_chunk_tokens=0"),
              one_b("1B 8K no AC tp 2, whole logits", 8192, False, 2, tensor_parallel_degree=2).with_set(
                  "hyperparameters.loss_chunk_tokens=0")]
    seed = ROOT / "configs" / "seed"
    cases += [Case("seed p4d cp 8", file=seed / "p4d-cp8.yaml"),
              Case("seed p5 cp 8 bf16", file=seed / "p5-cp8-bf16.yaml"),
              Case("seed p4d no cp, whole logits", file=seed / "p4d-no-cp.yaml",
                   overrides=("hyperparameters.loss_chunk_tokens=0",)),
              Case("seed p5 cp 8 fp8", file=seed / "p5-cp8-fp8.yaml")]
    return cases


def load(case: Case):
    import copy

    from launcher.config import validate_job
    from launcher.config.jobfile import apply_overrides, validate_job_file

    if case.file is not None:
        return validate_job_file(case.file, case.overrides)
    data = copy.deepcopy(case.job)
    apply_overrides(data, case.overrides)
    return validate_job(data, base_dir=ROOT)


def untraceable(job, s) -> str | None:
    """Why this job's step cannot be traced on fake CPU tensors, or None."""
    if job.layout is None or job.model is None:
        return "the world size or the model is unknown (set processes_per_host and a model)"
    reasons = [(s.fp8.enabled, "FP8 needs CUDA kernels"), (s.offload, "activation offload needs CUDA streams"),
               (job.layout.pp > 1, "pipeline parallelism"), (job.model.is_moe, "MoE dispatch depends on data")]
    return next((why for flag, why in reasons if flag), None)


def trace(job) -> dict:
    """The traced step's peak of live tensors on rank 0: GiB by kind, and 'Total'."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from container import loop, trainer
    from container.data import loader as data
    from container.distributed.context_parallel import apply_context_parallel
    from container.distributed.parallelize import allocate
    from container.distributed.runtime import init_runtime
    from container.models.llama import build_model
    from launcher.config import ModelParallelParameters

    hp = job.config.hyperparameters
    world = job.layout.world
    os.environ.update(RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(job.processes_per_host))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        params = job.config.distribution.parameters if job.config.distribution else None
        rt = init_runtime(params or ModelParallelParameters(), sharding_strategy=hp.sharding_strategy)
        if rt.layout.mesh_shape != job.layout.mesh_shape:
            raise RuntimeError(f"the runtime's mesh {rt.layout.mesh_shape} "
                               f"is not the planner's {job.layout.mesh_shape}")
        s = trainer.settings(rt, hp)
        model = build_model(job.model, s.seq_len, device="meta")
        trainer.parallelize(rt, model, s)  # outside fake mode: the meshes it builds hold real tensors
        with FakeTensorMode(allow_non_fake_inputs=True):
            allocate(model, rt.device)  # delayed init's, without rank 0's weights (values do not matter here)
            optimizer, scheduler = trainer.build_optimization(model, s)
            for group in optimizer.param_groups:
                if "foreach" in group:
                    group["foreach"] = True  # CUDA's default (see the module docstring)
            cp_shard = apply_context_parallel(rt, s.cp_comm_type)
            loader = data.build_dataloader(
                dataset_type="synthetic", path=None, seq_len=s.seq_len, micro_batch_size=s.micro_batch,
                dp_rank=rt.dp_rank, dp_size=rt.dp_size, grad_accum=s.grad_accum, vocab_size=job.model.vocab_size,
                seed=s.seed)
            sequences = s.micro_batch * s.grad_accum * rt.dp_size

            def step() -> None:
                micro = [cp_shard(loader.next_batch()) for _ in range(s.grad_accum)]
                loop.train_step(rt, model, None, optimizer, scheduler, micro, s, job.model, sequences)

            step()  # untracked warm-up (see the module docstring)
            if isinstance(model, FSDPModule):
                tracker = FSDPMemTracker(model, optimizer)
            else:
                tracker = MemTracker()
                tracker.track_external(model, optimizer)
            with tracker:
                step()
            peak = tracker.get_tracker_snapshot("peak")[rt.device]
    finally:
        dist.destroy_process_group()
    return {getattr(kind, "value", str(kind)): round(size / GIB, 3) for kind, size in peak.items()}


def run_case(case: Case) -> dict:
    from launcher.plan import estimate_memory

    row = {"label": case.label}
    job = load(case)
    s = job.settings
    why = untraceable(job, s)
    if why:
        return {**row, "not_traced": why}
    if job.layout.cp > 1 and s.cp_comm_type != "all_gather":
        # Without Transformer Engine (always on CPU) the runtime's context parallelism is
        # AllGatherAttention: the planner is asked about that path, not TE's ring.
        job = load(case.with_set("hyperparameters.cp_comm_type=all_gather"))
        s = job.settings
        row["planned_as"] = "cp_comm_type all_gather (the path without Transformer Engine)"
    est = estimate_memory(job, advise=False)
    step_phases = {p: v for p, v in est.phases.items() if p != "init"}
    phase = max(step_phases, key=step_phases.get)
    lay = job.layout
    row.update(model=job.model.name, world=lay.world, seq=s.seq_len, micro_batch=s.micro_batch,
               degrees={k: v for k, v in zip(lay.mesh_dim_names, lay.mesh_shape) if v > 1},
               ac=s.ac_mode or "off", loss_chunk_tokens=s.loss_chunk_tokens,
               predicted_gib=round(step_phases[phase], 3), predicted_phase=phase)
    t0 = time.perf_counter()
    row["traced"] = trace(job)
    row["trace_s"] = round(time.perf_counter() - t0, 1)
    row["error"] = round(row["predicted_gib"] / row["traced"]["Total"] - 1, 4)
    return row


def run_isolated(case: Case) -> dict:
    """run_case in a process of its own: the fake process group, the meshes and what context
    parallelism installs in torch are process-wide, and one job's must not shape the next's."""
    proc = subprocess.run([sys.executable, __file__, "--worker", case.to_json()], capture_output=True, text=True,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"label": case.label, "failed": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def print_table(rows: list[dict]) -> None:
    print("| job | model | ranks | mesh | seq | AC | predicted GiB (phase) | traced GiB | error | "
          "traced: params / grads / optimizer / activations + temporaries |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            print(f"| {r['label']} | | | | | | | {r.get('not_traced') or r['failed']} | | |")
            continue
        t = r["traced"]
        params = t.get("Sharded Param", 0) + t.get("Unsharded Param", 0) + t.get("Buffer", 0) + t.get("Parameter", 0)
        grads = t.get("Sharded Grad", 0) + t.get("Unsharded Grad", 0) + t.get("Gradient", 0)
        optimizer = t.get("OptState", 0) + t.get("Optstate", 0)  # FSDPMemTracker's and MemTracker's names
        rest = max(0.0, t["Total"] - params - grads - optimizer)
        mesh = (" ".join(f"{k} {v}" for k, v in r["degrees"].items()) or "-") + (" †" if "planned_as" in r else "")
        print(f"| {r['label']} | {r['model']} | {r['world']} | {mesh} | {r['seq']} | {r['ac']} | "
              f"{r['predicted_gib']:.2f} ({r['predicted_phase']}) | {t['Total']:.2f} | {r['error']:+.1%} | "
              f"{params:.2f} / {grads:.2f} / {optimizer:.2f} / {rest:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("jobs", nargs="*", type=Path, help="job files (default: the calibration grid)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a job field, as `smlaunch plan --set`")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--tolerance", type=float, default=0.10, help="largest |error| accepted (0.10)")
    parser.add_argument("--worker", metavar="CASE_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.worker:
        print(json.dumps(run_case(Case.from_json(args.worker))))
        return 0
    cases = ([Case(str(p), file=p, overrides=tuple(args.overrides)) for p in args.jobs] if args.jobs
             else [c.with_set(*args.overrides) for c in default_cases()])
    import torch

    rows = []
    for case in cases:
        rows.append(run_isolated(case))
        r = rows[-1]
        print(f"{r['label']}: " + (f"not traced ({r['not_traced']})" if "not_traced" in r else
              f"FAILED ({r['failed']})" if "failed" in r else
              f"predicted {r['predicted_gib']:.2f} GiB ({r['predicted_phase']}), traced "
              f"{r['traced']['Total']:.2f} GiB, error {r['error']:+.1%} [{r['trace_s']} s]"), flush=True)
    print(f"\ntorch {torch.__version__}, fake tensors on CPU ({os.cpu_count()} cores)\n")
    print_table(rows)
    if any("planned_as" in r for r in rows):
        print("\n† planned with cp_comm_type all_gather: without Transformer Engine (always on CPU) the runtime's "
              "context parallelism all-gathers K/V")
    errors = [abs(r["error"]) for r in rows if "error" in r]
    if errors:
        print(f"\n|error|: mean {sum(errors) / len(errors):.1%}, max {max(errors):.1%} over {len(errors)} jobs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if any(e > args.tolerance for e in errors) or any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
