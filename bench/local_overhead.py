"""Local-mode overhead: a one-step local job from the CLI against the same step in a bare script.

Target (issue 5): `smlaunch submit JOB --local` wall time minus `python train.py` wall time
<= 5 s. Both train the tiny preset for one step on synthetic data, one process; the local job
adds what local mode costs: validation, the code archive, the /opt/ml tree, the bootstrap,
torchrun, and packing the artifacts. Runs alternate so that machine noise hits both.
Run: `.venv/bin/python bench/local_overhead.py [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 1,
      "train_batch_size": 2, "seed": 7, "logging_freq": 1}


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        job = tmp / "job.yaml"
        job.write_text(yaml.safe_dump({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                                       "instance_type": "local", "output_path": str(tmp / "artifacts"),
                                       "distribution": {"torch_distributed": {"enabled": True}},
                                       "hyperparameters": HP}))
        env = {**os.environ, "SMLAUNCH_HOME": str(tmp / "home"), "OMP_NUM_THREADS": "1", "NO_COLOR": "1"}
        bare_args = [a for k, v in HP.items() for a in (f"--{k}", str(v))]
        local, bare = [], []
        for i in range(args.repeats):
            out = tmp / f"bare-{i}"
            bare.append(timed([sys.executable, str(ROOT / "entrypoints" / "train.py"), *bare_args,
                               "--output_data_dir", str(out / "data"), "--model_dir", str(out / "model"),
                               "--checkpoint_dir", str(out / "ckpt")], env, tmp))
            local.append(timed([sys.executable, "-m", "launcher.cli", "submit", str(job), "--local"], env, tmp))
    result = {"local_s": round(statistics.median(local), 2), "bare_s": round(statistics.median(bare), 2)}
    result["overhead_s"] = round(result["local_s"] - result["bare_s"], 2)
    result.update(machine=f"{platform.node()} ({os.cpu_count()} cpu)", python=platform.python_version(),
                  repeats=args.repeats, local_runs=[round(x, 2) for x in local], bare_runs=[round(x, 2) for x in bare])
    print(f"local job {result['local_s']:.2f} s, bare script {result['bare_s']:.2f} s: "
          f"overhead {result['overhead_s']:.2f} s (target <= 5 s)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
