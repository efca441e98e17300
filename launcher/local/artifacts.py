"""A local job's artifacts, as SageMaker makes them: the hosts' output data packed into
output.tar.gz and their model directories into model.tar.gz, put in output_path (a directory, or
S3), and the checkpoints and TensorBoard files uploaded to their S3 prefixes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from launcher.local.shrink import rank0_hosts
from launcher.local.spec import LocalJobSpec
from launcher.local.store import merged
from launcher.wire import s3io
from launcher.wire.archives import files, pack, whole


def store(spec: LocalJobSpec, with_model: bool, note: Callable[[str], None]) -> dict:
    """The record's OutputArtifacts (and ModelArtifacts) once they are stored."""
    staging = spec.job_dir / "artifacts"
    staging.mkdir(exist_ok=True)
    try:
        where = _store_archives(spec, staging, with_model)
    finally:  # the archives live on in output_path only, or nowhere when they could not be stored
        shutil.rmtree(staging, ignore_errors=True)
    out = {"OutputArtifacts": where}
    if "model.tar.gz" in where:
        out["ModelArtifacts"] = {"S3ModelArtifacts": where["model.tar.gz"]}
    if spec.checkpoint_s3_uri:
        count = s3io.upload_tree(spec.checkpoint_dir, spec.checkpoint_s3_uri, spec.region)
        note(f"checkpoints: {count} file(s) to {spec.checkpoint_s3_uri}")
    # SageMaker uploads while the job runs; here once, at its end, from each host rank 0 wrote it on (a
    # shrink that lost rank 0's host moved it on): the event files' names are the writers' own
    tensorboard = {spec.tensorboard_output(host) for host in rank0_hosts(merged(spec.job_dir))} - {None}
    for directory, prefix in sorted(tensorboard):
        count = s3io.upload_tree(directory, prefix, spec.region)
        note(f"TensorBoard: {count} file(s) from {directory} to {prefix}")
    return out


def _store_archives(spec: LocalJobSpec, staging: Path, with_model: bool) -> dict[str, str]:
    """Pack the hosts' output (and model) in `staging`, then put them in output_path."""
    hosts = [spec.host_dir(h) for h in spec.every_host()]  # a host the job went on without wrote output too
    packed = {"output.tar.gz": pack([h / "output" / "data" for h in hosts], staging / "output.tar.gz")}
    models = [h / "model" for h in hosts] + [spec.job_dir / "model"]
    # An empty model directory (a job stopped before its export) is no model: no archive claims one.
    if with_model and any(files(d) for d in models):
        packed["model.tar.gz"] = pack(models, staging / "model.tar.gz")
    if spec.output_path and spec.output_path.startswith("s3://"):
        base = f"{spec.output_path.rstrip('/')}/{spec.name}/output"
        for name, path in packed.items():
            s3io.upload_file(path, f"{base}/{name}", spec.region)
        return {name: f"{base}/{name}" for name in packed}
    dest = Path(spec.output_path) / spec.name / "output" if spec.output_path else spec.job_dir / "output"
    dest.mkdir(parents=True, exist_ok=True)
    for name, path in packed.items():
        with whole(dest / name) as partial:
            shutil.move(path, partial)  # a rename on the same file system, else a copy
    return {name: str(dest / name) for name in packed}
