"""Wall time of `smlaunch --help` and `smlaunch validate` beside `python -c pass` (median of N runs).

Target (issue 2): validate <= 0.35 s on the 2-core dev machine. Run: `make bench` or
`.venv/bin/python bench/cli_startup.py [--runs 15]`.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMLAUNCH = str(Path(sys.executable).with_name("smlaunch"))
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "smlaunch --help": [SMLAUNCH, "--help"],
    "smlaunch validate (p5 CP8 FP8)": [SMLAUNCH, "validate", "configs/seed/p5-cp8-fp8.yaml"],
    "smlaunch validate --json": [SMLAUNCH, "validate", "configs/seed/p4d-cp8.yaml", "--json"],
    "smlaunch submit --dry-run": [SMLAUNCH, "submit", "configs/seed/p5-cp8-fp8.yaml", "--dry-run"],
}


def time_once(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, python {platform.python_version()}, "
          f"{args.runs} runs each (first run discarded as warm-up)")
    baseline = None
    for name, cmd in CASES.items():
        time_once(cmd)
        runs = [time_once(cmd) for _ in range(args.runs)]
        median = statistics.median(runs)
        baseline = baseline or median
        print(f"{name:<32} median {median * 1000:7.1f} ms   min {min(runs) * 1000:7.1f} ms   "
              f"x{median / baseline:5.1f} of python -c pass")


if __name__ == "__main__":
    main()
