"""The docker runner's costs: building the image from local material, and a job in containers
against the same job in processes.

1. `scripts/build-image.sh --fresh-base`: the whole build (wheelhouse, Debian root file system,
   import, Dockerfile); then the same command without --fresh-base, which reuses the base and
   the engine's layer cache (what `make test` pays on a machine that kept its images).
2. `make demo`'s job (configs/local/demo.yaml: 2 hosts x 2 processes, hsd 2 + cp 2, 120 steps)
   and a one-step job of the same layout, with --runner process and --runner docker, alternated
   so that machine noise hits both; the losses of the two runners must be equal.

Run: `.venv/bin/python bench/docker_overhead.py [--repeats 2] [--skip-build]` (needs podman or
Docker; `make image` installs podman where it can).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "smlaunch:bench"
DEMO = ROOT / "configs" / "local" / "demo.yaml"
DEMO_DATA = ["build/demo/data/train/train.jsonl", "build/demo/data/validation/validation.jsonl"]


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def losses(output: str) -> list[tuple[int, float]]:
    """(step, loss or val_loss) of the job whose artifacts `submit` printed."""
    archive = next(line.split(": ", 1)[1].strip() for line in output.splitlines()
                   if line.strip().startswith("output artifact:"))
    with tarfile.open(archive) as tar:
        records = [json.loads(x) for x in tar.extractfile("metrics.jsonl").read().decode().splitlines()]
    return [(r["step"], r.get("loss", r.get("val_loss"))) for r in records if "loss" in r or "val_loss" in r]


def job_files(tmp: Path) -> dict[str, Path]:
    demo = yaml.safe_load(DEMO.read_text())
    for key in ("source_dir", "output_path"):  # relative to configs/local/
        demo[key] = str((DEMO.parent / demo[key]).resolve())
    demo["inputs"] = {k: str((DEMO.parent / v).resolve()) for k, v in demo["inputs"].items()}
    demo["output_path"] = str(tmp / "artifacts")
    demo["image_uri"] = IMAGE
    one_step = {**demo, "hyperparameters": {**demo["hyperparameters"], "max_steps": 1, "logging_freq": 1}}
    files = {}
    for name, data in (("demo", demo), ("one-step", one_step)):
        files[name] = tmp / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(data))
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-build", action="store_true", help="use the image smlaunch:bench as it is")
    args = parser.parse_args()
    result: dict = {"machine": f"{platform.node()} ({os.cpu_count()} cpu)", "python": platform.python_version()}
    if not args.skip_build:
        result["build_fresh_s"] = round(timed(["scripts/build-image.sh", "--fresh-base", "--tag", IMAGE])[0], 1)
        result["build_cached_s"] = round(timed(["scripts/build-image.sh", "--tag", IMAGE])[0], 1)
        print(f"image build: {result['build_fresh_s']} s from nothing, {result['build_cached_s']} s again")
    timed(["make", "-s", *DEMO_DATA])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "SMLAUNCH_HOME": str(tmp / "home"), "NO_COLOR": "1"}
        for name, path in job_files(tmp).items():
            seconds: dict[str, list[float]] = {"process": [], "docker": []}
            seen: dict[str, list] = {}
            for _ in range(args.repeats):
                for runner, runs in seconds.items():
                    elapsed, out = timed([sys.executable, "-m", "launcher.cli", "submit", str(path),
                                          "--local", "--runner", runner], env)
                    runs.append(elapsed)
                    seen.setdefault(runner, losses(out))
            if seen["process"] != seen["docker"]:
                raise SystemExit(f"{name}: the runners' losses differ: {seen}")
            process, docker = (statistics.median(seconds[r]) for r in ("process", "docker"))
            result[name] = {"process_s": round(process, 1), "docker_s": round(docker, 1),
                            "overhead_s": round(docker - process, 1), "ratio": round(docker / process, 2),
                            "runs": {r: [round(x, 1) for x in v] for r, v in seconds.items()},
                            "same_losses": True, "last_loss": seen["docker"][-1][1]}
            print(f"{name}: process {process:.1f} s, docker {docker:.1f} s "
                  f"(+{docker - process:.1f} s, x{docker / process:.2f}); losses equal")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
