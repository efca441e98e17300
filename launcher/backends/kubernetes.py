"""Kubernetes jobs: a Kubeflow Trainer v2 TrainJob (launcher.kubernetes.manifest) or a SageMaker
HyperPod HyperPodPyTorchJob (launcher.kubernetes.hyperpod), as `kubernetes.kind` says, created with
the official `kubernetes` client beside the job's ConfigMap (its pods' configuration and code) and Secret.

The cluster says how the job is doing (the job's conditions, its pods and their logs); smlaunch's
job store keeps a small record of each job submitted from here (the cluster, namespace and name it
was created with, and how it ended once it has), so `status`, `logs`, `stop` and `list` find it by
name as they find a Slurm job. docs/kubernetes.md has the details.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.backends import jobmetrics
from launcher.backends.base import TERMINAL_STATUSES, BackendError, FilesElsewhere, JobFailedError, Options
from launcher.backends.metric_records import JOBDIR_METRICS, JobMetrics, algorithm_record
from launcher.config import ValidatedJob
from launcher.kubernetes import cluster, kueue, readback, render, versions
from launcher.kubernetes.kinds import TRAIN_JOB, JobKind, kind_named
from launcher.kubernetes.manifest import claim_checkpoint_dir, config_map_name, env_secret_name
from launcher.kubernetes.status import host_of, job_status
from launcher.kubernetes.storage import storage_record
from launcher.local import store
from launcher.local.restarts import job_restarts
from launcher.wire.checkpoints import Checkpoint
from launcher.wire.faults import Restart
from launcher.wire.goodput import Goodput, measure
from launcher.wire.metric_lines import Progress, as_datetime, read_progress
from launcher.wire.terminal import printable
from launcher.wire.training.issues import ConfigError, Issue

# `status` reads progress, restarts and goodput from the same records: one S3 download serves them all.
# The pods upload every 10 s (container.toolkit.pod_storage), so a download this recent is as new as S3's.
RECORDS_FRESH_S = 5.0


class KubernetesBackend:
    name = "kubernetes"
    unlisted: list[str] = []

    def __init__(self, root: Path | None = None, printer: Callable[[str], None] | None = None):
        self.root = root
        self.print = printer or print
        self._files: dict[str, tuple[float, tuple[Path, str]]] = {}  # job -> (when, job_files) read last

    @classmethod
    def create(cls, options: Options) -> KubernetesBackend:
        return cls(printer=options.printer)

    # --- submitting ----------------------------------------------------------------------
    def _render(self, job: ValidatedJob, job_name: str | None) -> render.Rendered:
        if job.config.backend_name != self.name:
            raise BackendError(f"backend {job.config.backend_name} is not kubernetes: submit the job with the "
                               "backend it names")
        return render.render(job, job_name)

    def dryrun(self, job: ValidatedJob, job_name: str | None = None) -> render.ManifestDryRun:
        """The manifests submit would create, as YAML: the Secret's values masked, the code archive's
        bytes shown by their size, everything else as sent (launcher.kubernetes.render)."""
        return render.dry_run(self.name, self._render(job, job_name))

    def submit(self, job: ValidatedJob, job_name: str | None = None, *, detach: bool = False) -> str:
        """Create the Secret, the ConfigMap and the job; the job runs in the cluster whether or not it is
        followed. A job the cluster refuses leaves neither of the others behind."""
        rendered = self._render(job, job_name)
        name, settings, objects = rendered.name, rendered.settings, rendered.objects
        directory = store.job_dir(name, self.root)
        if directory.exists():
            raise BackendError(f"a job named {name} exists already ({directory}): choose another job name")
        api = cluster.connect(settings.kubeconfig, settings.context)
        if settings.kind == TRAIN_JOB.name:  # what the cluster's Trainer and Kueue can run, before anything exists
            for note in versions.check_cluster(api, queued=bool(settings.queue)):
                self.print(f"note: {note}")
        created = []
        try:
            for obj in objects:
                cluster.create(api, obj)
                created.append(obj)
        except BackendError:
            for obj in created:
                cluster.delete(api, obj["kind"], settings.namespace, obj["metadata"]["name"])
            raise
        store.write(directory, {
            "TrainingJobName": name, "TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting",
            "CreationTime": store.now(), "Backend": self.name,
            "ResourceConfig": {"InstanceType": job.config.instance_type, "InstanceCount": job.config.instance_count},
            "AlgorithmSpecification": algorithm_record(job.config, job.config.image_uri),
            "Kubernetes": {"kind": settings.kind, "namespace": settings.namespace, "context": settings.context,
                           "kubeconfig": settings.kubeconfig, "on_stop": settings.on_stop,
                           "storage": storage_record(job, name, settings, None if settings.storage.s3 else
                                                     claim_checkpoint_dir(job, name, settings))}})
        self.print(f"created {settings.kind} {settings.namespace}/{name} (with ConfigMap {config_map_name(name)}"
                   + (f" and Secret {env_secret_name(name)}" if objects[0]["kind"] == "Secret" else "") + ")")
        return name

    # --- following -----------------------------------------------------------------------
    def resolve(self, job: str) -> str:
        return job

    def exists(self, name: str) -> bool:
        return store.owns(self.name, name, self.root)

    def _record(self, name: str) -> dict:
        return store.owned_record(self.name, name, self.root)

    def _where(self, record: dict) -> tuple[Any, str, JobKind]:
        where = record["Kubernetes"]
        return (cluster.connect(where.get("kubeconfig"), where.get("context")), where["namespace"],
                kind_named(where.get("kind")))

    def attach_fields(self, desc: dict) -> dict[str, Any]:
        return {}  # DescribeTrainingJob's fields say it all

    def how(self, record: dict) -> str:
        return self.name

    def describe(self, name: str) -> dict:
        """The record with what the cluster says now; an ended job's outcome is recorded once."""
        record = self._record(name)
        if record["TrainingJobStatus"] in TERMINAL_STATUSES:
            return _with_note(record)
        api, namespace, kind = self._where(record)
        found = cluster.get_job(api, kind, namespace, name)
        if found is None:
            status = {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed",
                      "FailureReason": f"the {kind.name} {namespace}/{name} is gone from the cluster (deleted "
                                       "without smlaunch)"}
        else:
            pods = cluster.list_pods(api, kind, namespace, name)
            status = job_status(found, pods, kind)
            if status["SecondaryStatus"] == "Pending" and (why := kueue.why_queued(api, namespace, found)):
                status["StatusMessage"] += f"; {why}"
            started = [p["status"]["startTime"] for p in pods if (p.get("status") or {}).get("startTime")]
            if started and not record.get("TrainingStartTime"):  # goodput's start: the first pod's, kept once
                record = store.update(store.job_dir(name, self.root), TrainingStartTime=min(started))
        if status["TrainingJobStatus"] in TERMINAL_STATUSES:
            return _with_note(store.update(store.job_dir(name, self.root), outcome=True,
                                           TrainingEndTime=store.now(), **status))
        return _with_note({**record, **status})

    def wait(self, name: str, logs: bool = True, poll: float = 5.0) -> dict:
        if logs:
            return self._completed(name, self._follow_logs(name, poll))
        while (record := self.describe(name))["TrainingJobStatus"] not in TERMINAL_STATUSES:
            api, namespace, kind = self._where(record)
            cluster.wait_for_change(api, kind, namespace, name, poll)
        return self._completed(name, record)

    def _completed(self, name: str, record: dict) -> dict:
        if record["TrainingJobStatus"] != "Completed":
            raise JobFailedError(name, record["TrainingJobStatus"], record.get("FailureReason", ""),
                                 f"smlaunch logs kubernetes:{name}")
        return record

    def interrupted(self, name: str) -> None:
        return None  # the job runs on in the cluster

    def logs(self, name: str, follow: bool = False, poll: float = 5.0) -> None:
        """Every pod's log, each line after its host (`algo-2 | ...`), as a local job's merged log;
        followed, until the job ends."""
        if follow:
            self._completed(name, self._follow_logs(name, poll))
            return
        for host, line in self.log_lines(name):
            self.print(f"{host} | {printable(line)}")

    def log_lines(self, name: str) -> list[tuple[str, str]]:
        """(host, line) of every pod's log as it is now, algo-1's first."""
        api, namespace, kind = self._where(self._record(name))
        return [(host, line) for host, pod in _hosts(cluster.list_pods(api, kind, namespace, name))
                for line in cluster.pod_log(api, namespace, pod).splitlines()]

    def _follow_logs(self, name: str, poll: float) -> dict:
        """Stream each pod's log from a thread of its own (pods appear as the job starts), print the
        lines here as they come, and return the record once the job has ended and the streams closed."""
        api, namespace, kind = self._where(self._record(name))
        lines: queue.Queue[str] = queue.Queue()
        streams: dict[str, threading.Thread] = {}
        while True:
            record = self.describe(name)
            for host, pod in _hosts(cluster.list_pods(api, kind, namespace, name)):
                if pod not in streams:
                    streams[pod] = threading.Thread(target=_stream, args=(api, namespace, pod, host, lines),
                                                    daemon=True)
                    streams[pod].start()
            ended = record["TrainingJobStatus"] in TERMINAL_STATUSES
            deadline = time.monotonic() + poll
            while time.monotonic() < deadline or (ended and any(t.is_alive() for t in streams.values())):
                try:
                    self.print(lines.get(timeout=0.1))
                except queue.Empty:
                    if ended and not any(t.is_alive() for t in streams.values()):
                        break
            if ended:
                while not lines.empty():
                    self.print(lines.get())
                return record

    def stop(self, name: str) -> None:
        """Delete the job (foreground: its pods with it), then its ConfigMap and Secret; or, with
        kubernetes.on_stop: suspend, suspend it (through its Kueue Workload where Kueue queues it:
        launcher.kubernetes.kueue) and keep them. Either way each pod gets SIGTERM
        and the grace period the manifest gives it (launcher.kubernetes.manifest.GRACE_PERIOD_S), in
        which the bootstrap stops torchrun and the ranks save a checkpoint, as on SageMaker. The job is
        recorded Stopped."""
        record = self.describe(name)
        if record["TrainingJobStatus"] in TERMINAL_STATUSES:
            raise BackendError(f"kubernetes job {name} has already ended ({record['TrainingJobStatus']})")
        api, namespace, kind = self._where(record)
        if record["Kubernetes"].get("on_stop") == "suspend":
            how = kueue.suspend(api, kind, namespace, name)  # its spec, or its Workload where Kueue queues it
        else:
            for what, obj in ((kind.name, name), ("ConfigMap", config_map_name(name)),
                              ("Secret", env_secret_name(name))):
                cluster.delete(api, what, namespace, obj)
            how = "deleted by smlaunch stop"
        store.update(store.job_dir(name, self.root), outcome=True, TrainingJobStatus="Stopped",
                     SecondaryStatus="Stopped", StatusMessage=how, TrainingEndTime=store.now())

    def list(self, status: str | None = None, name_contains: str | None = None, max_results: int = 50) -> list[dict]:
        """The jobs submitted from here (smlaunch's job store), as the cluster says they are now. ConfigError
        (this machine is not set up for Kubernetes) where there are none and no cluster is configured."""
        rows, self.unlisted = [], []
        records = [r for r in store.list_jobs(self.root, None, name_contains, None) if store.backend_of(r) == self.name]
        if not records and (why := cluster.unconfigured()):
            raise ConfigError([Issue("kubernetes.kubeconfig", None, f"no Kubernetes cluster is configured here "
                                     f"({why}), and no job was submitted to one from here", "set KUBECONFIG or "
                                     "write ~/.kube/config; on EKS: aws eks update-kubeconfig --name <cluster>")])
        for record in records:
            try:
                record = self.describe(record["TrainingJobName"])
            except BackendError as exc:  # one unreachable cluster hides no other job
                self.unlisted.append(f"{record['TrainingJobName']}: {exc}")
            if not status or record["TrainingJobStatus"] == status:
                rows.append({k: record.get(k) for k in ("TrainingJobName", "TrainingJobStatus", "CreationTime",
                                                        "TrainingEndTime", "TrainingStartTime")})
        return rows[:max_results]

    # --- what is on the job's storage: read back from S3, or from the claim where it is mounted here ---
    def _storage(self, name: str) -> dict:
        record = self._record(name)
        if "storage" not in record["Kubernetes"]:
            raise BackendError(f"job {name} was submitted before smlaunch recorded where its files are "
                               "(an earlier smlaunch): read them on the cluster")
        return record["Kubernetes"]["storage"]

    def job_files(self, name: str) -> tuple[Path, str]:
        """(a directory laid out as a job directory, readable here; where it comes from). A claim this
        machine does not mount is a SettingError naming kubernetes.storage.client_path (exit code 2)."""
        read = self._files.get(name)
        if read is not None and time.monotonic() - read[0] < RECORDS_FRESH_S:
            return read[1]
        storage = self._storage(name)
        files = readback.job_dir(storage, store.job_dir(name, self.root))
        found = files, storage["s3"]["job"] if "s3" in storage else str(files)
        self._files[name] = (time.monotonic(), found)
        return found

    def _readable(self, name: str) -> Path | None:
        """The job's files here, or None where they are not readable from here (status says why)."""
        if readback.unreadable(self._storage(name)):
            return None
        return self.job_files(name)[0]

    def artifacts(self, name: str) -> dict[str, str]:
        return readback.artifacts(self._storage(name))

    def progress(self, name: str) -> Progress | None:
        """Rank 0's progress.json, in the first host's output data."""
        files = self._readable(name)
        return read_progress((files / JOBDIR_METRICS).parent) if files else None

    def checkpoint(self, name: str) -> Checkpoint | None:
        storage = self._storage(name)
        return None if readback.unreadable(storage) else readback.checkpoint(storage)

    def goodput(self, name: str) -> Goodput | None:
        record = self._record(name)
        started = as_datetime(record.get("TrainingStartTime"))
        files = self._readable(name) if started else None
        if files is None:
            return None
        return measure(_output_data(files), started, as_datetime(record.get("TrainingEndTime")))

    def metrics(self, name: str, logs: dict | None = None) -> JobMetrics:
        """metrics.jsonl as the pods store it, or the pods' logs through metric_definitions (jobmetrics)."""
        return jobmetrics.from_job_files(self, name)

    def restarts(self, name: str) -> list[Restart]:
        files = self._readable(name)
        return job_restarts(_output_data(files)) if files else []

    def job_dir(self, name: str) -> None:
        """None: the job runs from the cluster's storage (job_files reads it back)."""
        return None

    def output_data_dirs(self, name: str) -> dict[str, Path]:
        """{host: its output data directory}: on S3 as the pods mirror it (downloaded now), on a claim through
        client_path; FilesElsewhere, saying where they are, on a claim this machine does not mount."""
        storage = self._storage(name)
        if why := readback.unreadable(storage):
            raise FilesElsewhere(f"job {name}'s output data is not readable here: {why}. Each host's is in "
                                 f"{storage['job_dir']}/hosts/<host>/output/data on the claim (diagnostics/ among "
                                 "it): read it in a pod that mounts the claim, or mount the claim here and set "
                                 "kubernetes.storage.client_path in the job file before submitting the next job")
        return {directory.parents[1].name: directory for directory in _output_data(self.job_files(name)[0])}


def _output_data(files: Path) -> list[Path]:
    """Each host's output data directory in a job directory, algo-1 first."""
    return sorted((files / "hosts").glob("*/output/data"))


def _with_note(record: dict) -> dict:
    """The record, with a note where the job's files cannot be read from here (a claim not mounted)."""
    storage = record["Kubernetes"].get("storage")
    why = storage and readback.unreadable(storage)
    if why:
        return {**record, "StorageNote": f"no progress or checkpoint shown: {why}; set "
                                         "kubernetes.storage.client_path where this machine mounts it"}
    return record


def _hosts(pods: list[dict]) -> list[tuple[str, str]]:
    """(host, pod name) of the job's pods, algo-1 first."""
    return sorted((host_of(pod), pod["metadata"]["name"]) for pod in pods)


def _stream(api: Any, namespace: str, pod: str, host: str, lines: queue.Queue) -> None:
    for line in cluster.follow_pod_log(api, namespace, pod):
        lines.put(f"{host} | {printable(line)}")
