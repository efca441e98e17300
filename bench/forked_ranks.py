"""Ranks forked from a preloaded agent against ranks torchrun starts as programs (docs/container.md,
"Ranks forked from a preloaded agent").

One host's bootstrap (`python -m container train` on an /opt/ml tree) runs smlaunch's train.py
(llama3-tiny, synthetic data, context 64, 3 steps) with 1, 2 and 4 ranks, two ways: as smlaunch's
runtime (the agent imports it once and forks the ranks) and as the same script spelled so that the
runtime rule does not see it (`container.trainer` imported through importlib), which runs under
plain torchrun. Per job: the CPU seconds of the whole process tree (bootstrap, agent, ranks:
RUSAGE_CHILDREN, every process waited for), the wall time, and the time from the bootstrap's
start to the first step's record. The two ways train the same losses bit for bit
(tests/integration/test_forked_ranks.py).
Run: `.venv/bin/python bench/forked_ranks.py [--ranks 1 2 4] [--repeats 2]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from launcher.wire.hyperparameters import encode
from launcher.wire.opt_ml import write_opt_ml

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "entrypoints" / "train.py"
HYPERPARAMETERS = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64,
                   "train_batch_size": 4, "max_steps": 3, "seed": 7, "logging_freq": 1}
IMPORT = "    from container.trainer import train\n"
SPELLED = "    train = __import__('importlib').import_module('container.trainer').train\n"


def job(root: Path, kind: str, ranks: int) -> dict:
    src = root / "src"
    src.mkdir(parents=True)
    text = TRAIN.read_text()
    (src / "train.py").write_text(text if kind == "forked" else text.replace(IMPORT, SPELLED))
    hps = {**HYPERPARAMETERS, "sagemaker_program": "train.py", "sagemaker_submit_directory": str(src),
           "sagemaker_torch_distributed_enabled": True, "sagemaker_smlaunch_processes_per_host": ranks}
    base = root / "algo-1" / "opt" / "ml"
    write_opt_ml(base, hyperparameters=encode(hps), current_host="algo-1", hosts=["algo-1"],
                 instance_type="local", channels={})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SMLAUNCH_"))}
    env.update({"SAGEMAKER_BASE_DIR": str(base), "PYTHONPATH": str(REPO), "TMPDIR": str(root)})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, start_wall = time.monotonic(), time.time()
    proc = subprocess.run([sys.executable, "-m", "container", "train"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} job with {ranks} rank(s) failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    launcher = "container.distributed.forked_ranks" if kind == "forked" else "torch.distributed.run"
    if f"-m {launcher} " not in proc.stdout + proc.stderr:
        raise SystemExit(f"the {kind} job did not run under {launcher}")
    records = [json.loads(line) for line in (base / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if r.get("step") == 1 and "loss" in r)
    loop_start = first.get("loop_start")
    return {"cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, "wall_s": wall,
            "to_loop_s": _seconds(loop_start) - start_wall if loop_start else None,
            "losses": [r["loss"] for r in records if "loss" in r]}


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores; median of {args.repeats}")
    print("ranks | program ranks: CPU s, wall s, to loop s | forked ranks: CPU s, wall s, to loop s "
          "| CPU forked/program")
    for ranks in args.ranks:
        runs: dict[str, list[dict]] = {"program": [], "forked": []}
        with tempfile.TemporaryDirectory() as tmp:
            for repeat in range(args.repeats):
                for kind in runs:  # alternated, so a busy moment of the machine hits both
                    runs[kind].append(job(Path(tmp) / f"{kind}-{ranks}-{repeat}", kind, ranks))
        if runs["program"][0]["losses"] != runs["forked"][0]["losses"]:
            raise SystemExit(f"{ranks} rank(s): the losses differ: {runs['program'][0]['losses']} "
                             f"against {runs['forked'][0]['losses']}")
        med = {kind: {key: statistics.median(r[key] for r in rs) for key in ("cpu_s", "wall_s", "to_loop_s")}
               for kind, rs in runs.items()}
        p, f = med["program"], med["forked"]
        print(f"{ranks} | {p['cpu_s']:.1f}, {p['wall_s']:.1f}, {p['to_loop_s']:.1f} | "
              f"{f['cpu_s']:.1f}, {f['wall_s']:.1f}, {f['to_loop_s']:.1f} | {f['cpu_s'] / p['cpu_s']:.2f}")


if __name__ == "__main__":
    main()
