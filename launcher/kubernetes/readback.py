"""A Kubernetes job's records, checkpoints and outputs read back on this machine, from the storage its
record names (launcher.kubernetes.storage.storage_record), as the Slurm backend reads its shared
job directory (launcher.backends.jobdir).

S3: each host's output data the pods mirror under `<job prefix>/hosts/` is downloaded into the job's
directory of smlaunch's job store (`records/`), the newest checkpoint found under the checkpoints'
prefix, the archives named by their URIs. A claim: read where this machine mounts it
(storage.client_path); without one, nothing on the claim is readable from here, and the reader says
so with the fix (SettingError: exit code 2).
"""

# Imports inside functions: boto3 loads only to read a job on S3 storage (CLI start-up).
from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from launcher.backends.base import SettingError
from launcher.wire.checkpoints import Checkpoint, latest_in_s3, latest_local
from launcher.wire.pod_config import RECORDS_PREFIX

RECORDS_DIR = "records"  # in the job's store directory: its S3 records as last downloaded


def unreadable(storage: dict) -> str | None:
    """Why this machine cannot read the job's files (a claim it does not mount), else None."""
    if "s3" in storage or storage.get("client_path"):
        return None
    return (f"the job's files are on the claim {storage['pvc']} ({storage['job_dir']} in the pods), which this "
            "machine does not mount")


def _unreadable_error(storage: dict) -> SettingError:
    return SettingError(f"{unreadable(storage)}: mount the claim here (an FSx or EFS mount of {storage['pvc']}) and "
                        "set kubernetes.storage.client_path to it in the job file before submitting")


def on_client(storage: dict, pod_path: str) -> Path:
    """Where this machine sees a path on the claim (`pod_path`, under the pods' mount_path)."""
    if not storage.get("client_path"):
        raise _unreadable_error(storage)
    relative = PurePosixPath(pod_path).relative_to(storage["mount_path"])
    return Path(storage["client_path"]).expanduser() / relative


def job_dir(storage: dict, store_dir: Path) -> Path:
    """A directory laid out as a job directory (`hosts/<host>/output/data/`), readable here: the claim's
    job directory through client_path, or the S3 records downloaded now into `store_dir`/records."""
    if "s3" not in storage:
        return on_client(storage, storage["job_dir"])
    s3 = storage["s3"]
    fresh = store_dir / f".{RECORDS_DIR}.partial"
    shutil.rmtree(fresh, ignore_errors=True)
    (fresh / RECORDS_PREFIX).mkdir(parents=True)  # a job whose pods have uploaded nothing yet has no records
    from launcher.wire.s3io import download_prefix, join  # boto3: only for a job on S3

    download_prefix(join(s3["job"], RECORDS_PREFIX), fresh / RECORDS_PREFIX, s3["region"], required=False)
    records = store_dir / RECORDS_DIR
    shutil.rmtree(records, ignore_errors=True)
    fresh.rename(records)  # a reader sees the whole last download, never half of one
    return records


def checkpoint(storage: dict) -> Checkpoint | None:
    """The newest complete checkpoint: under the checkpoints' S3 prefix, or in the claim's directory."""
    if "s3" in storage:
        from launcher.wire.s3io import client  # boto3: only for a job on S3

        return latest_in_s3(client(storage["s3"]["region"]), storage["s3"]["checkpoints"])
    return latest_local(on_client(storage, storage["checkpoint_dir"]))


def artifacts(storage: dict) -> dict[str, str]:
    """The archives the pods stored in S3 (model.tar.gz, output.tar.gz); on a claim, the first host's
    model and output data directories there (no archive is packed on a claim)."""
    if "s3" not in storage:
        host = f"{storage['job_dir']}/hosts/algo-1"
        return {"model": f"{host}/model", "output": f"{host}/output/data"}
    from launcher.wire.s3io import join, list_keys, split  # boto3: only for a job on S3

    output = storage["s3"]["output"]
    bucket, _ = split(output)
    stored = {PurePosixPath(key).name: f"s3://{bucket}/{key}" for key in list_keys(join(output, ""),
                                                                                 storage["s3"]["region"])}
    return {name: stored[name] for name in ("model.tar.gz", "output.tar.gz") if name in stored}
