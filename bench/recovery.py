"""Time to recover from a fault (issue 39): a local 2-host job (2 simulated hosts x 1 process,
llama3-tiny on synthetic data, `smlaunch submit --local`) meets one fault at step 5 on rank 1
(host algo-2), after the checkpoint of step 4, and restarts once (max_restarts 1). Faults: a
killed rank (`signal`: SIGKILL), a hung rank (`hang`: found by the step watchdog after
step_timeout) and a lost host (`host`: its bootstrap, torchrun and rank SIGKILLed; the local
supervisor restarts every host).

From the fault to training again, in four parts (each from the times the job itself records):
- detection: the injection's log line ("fault injection (...)", the rank's own time) to the first
  report of the failure: a torchrun agent's "failed (exitcode: N)" line, a rank's step watchdog
  ("did not complete within"), or the supervisor's "failed: stopping the other hosts" note;
- diagnosis: from there to the last host's restart line (`[smlaunch] restart N of M`, printed
  as its restarts.jsonl record is written; the supervisor's "restarting the job on every host"
  after a lost host): stacks collected, every rank ended, the failure classified;
- restart: from there to the checkpoint load's start: the backoff, the processes' start-up
  (Python, torch imports) and rendezvous up to the process group (rank 0's "mesh" line), and the
  model's build;
- checkpoint load: the newest checkpoint verified and loaded (rank 0's "resumed from step N ...
  (verified and loaded in S s)").
The total runs from the fault to the next attempt's loop start (the goodput ledger's
`loop_start` in metrics.jsonl: the same moment as attempts.jsonl's `at`, which holds whole
seconds only): the few ms after the load are in it and in no part.
Run: `.venv/bin/python bench/recovery.py [--repeats 3] [--kinds signal hang host]`.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
from datetime import datetime
from pathlib import Path

from fault_runs import Run, hyperparameters, iso, machine, submit

from launcher.wire import faults, goodput

KINDS = ("signal", "hang", "host")
FAULT_STEP = 5  # after the checkpoint of step 4: step 4 is where every kind resumes
STEP_TIMEOUT_S = 5
PHASES = ("detection", "diagnosis", "restart", "load", "total")
LOADED = re.compile(r"resumed from step \d+ in \S+ \(verified and loaded in (\d+\.\d+) s\)")
RESTARTED_ALL = "restarting the job on every host"  # the supervisor's line after a lost host
BACKOFF = re.compile(r"\[smlaunch\] restart \d+ of \d+ \(max_restarts\) in (\d+) s:")


def timeline(run: Run) -> dict[str, float]:
    """The phases of the run's one restart, in seconds."""
    injected = run.rank_lines("fault injection (")
    if not injected:
        raise SystemExit(f"{run.name}: no rank logged its fault injection (neither in the job's log nor in the "
                         f"ranks' log files read while it ran: {len(run.rank_files)} file(s))")
    fault = injected[0].logged
    reports = ([t for t in run.agent_failures() if t >= fault]
               + [line.logged for line in run.rank_lines("did not complete within")]
               + [line.seen for line in run.printed("failed: stopping the other hosts")])
    seen = min(reports)
    # restarts.jsonl's and attempts.jsonl's `at` hold whole seconds: the restart lines' arrival and
    # the ledger's loop_start (milliseconds) time the same moments
    restarts = [line.seen for line in run.printed("[smlaunch] restart ") + run.printed(RESTARTED_ALL)]
    decided = max(restarts)
    loop = min(iso(r[goodput.LOOP_START]) for d in run.job_dir.glob("hosts/*/output/data")
               for r in goodput.read_records(d) if r.get(goodput.ATTEMPT) == 1)
    resumed = run.rank_lines("verified and loaded in")[-1]
    load_s = float(LOADED.search(resumed.text).group(1))
    load_start = resumed.logged.timestamp() - load_s
    group = [line.logged for line in run.rank_lines("INFO mesh {") if line.logged > decided]
    backoff = float(max((int(m.group(1)) for line in run.printed("[smlaunch] restart ")
                         if (m := BACKOFF.search(line.text))), default=0))
    return {"detection": _s(fault, seen), "diagnosis": _s(seen, decided),
            "restart": load_start - decided.timestamp(), "load": load_s, "total": _s(fault, loop),
            "backoff": backoff, "start-up": _s(decided, group[0]) - backoff,
            "model": load_start - group[0].timestamp(),
            "first_restart": _s(seen, min(restarts))}


def _s(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()


def measure(kind: str, base: Path, repeat: int) -> dict[str, float]:
    hp = hyperparameters(max_steps=FAULT_STEP + 3, checkpoint_freq=2, step_timeout=STEP_TIMEOUT_S)
    run = submit(base / f"{kind}-{repeat}", f"recover-{kind}-{repeat}", hp,
                 [faults.Fault(kind, rank=1, step=FAULT_STEP, attempt=0)], max_restarts=1)
    restarts = run.status().get("Restarts", [])
    if len(restarts) != 1 or not restarts[0]["restarted"]:
        raise SystemExit(f"{kind}: expected one restart, status says {restarts}")
    return timeline(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args()
    print(f"{machine()}; 2 hosts x 1 process, llama3-tiny, fault at step {FAULT_STEP} on rank 1, checkpoint at "
          f"step 4, step_timeout {STEP_TIMEOUT_S} s; medians of {args.repeats} run(s) per fault")
    results: dict[str, list[dict]] = {kind: [] for kind in args.kinds}
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for repeat in range(args.repeats):  # kinds take turns, so machine noise hits each
            for kind in args.kinds:
                results[kind].append(measure(kind, Path(tmp), repeat))
                print(f"  {kind} #{repeat}: " + ", ".join(f"{k} {v:.2f}" for k, v in results[kind][-1].items()),
                      flush=True)
    print("| fault | detection | diagnosis | restart | of which: backoff / start-up and rendezvous / model "
          "| checkpoint load | fault -> training again |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for kind, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        summary[kind] = {**med, "runs": runs}
        print(f"| {kind} | {med['detection']:.2f} s | {med['diagnosis']:.2f} s | {med['restart']:.2f} s "
              f"| {med['backoff']:.0f} s / {med['start-up']:.2f} s / {med['model']:.2f} s | {med['load']:.2f} s "
              f"| {med['total']:.2f} s |")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
