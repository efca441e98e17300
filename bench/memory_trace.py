"""The planner's memory model against the runtime's own tensors, traced on CPU (no GPU).

Each job is traced by `smlaunch plan --trace`'s code (launcher.plan.trace, container/trace/): the
runtime builds rank 0 of the job's whole world on torch's fake process group and runs one training
step (`container.loop.train_step`) on fake tensors; torch's FSDPMemTracker keeps the peak of live
tensors by kind. Compared with the planner's largest step phase (its "init" phase, model
construction, is not a training step and is not traced). A job of 8 H100s with llama3.1-8b at 16K
traces in ~18 s on a 2-core VM; the seed's p5 job at 16 hosts (128 ranks) in ~60 s.

What the trace does not show, by construction:

- CUDA streams: FSDP2 all-gathers the next block on its own stream on a GPU; on CPU there is
  one stream, so the prefetched block is not live beside the running one (the planner counts
  it: one block's bf16 parameters, ~2% of a 1B step);
- the caching allocator's rounding and fragmentation, the CUDA context and NCCL buffers (the
  planner's ALLOCATOR_RESERVE, CUDA_CONTEXT_GIB, NCCL_GIB: only a GPU measures those,
  bench/plan_calibration.py);
- attention kernels: CPU's flash kernel keeps what CUDA's does (output and log-sum-exp), not
  the math kernel's S x S scores.

FP8 and activation offload are reported as not traced, with the reason
(container.trace.step.not_traced); MoE layers route evenly (container.trace.routing), pipeline
stages get their shapes up front (container.trace.pipeline).

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
import sys
from dataclasses import dataclass
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


def run_cases(cases: list[Case]) -> list[dict]:
    """Each case's rank 0 traced by the product's code (launcher.plan.trace: `smlaunch plan --trace`;
    the cases' ranks in one trace process, each rank forked from it), beside the planner's largest
    step phase."""
    from launcher.plan.trace import trace_jobs

    rows = [{"label": case.label} for case in cases]
    jobs = [load(case) for case in cases]
    unknown = "the world size or the model is unknown (set processes_per_host and a model)"
    known = [i for i, job in enumerate(jobs) if job.layout is not None and job.model is not None]
    for i in set(range(len(cases))) - set(known):
        rows[i]["not_traced"] = unknown
    for i, trace in zip(known, trace_jobs([jobs[i] for i in known])):
        _compare(rows[i], jobs[i], trace)
    return rows


def _compare(row: dict, job, trace) -> None:
    """The row of a traced job: the trace's peak against the planner's, or why there is none."""
    from launcher.plan import estimate_memory
    from launcher.plan.trace import TraceError, as_traced

    if isinstance(trace, TraceError):
        row["failed"] = str(trace)
        return
    if trace.not_traced:
        row["not_traced"] = trace.not_traced
        return
    job, traced_as = as_traced(job)
    if traced_as:
        row["planned_as"] = traced_as
    est = estimate_memory(job, advise=False)
    step_phases = {p: v for p, v in est.phases.items() if p != "init"}
    phase = max(step_phases, key=step_phases.get)
    lay, s, rank0 = job.layout, job.settings, trace.ranks[0]
    row.update(model=job.model.name, world=lay.world, seq=s.seq_len, micro_batch=s.micro_batch,
               degrees={k: v for k, v in zip(lay.mesh_dim_names, lay.mesh_shape) if v > 1},
               ac=s.ac_mode or "off", loss_chunk_tokens=s.loss_chunk_tokens,
               predicted_gib=round(step_phases[phase], 3), predicted_phase=phase,
               traced={kind: round(size / GIB, 3) for kind, size in rank0["peak_kinds"].items()},
               trace_s=rank0["seconds"])
    row["error"] = round(trace.planned["peak_bytes"] / rank0["peak_bytes"] - 1, 4)


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
    args = parser.parse_args()
    cases = ([Case(str(p), file=p, overrides=tuple(args.overrides)) for p in args.jobs] if args.jobs
             else [c.with_set(*args.overrides) for c in default_cases()])
    import torch

    rows = run_cases(cases)
    for r in rows:
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
