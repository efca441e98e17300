"""A Kubernetes pod on S3 storage (pod.json's "s3"): what SageMaker does around a training container,
done by the pod itself. Before training: the channels downloaded (File mode; ShardedByS3Key keeps
every n-th object for host n, as local mode does) and the job's checkpoints, so a restarted pod or a
resumed job finds them. While training: a thread mirrors the host's checkpoint directory (each
step's files, its `.complete` marker last, and the files beside the steps) and its output data
(metrics.jsonl, progress.json, restarts, goodput) to S3 every SYNC_INTERVAL_S. At the end, stopped
(SIGTERM) or not: a last mirror, so the stop's checkpoint is in S3 within the grace period, then the
first host's output.tar.gz and model.tar.gz as SageMaker packs them. A checkpoint the runtime prunes
(num_kept_checkpoints) is deleted from S3 too, once a newer one is there.

S3 is reached with boto3's default chain: the pod's service account (IRSA or Pod Identity) gives the
credentials, never the manifest. The transfers are launcher.wire.s3io's, the archives
launcher.wire.archives'.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from launcher.wire import checkpoints, s3io
from launcher.wire.archives import files, pack
from launcher.wire.pod_config import RECORDS_PREFIX

SYNC_INTERVAL_S = 10.0  # how stale the client's view of a running job's records may be


@dataclass
class Mirror:
    """One host's checkpoints and output data, uploaded as they change."""

    host: str
    base: Path  # the host's /opt/ml tree
    checkpoint_dir: Path
    s3: dict  # pod.json's "s3": the job's prefixes and region
    sent: dict[Path, tuple[int, int]] = field(default_factory=dict)  # file -> (size, mtime) uploaded

    def note_present(self) -> None:
        """What is on disk already (the checkpoints just downloaded) needs no upload."""
        for path in files(self.checkpoint_dir):
            self.sent[path] = _stamp(path)

    def sync(self) -> int:
        """Upload what changed since the last sync, then forget in S3 the checkpoints pruned here; the
        count of files uploaded."""
        count = self._upload(self._checkpoint_files(), self.checkpoint_dir, self.s3["checkpoints"])
        data = self.base / "output" / "data"
        count += self._upload(files(data), data, s3io.join(self.s3["job"], RECORDS_PREFIX, self.host, "output", "data"))
        self._forget_pruned()
        return count

    def _forget_pruned(self) -> None:
        """Delete in S3 the checkpoint directory's files this pod uploaded or downloaded that are gone
        here since (a step the checkpointer pruned, num_kept_checkpoints: rank 0 decides, so every host
        prunes the same steps), after the newer files' upload: S3 keeps what the hosts keep, and a
        restarted pod downloads no more than that."""
        gone = [p for p in self.sent if p.is_relative_to(self.checkpoint_dir) and not p.exists()]
        if gone:
            s3io.delete_keys([s3io.join(self.s3["checkpoints"], p.relative_to(self.checkpoint_dir).as_posix())
                              for p in gone], self.s3["region"])
            for path in gone:
                del self.sent[path]

    def _checkpoint_files(self) -> list[Path]:
        """The checkpoint directory as SageMaker syncs /opt/ml/checkpoints: every file but a save in
        progress (step-<N>.tmp/ until every rank has written: container.checkpoint.checkpointer). A
        step-<N>/ directory's marker after its files; beside them what a restart needs too: the tracker
        runs' ids (container.trackers.continuity), the record of batches a non-finite rollback skips
        (launcher.wire.training.nonfinite), and a user script's own checkpoints, whatever their names."""
        in_steps, beside = [], []
        for path in files(self.checkpoint_dir):  # one listing of the directory
            top, *below = path.relative_to(self.checkpoint_dir).parts
            step = checkpoints.STEP_DIR.fullmatch(top) if below else None
            if step:
                in_steps.append((int(step[1]), path.name == checkpoints.MARKER, path))
            elif not (below and checkpoints.STEP_TMP_DIR.fullmatch(top)):
                beside.append(path)
        return [path for *_, path in sorted(in_steps)] + beside

    def _upload(self, paths: list[Path], root: Path, prefix: str) -> int:
        count = 0
        for path in paths:
            try:
                stamp = _stamp(path)
                if self.sent.get(path) == stamp:
                    continue
                s3io.upload_file(path, s3io.join(prefix, path.relative_to(root).as_posix()), self.s3["region"])
            except FileNotFoundError:  # pruned by the checkpointer since it was listed
                continue
            self.sent[path] = stamp
            count += 1
        return count


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def download_inputs(s3: dict, channels: dict[str, str], distributions: dict[str, str], hosts: list[str],
                    host: str, scratch: Path, checkpoint_dir: Path) -> dict[str, Path]:
    """Download the channels under `scratch`/channels and the job's checkpoints into checkpoint_dir;
    {channel: its directory} for the /opt/ml tree. LookupError naming the prefix S3 refused."""
    from botocore.exceptions import BotoCoreError, ClientError  # boto3 only where S3 is used

    try:
        return _download(s3, channels, distributions, hosts, host, scratch, checkpoint_dir)
    except (BotoCoreError, ClientError) as exc:
        raise LookupError(f"S3 refused a download ({exc}): check the job's s3:// prefixes and that the pods' "
                          "service account (kubernetes.service_account) has a role that may read them") from None


def _download(s3: dict, channels: dict[str, str], distributions: dict[str, str], hosts: list[str], host: str,
              scratch: Path, checkpoint_dir: Path) -> dict[str, Path]:
    local = {}
    for name, uri in channels.items():
        dest = scratch / "channels" / name
        shard = (hosts.index(host), len(hosts)) if distributions.get(name) == "ShardedByS3Key" else None
        count = s3io.download_prefix(uri, dest, s3["region"], shard=shard)
        print(f"[smlaunch] channel {name}: {count} object(s) from {uri}", flush=True)
        local[name] = dest
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    count = s3io.download_prefix(s3["checkpoints"], checkpoint_dir, s3["region"], required=False)
    print(f"[smlaunch] checkpoints: {count} file(s) from {s3['checkpoints']}", flush=True)
    # A pod started again (the JobSet's restarts) goes on with its host's records: the bootstrap numbers
    # its attempts after them, and the next upload appends to them rather than replacing them.
    records = s3io.join(s3["job"], RECORDS_PREFIX, host, "output", "data")
    count = s3io.download_prefix(records, scratch / "hosts" / host / "output" / "data", s3["region"], required=False)
    if count:
        print(f"[smlaunch] records of earlier attempts: {count} file(s) from {records}", flush=True)
    return local


class Syncing:
    """The mirror's thread while the bootstrap trains: `with Syncing(mirror): train()`."""

    def __init__(self, mirror: Mirror, interval: float = SYNC_INTERVAL_S):
        self.mirror, self.interval = mirror, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smlaunch-s3-mirror", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.mirror.sync()
            except Exception as exc:  # a transient S3 error must not stop training; the final sync says it
                print(f"[smlaunch] S3 mirror: {type(exc).__name__}: {exc} (tried again in {self.interval:g} s)",
                      flush=True)

    def __enter__(self) -> Syncing:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def finish(mirror: Mirror, hosts: list[str], trained: bool) -> None:
    """The last mirror, then the first host's output.tar.gz (always) and model.tar.gz (after a training
    that succeeded, with a model), as SageMaker stores them in <output_path>/<job>/output/."""
    count = mirror.sync()
    print(f"[smlaunch] S3: {count} more file(s) mirrored (checkpoints to {mirror.s3['checkpoints']})", flush=True)
    model = mirror.base / "model"
    if mirror.host != hosts[0]:
        if files(model):  # SageMaker merges every host's model/; here each pod sees only its own disk
            print(f"[smlaunch] {model} holds files that are not packed: on Kubernetes model.tar.gz is the "
                  f"first host's ({hosts[0]}) model/ only", flush=True)
        return
    staging = mirror.base.parent / "artifacts"
    staging.mkdir(exist_ok=True)
    archives = {"output.tar.gz": [mirror.base / "output" / "data"]}
    if trained and files(model):
        archives["model.tar.gz"] = [model]
    for name, directories in archives.items():
        uri = s3io.join(mirror.s3["output"], name)
        s3io.upload_file(pack(directories, staging / name), uri, mirror.s3["region"])
        print(f"[smlaunch] {name}: {uri}", flush=True)
