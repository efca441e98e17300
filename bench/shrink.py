"""Time from a lost host to training again (issue 54): the restart record's `down_s` (its failure's time
to the next attempt's loop start, launcher.local.restarts) of a local 2-host job (2 simulated hosts x 1
process, llama3-tiny on synthetic data) that loses algo-2 at step 5, after the checkpoint of step 4:
`host` (it comes back: both hosts restart) against `host-gone` (min_instance_count 1: the job goes on
with algo-1 alone, accumulating the lost rank's share). bench/recovery.py splits a restart into its parts.

Run: `.venv/bin/python bench/shrink.py [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from fault_runs import hyperparameters, machine, submit

from launcher.wire import faults

KINDS = ("host", faults.HOST_GONE)
FAULT_STEP = 5


def down_s(kind: str, base: Path, repeat: int) -> float:
    hp = hyperparameters(max_steps=FAULT_STEP + 3, checkpoint_freq=2, step_timeout=5)
    run = submit(base / f"{kind}-{repeat}", f"shrink-{kind}-{repeat}", hp,
                 [faults.Fault(kind, rank=1, step=FAULT_STEP, attempt=0)], max_restarts=1,
                 **({"min_instance_count": 1} if kind == faults.HOST_GONE else {}))
    status = run.status()
    restarts = status.get("Restarts", [])
    if len(restarts) != 1 or "down_s" not in restarts[0].get("extra", {}):
        raise SystemExit(f"{kind}: expected one restart with its cost, status says {restarts}")
    if (kind == faults.HOST_GONE) != bool(status.get("Shrinks")):
        raise SystemExit(f"{kind}: Shrinks is {status.get('Shrinks')}")
    return restarts[0]["extra"]["down_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{machine()}; 2 hosts x 1 process, llama3-tiny, algo-2 lost at step {FAULT_STEP}, checkpoint at step 4")
    results: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="bench-shrink-") as tmp:
        for repeat in range(args.repeats):  # kinds take turns, so machine noise hits each
            for kind in KINDS:
                results[kind].append(down_s(kind, Path(tmp), repeat))
                print(f"  {kind} #{repeat}: {results[kind][-1]:.1f} s", flush=True)
    for kind, runs in results.items():
        print(f"| {kind} | **{statistics.median(runs):.1f} s** ({', '.join(f'{r:.1f}' for r in runs)}) |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
