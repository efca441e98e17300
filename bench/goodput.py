"""Goodput of a run that meets faults (issue 39): a 300-step local 2-host job (2 simulated hosts
x 1 process, llama3-tiny on synthetic data, checkpoint_freq 20, max_restarts 3) with 3 injected
faults, one per attempt, against the same job without faults.

The faults hit rank 1 (host algo-2) 10 steps after a checkpoint, so each replays 10 steps, half
an interval, as the planner's model expects on average: a lost host at step 71 (attempt 0), a
killed rank at step 151 (attempt 1), a hung rank at step 231 (attempt 2, step_timeout 5 s). The
lost host comes first: the supervisor numbers its restart after the attempts the hosts'
bootstraps recorded, and on a host lost after an in-process restart it took the attempt before.

Measured: each run's goodput as `smlaunch status` reports it (launcher.wire.goodput.measure over
the hosts' records: productive time over the job's wall time, and where the rest went), its wall
time, and what a failure cost: the faulty run's extra wall time per fault, and each restart's
down time and replayed steps (status's Restarts).

Planned, where the plan applies: the planner's model (launcher/plan/goodput.py:
lost = C/(interval + C) + (interval/2 + R)/MTBF), fed with the fault-free run's step time and checkpoint
stall C. At the published failure rate (Llama 3's, per GPU-hour) the 2 ranks fail once in ~3
years: the planned goodput is the checkpoints' cost alone, compared with the fault-free run's
productive share of its training time (its wall time after start-up; its "other", logging and the
end's export, is in no model). The injected rate is not one the model holds for: a fault every 80
steps is a few seconds of training, less than one restart (the model needs interval << MTBF and
R << MTBF), so no goodput is planned for it; what is compared there is a failure's cost,
interval/2 + R, with R the plan's (its assumed start-up; load and verification are ~0 for this
model) against the measured one. `smlaunch plan` itself plans no local CPU job (no throughput
model), so the model's functions are called here.
Run: `.venv/bin/python bench/goodput.py [--repeats 1]`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fault_runs import Run, hyperparameters, machine, submit

from launcher.plan.goodput import DEFAULT_FAILURE_RATE, STARTUP_S, lost_fraction, mtbf_hours, young_interval
from launcher.wire import goodput
from launcher.wire.faults import Fault

MAX_STEPS, CHECKPOINT_FREQ, STEP_TIMEOUT_S = 300, 20, 5
FAULTS = [Fault("host", rank=1, step=71, attempt=0), Fault("signal", rank=1, step=151, attempt=1),
          Fault("hang", rank=1, step=231, attempt=2)]
SHOWN = ("start-up", "restarts", "replayed", "checkpoints", "input waits", "other")


def run_job(base: Path, name: str, faults: list[Fault]) -> dict:
    hp = hyperparameters(max_steps=MAX_STEPS, checkpoint_freq=CHECKPOINT_FREQ, step_timeout=STEP_TIMEOUT_S)
    started = time.monotonic()
    run = submit(base / name, name, hp, faults, max_restarts=len(FAULTS))
    elapsed = time.monotonic() - started
    status = run.status()
    restarts = status.get("Restarts", [])
    if len(restarts) != len(faults) or not all(r["restarted"] for r in restarts):
        raise SystemExit(f"{name}: expected {len(faults)} restarts, status says {restarts}")
    return {"name": name, "submit_s": elapsed, "goodput": status["Goodput"], "losses": _losses(run),
            "restarts": [{"reason": r["reason"], "down_s": r["extra"].get("down_s"),
                          "replayed_steps": r["extra"].get("replayed_steps")} for r in restarts]}


def _losses(run: Run) -> dict[int, float]:
    """Each step's loss, the last record of it (a replayed step logs again)."""
    out = {}
    for directory in run.job_dir.glob("hosts/*/output/data"):
        for record in goodput.read_records(directory):
            if isinstance(record.get("loss"), float):
                out[int(record["step"])] = record["loss"]
    return out


def compare(free: dict, faulty: dict) -> dict:
    """The plan's figures against the measured ones (see the module's docstring)."""
    g0, g1 = free["goodput"], faulty["goodput"]
    step_s = g0["productive_s"] / MAX_STEPS
    checkpoint_s = g0["lost_s"]["checkpoints"] / (MAX_STEPS // CHECKPOINT_FREQ)
    interval_s = CHECKPOINT_FREQ * step_s
    published_mtbf_s = mtbf_hours(DEFAULT_FAILURE_RATE, 2) * 3600
    return {
        "step_s": step_s, "checkpoint_s": checkpoint_s, "interval_s": interval_s,
        "published_mtbf_h": published_mtbf_s / 3600,
        "planned_goodput": 1 - lost_fraction(interval_s, checkpoint_s, STARTUP_S, published_mtbf_s),
        "free_goodput_after_startup": g0["productive_s"] / (g0["wall_s"] - g0["lost_s"]["start-up"]),
        "young_steps_published": young_interval(checkpoint_s, published_mtbf_s) / step_s,
        "planned_failure_s": interval_s / 2 + STARTUP_S,
        "measured_failure_s": (g1["wall_s"] - g0["wall_s"]) / len(FAULTS),
        "measured_down_s": [r["down_s"] for r in faulty["restarts"]],
        "injected_mtbf_s": (g1["wall_s"] - g1["lost_s"]["start-up"]) / len(FAULTS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    print(f"{machine()}; 2 hosts x 1 process, llama3-tiny, {MAX_STEPS} steps, checkpoint_freq {CHECKPOINT_FREQ}, "
          f"faults: " + ", ".join(f"{f.kind} at step {f.step}" for f in FAULTS))
    pairs = []
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        for repeat in range(args.repeats):  # the two runs take turns
            pairs.append((run_job(Path(tmp), f"free-{repeat}", []), run_job(Path(tmp), f"faulty-{repeat}", FAULTS)))
    print("| run | wall time | goodput | " + " | ".join(SHOWN) + " |")
    print("|---|---|---|" + "---|" * len(SHOWN))
    for free, faulty in pairs:
        report(free, faulty)


def report(free: dict, faulty: dict) -> None:
    g0, g1 = free["goodput"], faulty["goodput"]
    for name, g in ((free["name"], g0), (faulty["name"], g1)):
        shares = " | ".join(f"{g['lost_s'][k]:.1f} s ({g['lost_s'][k] / g['wall_s']:.1%})" for k in SHOWN)
        print(f"| {name} | {g['wall_s']:.1f} s | {g['goodput']:.1%} | {shares} |")
    print(f"{faulty['name']} / {free['name']}: wall time x{g1['wall_s'] / g0['wall_s']:.2f}, "
          f"goodput x{g1['goodput'] / g0['goodput']:.2f}; restarts: "
          + "; ".join(f"{r['reason'][:60]}: down {r['down_s']} s, {r['replayed_steps']} steps replayed"
                      for r in faulty["restarts"]))
    same = sorted(set(free["losses"]) & set(faulty["losses"]))
    worst = max(abs(free["losses"][s] - faulty["losses"][s]) for s in same)
    print(f"losses of {len(same)} steps, faulty run against fault-free: largest difference {worst:.3g}")
    c = compare(free, faulty)
    print(f"planned at the published rate (MTBF {c['published_mtbf_h']:,.0f} h for 2 ranks), with the fault-free "
          f"run's step {c['step_s']:.3f} s and save stall C {c['checkpoint_s']:.3f} s: goodput "
          f"{c['planned_goodput']:.1%} at checkpoint_freq {CHECKPOINT_FREQ} (Young's interval "
          f"{c['young_steps_published']:,.0f} steps); measured, the fault-free run's productive share after "
          f"start-up: {c['free_goodput_after_startup']:.1%}")
    print(f"a failure's cost: planned interval/2 + R = {c['interval_s'] / 2:.2f} s + {STARTUP_S:.0f} s (assumed "
          f"start-up) = {c['planned_failure_s']:.1f} s; measured {c['measured_failure_s']:.1f} s of extra wall time "
          f"per fault (down " + ", ".join(f"{d} s" for d in c["measured_down_s"]) + "); injected: a fault every "
          f"{c['injected_mtbf_s']:.0f} s of wall time after start-up, under one restart: no goodput is planned "
          f"for that rate")
    print(json.dumps({"free": {k: v for k, v in free.items() if k != "losses"},
                      "faulty": {k: v for k, v in faulty.items() if k != "losses"}, "model": c}))


if __name__ == "__main__":
    main()
