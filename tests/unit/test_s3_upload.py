"""launcher.wire.s3io.upload_file against moto (in-process): what a pod's mirror uploads is one whole
version of a file rank 0 replaces every step (progress.json), not a mix of two."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("moto")

OLD = '{"step": 9}\n'
NEW = '{"step": 10, "updated": "2026-11-30T01:00:00+00:00"}\n'  # longer, as later records are


def _replace(path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)  # as launcher.wire.metric_lines.write_progress does


def _body(s3, key: str) -> str:
    return s3.get_object(Bucket="records", Key=key)["Body"].read().decode()


def test_an_upload_sends_the_file_as_it_was_when_opened_while_it_is_replaced(aws, tmp_path, monkeypatch):
    from s3transfer.utils import OSUtils

    from launcher.wire import s3io

    s3 = aws.client("s3")
    s3.create_bucket(Bucket="records")
    path = tmp_path / "progress.json"

    # the control: boto3 given the file's name takes its size, then reads it after rank 0 replaced it
    path.write_text(OLD)
    size_of = OSUtils.get_file_size

    def size_then_replaced(self, filename):
        size = size_of(self, filename)
        _replace(path, NEW)
        return size

    monkeypatch.setattr(OSUtils, "get_file_size", size_then_replaced)
    s3.upload_file(str(path), "records", "control")
    assert _body(s3, "control") == NEW[:len(OLD)]  # neither version: JSON cut short
    monkeypatch.setattr(OSUtils, "get_file_size", size_of)

    # ours: the file is replaced once the upload has it open, and the old version goes up whole
    path.write_text(OLD)
    real_client = s3io.client

    class ReplacedMidUpload:
        def __init__(self, region):
            self.inner = real_client(region)

        def upload_fileobj(self, fileobj, bucket, key):
            _replace(path, NEW)
            return self.inner.upload_fileobj(fileobj, bucket, key)

        def upload_file(self, filename, bucket, key):  # an upload by name reads what is there then
            _replace(path, NEW)
            return self.inner.upload_file(filename, bucket, key)

    monkeypatch.setattr(s3io, "client", ReplacedMidUpload)
    s3io.upload_file(path, "s3://records/ours", "us-east-1")
    assert _body(s3, "ours") == OLD
    assert path.read_text() == NEW  # it was replaced during the upload
