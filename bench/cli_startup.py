"""Wall time of `smlaunch --help` and `smlaunch validate` beside `python -c pass` (median of N runs),
then `smlaunch validate` against `import sagemaker.pytorch` (the official SDK v2) in alternating pairs.

Target (issue 2): validate <= 0.35 s on the 2-core dev machine. Target (issue 28): validate takes at
most 0.10x the time of `python -c "import sagemaker.pytorch"`, as the median of the per-pair ratios
(alternating pairs keep the ratio steady on a machine loaded by other work). Run: `make bench` or
`.venv/bin/python bench/cli_startup.py [--runs 15] [--pairs 7] [--bytecode]` (`--runs 0`: the pairs only).

Bytecode: the SDK's modules were compiled when it was installed; smlaunch is an editable install, so
its modules are compiled from source on every run unless Python may write __pycache__ (not where
PYTHONDONTWRITEBYTECODE is set, as on the dev VM). The script says which holds; `--bytecode` runs
both sides of the pairs with a bytecode cache of their own (a temporary PYTHONPYCACHEPREFIX, filled
by the warm-up pair), as an installed smlaunch would start.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.util import cache_from_source
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


# The pair comparison (issue 28): our validate against the official SDK's import of its PyTorch estimator.
VALIDATE = [SMLAUNCH, "validate", "configs/seed/p5-cp8-fp8.yaml"]
SAGEMAKER = [sys.executable, "-c", "import sagemaker.pytorch"]


def time_once(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def bytecode_note() -> str:
    """Whether smlaunch's modules start from cached bytecode here."""
    sources = sorted((ROOT / "launcher").rglob("*.py"))
    stale = sum(1 for f in sources if not Path(cache_from_source(str(f))).is_file()
                or Path(cache_from_source(str(f))).stat().st_mtime < f.stat().st_mtime)
    writes = "off (PYTHONDONTWRITEBYTECODE)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
    return (f"bytecode: {stale} of launcher's {len(sources)} modules have no up-to-date __pycache__ entry "
            f"(compiled from source when imported); bytecode writing {writes}")


def compare_pairs(pairs: int, bytecode: bool) -> None:
    """validate and `import sagemaker.pytorch` in alternating pairs (one warm-up pair left out)."""
    if pairs <= 0:
        return
    with tempfile.TemporaryDirectory(prefix="cli-startup-pycache-") as prefix:
        env = None
        if bytecode:  # both sides read (and the warm-up pair writes) bytecode under `prefix`
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = prefix
        time_once(VALIDATE, env)
        time_once(SAGEMAKER, env)
        ours, theirs = [], []
        for i in range(pairs):
            order = (VALIDATE, SAGEMAKER) if i % 2 == 0 else (SAGEMAKER, VALIDATE)  # neither always goes first
            took = {id(cmd): time_once(cmd, env) for cmd in order}
            ours.append(took[id(VALIDATE)])
            theirs.append(took[id(SAGEMAKER)])
    ratios = [a / b for a, b in zip(ours, theirs)]
    cache = "both with a bytecode cache of their own (--bytecode)" if bytecode else bytecode_note()
    print(f"\nsmlaunch validate configs/seed/p5-cp8-fp8.yaml against python -c \"import sagemaker.pytorch\", "
          f"{pairs} alternating pairs (one warm-up pair discarded), load average {os.getloadavg()[0]:.2f}; "
          f"{cache}:")
    print(f"{'smlaunch validate (p5 CP8 FP8)':<32} median {statistics.median(ours) * 1000:7.1f} ms   "
          f"runs {' '.join(f'{t * 1000:.0f}' for t in ours)}")
    print(f"{'import sagemaker.pytorch':<32} median {statistics.median(theirs) * 1000:7.1f} ms   "
          f"runs {' '.join(f'{t * 1000:.0f}' for t in theirs)}")
    print(f"{'per-pair ratio':<32} median {statistics.median(ratios):7.3f} x    "
          f"pairs {' '.join(f'{r:.3f}' for r in ratios)}   (target <= 0.100)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--pairs", type=int, default=7, help="alternating validate / import sagemaker.pytorch pairs")
    parser.add_argument("--bytecode", action="store_true",
                        help="run the pairs with a temporary bytecode cache for both commands (PYTHONPYCACHEPREFIX)")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, python {platform.python_version()}, "
          f"{args.runs} runs each (first run discarded as warm-up)")
    baseline = None
    for name, cmd in CASES.items() if args.runs > 0 else ():
        time_once(cmd)
        runs = [time_once(cmd) for _ in range(args.runs)]
        median = statistics.median(runs)
        baseline = baseline or median
        print(f"{name:<32} median {median * 1000:7.1f} ms   min {min(runs) * 1000:7.1f} ms   "
              f"x{median / baseline:5.1f} of python -c pass")
    compare_pairs(args.pairs, args.bytecode)


if __name__ == "__main__":
    main()
