"""Where a Kubernetes job's files are, on its storage (kubernetes.storage): the pods are told in
the ConfigMap's pod.json (launcher.kubernetes.manifest), and the job's record keeps the same, so the
client reads the job's records, checkpoints and outputs back (launcher.kubernetes.readback).

On a claim (pvc): the job's directory `<output_path or mount_path/smlaunch-jobs>/<job>` holds each
host's /opt/ml tree (`hosts/<host>`) and the shared `checkpoints/`. On S3: each pod's tree is on its
own disk (an emptyDir) and the pod mirrors it as a SageMaker job does, under the job's prefix
`<storage.s3>/<job>/`: `checkpoints/` (or checkpoint_s3_uri), each host's records in
`hosts/<host>/output/data/`, and the archives in `<output_path or storage.s3>/<job>/output/`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.wire.s3io import join

if TYPE_CHECKING:
    from launcher.config.validate import ValidatedJob

JOBS_DIR = "smlaunch-jobs"  # under the claim's mount path: a job's hosts' trees when it has no output_path


def job_dir(job: ValidatedJob, name: str, settings: KubernetesSettings) -> str:
    """Where the job's hosts' /opt/ml trees and checkpoints are on the claim: under output_path (a path
    on the claim, check_kubernetes) as SageMaker's `<output_path>/<job>`, else the mount's smlaunch-jobs/."""
    root = job.config.output_path or f"{settings.storage.mount_path}/{JOBS_DIR}"
    return f"{root.rstrip('/')}/{name}"


def s3_locations(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict[str, str | None]:
    """The job's S3 prefixes on S3 storage: its own (records), its checkpoints', its outputs', and the
    region the pods' S3 client uses (None: the pod's own, from its environment)."""
    cfg = job.config
    prefix = join(settings.storage.s3, name)
    return {"job": prefix, "checkpoints": cfg.checkpoint_s3_uri or join(prefix, "checkpoints"),
            "output": join(cfg.output_path or settings.storage.s3, name, "output"), "region": cfg.region}


def storage_record(job: ValidatedJob, name: str, settings: KubernetesSettings, checkpoint_dir: str | None) -> dict:
    """What the job's record keeps of its storage, for reading it back from this machine."""
    storage = settings.storage
    if storage.s3:
        return {"s3": s3_locations(job, name, settings)}
    return {"pvc": storage.pvc, "mount_path": storage.mount_path, "client_path": storage.client_path,
            "job_dir": job_dir(job, name, settings), "checkpoint_dir": checkpoint_dir}
