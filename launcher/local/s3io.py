"""S3 for local jobs: the bucket checked before the run; the transfers themselves are
launcher.wire.s3io's (shared with the Kubernetes pods), their errors said as BackendError here."""

from __future__ import annotations

from pathlib import Path

from launcher.backends.base import BackendError
from launcher.wire import s3io


def check_bucket(uri: str, field: str, region: str | None) -> None:
    """Fail before the run if the bucket of `uri` cannot be reached, not after training."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _ = s3io.split(uri)
    try:
        s3io.client(region).head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        problem = "does not exist" if code in ("404", "NoSuchBucket", "NotFound") else f"is not accessible ({code})"
        raise BackendError(f"{field} {uri!r}: bucket {bucket!r} {problem}; create it, fix the URI, "
                           "or use a local directory") from None
    except BotoCoreError as exc:
        raise BackendError(f"{field} {uri!r}: cannot reach S3 ({exc})") from None


def download_prefix(uri: str, dest: Path, region: str | None, shard: tuple[int, int] | None = None,
                    required: bool = True) -> int:
    """launcher.wire.s3io.download_prefix; an empty channel is a BackendError."""
    try:
        return s3io.download_prefix(uri, dest, region, shard, required)
    except s3io.EmptyPrefix as exc:
        raise BackendError(str(exc)) from None
