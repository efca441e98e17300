"""S3 transfers a job's data takes on both sides of the wire: a prefix down (channels, checkpoints),
files and trees up (artifacts, checkpoints, records). Local jobs use them on this machine
(launcher.local); Kubernetes pods in the container (container.toolkit.pod_storage).

boto3 is imported on first use (the container imports no boto3 at import time), and honours
AWS_ENDPOINT_URL (and AWS_ENDPOINT_URL_S3) itself, so the same code reaches AWS, a MinIO, or a moto
server in the tests. Credentials come from boto3's default chain: on Kubernetes, the pod's service
account (IRSA or EKS Pod Identity), never the job's manifest.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class EmptyPrefix(LookupError):
    """A channel's prefix holds no object."""


def split(uri: str) -> tuple[str, str]:
    """(bucket, key) of `s3://bucket/key`: the key as written, a prefix's trailing slash kept. The one
    split of an S3 URI on both sides of the wire (the launcher's backends, the bootstrap's code download)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def join(uri: str, *parts: str) -> str:
    """`uri`/part/..., one slash between each."""
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def client(region: str | None):
    import boto3

    return boto3.client("s3", region_name=region or None)


def list_keys(uri: str, region: str | None) -> list[str]:
    """Every object key under the prefix (folder markers left out), sorted."""
    bucket, prefix = split(uri)
    keys = []
    for page in client(region).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return sorted(keys)


def download_prefix(uri: str, dest: Path, region: str | None, shard: tuple[int, int] | None = None,
                    required: bool = True) -> int:
    """Download every object under the prefix into `dest`, keeping paths below the prefix.

    `shard=(i, n)` keeps every n-th object from the i-th (ShardedByS3Key). An empty prefix is an
    error (EmptyPrefix) when `required` (a channel), and nothing to do otherwise (checkpoints of a
    first run).
    """
    bucket, prefix = split(uri)
    keys = list_keys(uri, region)
    if not keys and not required:
        return 0
    if not keys:
        raise EmptyPrefix(f"channel {uri!r} holds no objects: upload the data or fix the prefix")
    if shard is not None:
        keys = keys[shard[0]::shard[1]]
    dest.mkdir(parents=True, exist_ok=True)
    s3 = client(region)
    for key in keys:
        relative = key[len(prefix):].lstrip("/") or PurePosixPath(key).name
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
    return len(keys)


def upload_file(path: Path, uri: str, region: str | None) -> None:
    """The file as it was when opened: one version of it, whole, however it changes meanwhile.
    Given a file name, boto3 took its size first and read it later, and a pod's mirror uploads
    records rank 0 rewrites every step: progress.json, replaced by a shorter one in between, sent
    fewer bytes than announced, and the upload waited for the rest until boto3's read timeout,
    three times (the mirror silent for three minutes); a longer one was cut to the old size (JSON
    that does not parse). An open file keeps its version (a replaced file's old inode; an appended
    one is read to where its end is then), and boto3 reads and retries from it alone."""
    bucket, key = split(uri)
    with open(path, "rb") as f:
        client(region).upload_fileobj(f, bucket, key)


def delete_keys(uris: list[str], region: str | None) -> None:
    """Delete these objects (a missing one is no error, as S3's DeleteObjects has it)."""
    s3 = client(region)
    by_bucket: dict[str, list[str]] = {}
    for uri in uris:
        bucket, key = split(uri)
        by_bucket.setdefault(bucket, []).append(key)
    for bucket, keys in by_bucket.items():
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1,000 keys at most
            answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]],
                                                              "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise OSError(f"S3 refused to delete s3://{bucket}/{first['Key']}: {first.get('Code')} "
                              f"{first.get('Message', '')}".rstrip())


def upload_tree(root: Path, uri: str, region: str | None) -> int:
    """Upload every file under `root` below the prefix `uri` (checkpoints). Returns the count."""
    bucket, prefix = split(uri.rstrip("/"))
    s3 = client(region)
    count = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = "/".join(x for x in (prefix, path.relative_to(root).as_posix()) if x)
        s3.upload_file(str(path), bucket, key)
        count += 1
    return count
