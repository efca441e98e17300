"""S3 for local jobs: channels in, artifacts and checkpoints out (boto3, imported on first use).

boto3 honours AWS_ENDPOINT_URL (and AWS_ENDPOINT_URL_S3) itself, so the same code reaches
AWS, a MinIO, or a moto server in the tests.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from launcher.backends.base import BackendError


def split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _client(region: str | None):
    import boto3

    return boto3.client("s3", region_name=region or None)


def check_bucket(uri: str, field: str, region: str | None) -> None:
    """Fail before the run if the bucket of `uri` cannot be reached, not after training."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _ = split(uri)
    try:
        _client(region).head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        problem = "does not exist" if code in ("404", "NoSuchBucket", "NotFound") else f"is not accessible ({code})"
        raise BackendError(f"{field} {uri!r}: bucket {bucket!r} {problem}; create it, fix the URI, "
                           "or use a local directory") from None
    except BotoCoreError as exc:
        raise BackendError(f"{field} {uri!r}: cannot reach S3 ({exc})") from None


def download_prefix(uri: str, dest: Path, region: str | None, shard: tuple[int, int] | None = None,
                    required: bool = True) -> int:
    """Download every object under the prefix into `dest`, keeping paths below the prefix.

    `shard=(i, n)` keeps every n-th object from the i-th (ShardedByS3Key). An empty prefix is an
    error when `required` (a channel), and nothing to do otherwise (checkpoints of a first run).
    """
    bucket, prefix = split(uri)
    client = _client(region)
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    if not keys and not required:
        return 0
    if not keys:
        raise BackendError(f"channel {uri!r} holds no objects: upload the data or fix the prefix")
    keys.sort()
    if shard is not None:
        keys = keys[shard[0]::shard[1]]
    dest.mkdir(parents=True, exist_ok=True)
    for key in keys:
        relative = key[len(prefix):].lstrip("/") or PurePosixPath(key).name
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target))
    return len(keys)


def upload_file(path: Path, uri: str, region: str | None) -> None:
    bucket, key = split(uri)
    _client(region).upload_file(str(path), bucket, key)


def upload_tree(root: Path, uri: str, region: str | None) -> int:
    """Upload every file under `root` below the prefix `uri` (checkpoints). Returns the count."""
    bucket, prefix = split(uri.rstrip("/"))
    client = _client(region)
    count = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = "/".join(x for x in (prefix, path.relative_to(root).as_posix()) if x)
        client.upload_file(str(path), bucket, key)
        count += 1
    return count
