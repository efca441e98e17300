"""The prepared one-GPU run (issue 40, section 2): train.py against a plain Hugging Face loop and
torchtitan, float8 against bf16, the planner against the measured runs, and the GPU tests.

    python3 bench/gpu/run.py [--only 1b,fp8,lora,3b,tests] [--out FILE] [--deadline-s 330]
    python3 bench/gpu/run.py --dry-run        # every part on the CPU, tiny shapes: the plumbing

Parts run in bench/gpu/table.py's order (PARTS, by value); each has its own time limit and the
whole run a deadline, so a part that would not end in time is recorded as not run and `--only`
reruns it. The JSON is written after every run, so a killed command still returns its figures;
a table of every run is printed last. Without CUDA (and without --dry-run) it exits 2 at once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository's packages, bench.gpu among them
    sys.path.insert(0, str(ROOT))

from bench.gpu import table as runs_table  # noqa: E402
from bench.gpu.measure import Outcome, compare, figures  # noqa: E402

NO_CUDA = ("bench/gpu/run.py needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False). "
           "Run it on the GPU machine, or add --dry-run to run every part on the CPU with tiny shapes.")
DEFAULT_DEADLINE_S = 330  # 5.5 minutes: a rerun still fits in a 15-minute lease with the machine's start
MIN_PART_S = 20  # a part with less left than this is not started


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/gpu/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"parts to run, comma-separated ({', '.join(runs_table.PARTS)}); default all")
    parser.add_argument("--stacks", help=f"only these stacks' runs ({', '.join(runs_table.STACKS)}); default all")
    parser.add_argument("--runs", help="only these runs, by name (e.g. 1b-hf-compiled); default all of the parts")
    parser.add_argument("--commit", help="the commit the tree is at, for the JSON (default: git rev-parse HEAD)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, every part end to end")
    parser.add_argument("--out", type=Path, help="the JSON (default $OUT/gpu_bench.json, else ./gpu_bench.json)")
    parser.add_argument("--deadline-s", type=float,
                        help=f"no run starts after this many seconds, a running one is stopped at it (default "
                             f"{DEFAULT_DEADLINE_S}; the dry run has none, nor part limits: a CPU is slower)")
    return parser.parse_args(argv)


def environment(dry_run: bool, commit_given: str | None = None) -> dict:
    import torch

    def version(name: str) -> str | None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as of

        try:
            return of(name)
        except PackageNotFoundError:
            return None

    cuda = torch.cuda.is_available()
    try:  # the device gets a copy of the working tree, perhaps without .git or git: then --commit says it
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        commit = ""
    return {"dry_run": dry_run, "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})",
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "commit": commit_given or commit or None, "command": " ".join(sys.argv),
            "packages": {n: version(n) for n in ("transformers", "torchao", "torchtitan", "pydantic", "triton")}}


def device_peak(env: dict) -> float | None:
    """bf16 dense peak of the device (launcher/wire/training/flops.py), the one MFU denominator for every
    run, FP8 runs too, so that their MFU reads as the same work per second."""
    from launcher.wire.training.flops import peak_tflops

    return None if env["dry_run"] else peak_tflops(None, "bf16", env["device"])


RUNNERS = {}  # stack -> runner(run, timeout_s, scratch) -> Outcome; filled lazily (they import torch stacks)


def runner(stack: str):
    if not RUNNERS:
        from bench.gpu.peers import run_hf
        from bench.gpu.titan import run_torchtitan
        from bench.gpu.trainpy import run_trainpy

        RUNNERS.update(trainpy=run_trainpy, hf=run_hf, torchtitan=run_torchtitan)
    return RUNNERS[stack]


class Report:
    """The JSON, rewritten whole after every run (a killed command still returns what ran)."""

    def __init__(self, path: Path, env: dict):
        self.path = path
        self.data = {"environment": env, "runs": {}, "planner": {}, "tests": None, "parts": {}}

    def save(self) -> None:
        compare(self.data["runs"])
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def traced(run) -> bool:
    """Whether the part traces this run's step (the planner's third column): train.py's eager runs
    (a compiled run's step is traced as the eager one, and FP8 is not traced)."""
    return run.stack == "trainpy" and not run.hyperparameters.get("compile") and not run.hyperparameters.get("fp8")


def run_part(part: str, runs: list, report: Report, part_deadline: float, scratch: Path, peak) -> None:
    from bench.gpu.planner import trace

    # the traces need no GPU: one at a time on the CPU, beside the part's GPU runs
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        traces = {run.name: pool.submit(trace, run) for run in runs if traced(run)}
        measure_runs(part, runs, report, part_deadline, scratch, peak)
        collect_traces(traces, report, part_deadline)
    finally:
        # the next part does not wait for a trace past this one's limit: one still running goes on
        # beside it (the interpreter waits for it at exit), those not started are dropped
        pool.shutdown(wait=False, cancel_futures=True)


def collect_traces(traces: dict, report: Report, part_deadline: float) -> None:
    from bench.gpu.planner import beside

    for name, future in traces.items():
        try:
            result = future.result(timeout=_timeout(max(1.0, part_deadline - time.monotonic())))
        except FutureTimeout:
            result = {"error": "the trace did not end by the part's time limit"}
        except Exception as exc:  # noqa: BLE001 - the trace's own bug is this record's, not the part's
            result = {"error": f"{type(exc).__name__}: {exc}"}
        report.data["planner"][name] = beside(report.data["planner"].get(name, {}), result)
        print(f"trace of {name}: {result}", flush=True)
    report.save()


def measure_runs(part: str, runs: list, report: Report, part_deadline: float, scratch: Path, peak) -> None:
    from bench.gpu.planner import against, predict

    for run in runs:
        left = part_deadline - time.monotonic()
        if left < MIN_PART_S / 2:
            outcome = Outcome.skipped(f"not run: the part's time limit was reached (rerun with --only {part})")
        else:
            print(f"[{part}] {run.name} ...", flush=True)
            try:
                outcome = runner(run.stack)(run, _timeout(left), scratch)
            except Exception as exc:  # noqa: BLE001 - a runner's own bug is this run's failure, not the part's
                outcome = Outcome.failed(f"{type(exc).__name__}: {exc}")
        record = figures(run, outcome, peak)
        report.data["runs"][run.name] = record
        print(f"[{part}] {run.name}: {line(record)}", flush=True)
        if run.stack == "trainpy":
            try:
                report.data["planner"][run.name] = against(predict(run), record)
            except Exception as exc:  # noqa: BLE001
                report.data["planner"][run.name] = {"error": f"{type(exc).__name__}: {exc}"}
        report.save()


def line(record: dict) -> str:
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('reason')}"
    mfu = f", MFU {record['mfu']:.1%}" if record.get("mfu") else ""
    peak = f", peak {record['peak_memory_gib']:.1f} GiB" if record.get("peak_memory_gib") else ""
    return f"{record['tokens_per_s']:,.0f} tokens/s, step {record['step_s_median'] * 1e3:.1f} ms{mfu}{peak}"


def summary(report: Report) -> str:
    rows = [f"{'run':30} {'status':8} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9} {'vs base':>8} "
            f"{'plan mem':>8} {'plan step':>9} {'trace mem':>9}"]
    for name, r in report.data["runs"].items():
        plan = report.data["planner"].get(name, {})
        vs = r.get("vs_baseline", {}).get("speedup")
        rows.append(f"{name:30} {r['status']:8} {r.get('tokens_per_s') or 0:10,.0f} "
                    f"{(r.get('mfu') or 0):6.1%} {(r.get('peak_memory_gib') or 0):9.2f} "
                    f"{f'{vs:.3f}x' if vs else '-':>8} {_ratio(plan.get('memory_ratio')):>8} "
                    f"{_ratio(plan.get('step_ratio')):>9} {_ratio(plan.get('trace', {}).get('memory_ratio')):>9}")
    tests = report.data["tests"]
    if tests:
        found = f"{len(tests['collected'])} collected (dry run)" if tests.get("collected") else tests.get("counts")
        rows.append(f"gpu tests: {tests['status']}, {found}")
    rows.append("(vs base: tokens/s over the baseline's; plan: measured / predicted; trace: measured / traced)")
    return "\n".join(rows)


def _timeout(seconds: float) -> float | None:
    """subprocess's timeout: None where there is no limit (the dry run)."""
    return None if math.isinf(seconds) else seconds


def _ratio(x) -> str:
    return f"{x:.2f}" if x else "-"


def select(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, list]]:
    """The parts to run and each part's runs, as --only, --stacks and --runs say (ValueError naming
    an unknown one)."""
    parts = runs_table.parse_list(args.only, runs_table.PARTS, "--only")
    plan = runs_table.table(args.dry_run, runs_table.parse_list(args.stacks, runs_table.STACKS, "--stacks"))
    if "fp8" in parts and "1b" not in parts and not args.runs:  # the FP8 runs' bf16 baseline comes along
        plan["fp8"] = [r for r in plan["1b"] if r.name == runs_table.FP8_BASELINE] + plan["fp8"]
    if args.runs:
        names = runs_table.parse_list(args.runs, runs_table.names(), "--runs")
        plan = {part: [r for r in runs if r.name in names] for part, runs in plan.items()}
        parts = parts if args.only else tuple(p for p in parts if plan[p])  # the named runs' parts alone
    return parts, plan


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        parts, plan = select(args)
    except ValueError as exc:
        print(f"bench/gpu/run.py: {exc}", file=sys.stderr)
        return 2
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(f"bench/gpu/run.py: {NO_CUDA}", file=sys.stderr)
        return 2
    from bench.gpu.trainpy import python_path

    os.environ["PYTHONPATH"] = python_path()  # for every child: the trace's `python -m container trace` too
    start = time.monotonic()
    deadline = start + (args.deadline_s or (float("inf") if args.dry_run else DEFAULT_DEADLINE_S))
    out = args.out or Path(os.environ.get("OUT") or ".") / "gpu_bench.json"
    env = environment(args.dry_run, args.commit)
    report = Report(out, env)
    peak = device_peak(env)
    print(f"device: {env['device']}; torch {env['torch']}; parts {', '.join(parts)}; JSON {out}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-bench-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) \
            as scratch:
        for part in parts:
            began = time.monotonic()
            limit = float("inf") if args.dry_run else runs_table.PART_LIMITS_S[part]
            part_deadline = min(deadline, began + limit)
            # a part with less than half its time left would be cut short: the rerun does it whole
            if part_deadline - began < max(MIN_PART_S, limit / 2 if limit < float("inf") else 0):
                report.data["parts"][part] = {"status": "not run", "reason": f"deadline (rerun with --only {part})"}
                report.save()
                continue
            if part == "tests":
                from bench.gpu.gputests import run_tests

                report.data["tests"] = run_tests(_timeout(part_deadline - began), Path(scratch), args.dry_run)
            else:
                run_part(part, plan[part], report, part_deadline, Path(scratch), peak)
            report.data["parts"][part] = {"status": "ran", "seconds": round(time.monotonic() - began, 1)}
            report.save()
    print(summary(report), flush=True)
    left = [p for p, s in report.data["parts"].items() if s["status"] != "ran"]
    if left:
        print(f"not run for time: {', '.join(left)}; rerun: python3 bench/gpu/run.py --only {','.join(left)}")
    print(f"total {time.monotonic() - start:.0f} s; JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
