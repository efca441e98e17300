"""Checkpoints are verified before resume: a corrupt or partial one is skipped with its reason,
the previous one is used, and when none is usable the job fails with every reason and the fix.

The corruptions are those the issue met and their relatives: garbage inside a shard with its
size unchanged, a shard cut short or missing, a garbage `rng-<rank>.pt`, `.metadata` or
`trainer.pt`, a missing or garbage manifest part or marker, and a checkpoint from before
manifests. The last tests run the issue's case end to end, through `smlaunch submit --local`.
Here the tests that run in one process; those that start processes are
tests/integration/test_checkpoint_integrity.py."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from container.checkpoint import manifest
from container.checkpoint.checkpointer import Checkpointer, CheckpointError
from tests.support.checkpoint_integrity import _garbage, _shard, _two_checkpoints
from tests.support.checkpoints import make_model, train_step


def _old_format(step_dir: Path) -> None:
    """A checkpoint as smlaunch wrote them before manifests: the marker alone."""
    for part in step_dir.glob("manifest-*.json"):
        part.unlink()
    (step_dir / ".complete").write_text(json.dumps({"step": 2}) + "\n")


# name -> (corrupt step-2, the reason's telling part)
CORRUPTIONS = {
    "garbage inside a shard": (lambda d: _garbage(_shard(d)), r"__0_0\.distcp does not match its sha256"),
    "truncated shard": (lambda d: _shard(d).write_bytes(_shard(d).read_bytes()[:1000]),
                        r"__0_0\.distcp is 1000 bytes, manifest-0\.json says \d+"),
    "missing shard": (lambda d: _shard(d).unlink(), r"__0_0\.distcp is missing \(manifest-0\.json lists it\)"),
    "garbage rng": (lambda d: _garbage(d / "rng-0.pt"), r"rng-0\.pt does not match its sha256"),
    "garbage .metadata": (lambda d: _garbage(d / ".metadata"), r"\.metadata does not match its sha256"),
    "truncated .metadata": (lambda d: (d / ".metadata").write_bytes((d / ".metadata").read_bytes()[:50]),
                            r"\.metadata is 50 bytes"),
    "garbage trainer.pt": (lambda d: _garbage(d / "trainer.pt", offset=0, length=64),
                           r"trainer\.pt does not match its sha256"),
    "missing manifest": (lambda d: (d / "manifest-0.json").unlink(), r"manifest-0\.json is missing"),
    "garbage manifest": (lambda d: (d / "manifest-0.json").write_text("{not json"),
                         r"manifest-0\.json is not a valid manifest part"),
    "missing marker": (lambda d: (d / ".complete").unlink(), r"no \.complete marker: the save did not finish"),
    "garbage marker": (lambda d: (d / ".complete").write_bytes(os.urandom(40)), r"\.complete is not valid JSON"),
    "older format": (_old_format, r"no manifest \(\.complete names no manifest parts\)"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_checkpoint_is_skipped_for_the_previous_one(tmp_path, caplog, corruption):
    corrupt, reason = CORRUPTIONS[corruption]
    _two_checkpoints(tmp_path)
    corrupt(tmp_path / "step-2")
    with caplog.at_level(logging.INFO):
        resumed = Checkpointer(tmp_path, keep=2).load_latest(*make_model(seed=1))
    assert resumed == (1, {"position": 1}, {"tag": 1})
    skipped = [r.getMessage() for r in caplog.records if "is not usable" in r.getMessage()]
    assert len(skipped) == 1 and str(tmp_path / "step-2") in skipped[0]
    assert re.search(reason, skipped[0]), skipped[0]
    assert (tmp_path / "step-2").is_dir()  # the corrupt one is left where it is, for a look


def test_no_usable_checkpoint_fails_with_every_reason_and_the_fix(tmp_path):
    _two_checkpoints(tmp_path)
    _garbage(_shard(tmp_path / "step-2"))
    (tmp_path / "step-1" / "manifest-0.json").unlink()
    with pytest.raises(CheckpointError) as failure:
        Checkpointer(tmp_path, keep=2).load_latest(*make_model(seed=1))
    message = str(failure.value)
    assert f"no usable checkpoint in {tmp_path} (checkpoint_dir)" in message
    assert re.search(r"step-2: __0_0\.distcp does not match its sha256", message)
    assert "step-1: manifest-0.json is missing" in message
    assert "To start fresh, move or delete them (on SageMaker: under checkpoint_s3_uri) or point " \
           "checkpoint_dir elsewhere." in message


def test_unfinished_saves_are_not_checkpoints(tmp_path, caplog):
    _two_checkpoints(tmp_path / "saved")
    (tmp_path / "saved" / "step-2").rename(tmp_path / "step-3.tmp")
    with caplog.at_level(logging.INFO):
        assert Checkpointer(tmp_path, keep=2).load_latest(*make_model(seed=1)) is None
    assert any("step-3.tmp" in r.getMessage() and "did not finish" in r.getMessage() for r in caplog.records)


def test_a_skipped_step_is_saved_again(tmp_path):
    """Training past a skipped checkpoint's step replaces it (only a verified one is kept as is)."""
    _two_checkpoints(tmp_path)
    _garbage(_shard(tmp_path / "step-2"))
    model, optimizer, scheduler = make_model(seed=1)
    checkpointer = Checkpointer(tmp_path, keep=2)
    assert checkpointer.load_latest(model, optimizer, scheduler)[0] == 1
    train_step(model, optimizer, scheduler, 2)
    checkpointer.save(2, model, optimizer, scheduler, {"position": 2}, {})
    assert Checkpointer(tmp_path, keep=2).load_latest(*make_model(seed=2))[:2] == (2, {"position": 2})


def test_every_file_of_a_checkpoint_is_in_its_manifest(tmp_path):
    _two_checkpoints(tmp_path)
    step = tmp_path / "step-2"
    entries, reason = manifest.inspect(step, 2, required=())
    assert reason is None
    assert sorted(e.name for e in entries) == sorted(
        p.name for p in step.iterdir() if p.name != ".complete" and not p.name.startswith("manifest-"))


def test_hashing_is_spread_over_the_ranks():
    sizes = [900, 500, 400, 300, 300, 200, 100, 100]
    entries = [manifest.Entry(f"f{i}", size, "", "manifest-0.json") for i, size in enumerate(sizes)]
    shares = [manifest.share(entries, rank, 3) for rank in range(3)]
    names = [e.name for share in shares for e in share]
    assert sorted(names) == sorted(e.name for e in entries)  # each file hashed once, by one rank
    loads = [sum(e.size for e in share) for share in shares]
    assert max(loads) <= sum(sizes) / 3 + max(sizes) and min(loads) > 0


# --- end to end: smlaunch submit --local, one host x 2 processes -------------------------------




def test_a_shard_no_manifest_part_lists_is_not_trusted(tmp_path, caplog):
    """Issue 31, item 11, in one process: the parts say nothing of the shard the metadata reads
    (as when `.complete` names fewer parts than ranks saved), and the shard is cut short."""
    _two_checkpoints(tmp_path)
    part = tmp_path / "step-2" / "manifest-0.json"
    listed = json.loads(part.read_text())
    del listed["files"]["__0_0.distcp"]
    part.write_text(json.dumps(listed))
    _shard(tmp_path / "step-2").write_bytes(_shard(tmp_path / "step-2").read_bytes()[:1000])
    with caplog.at_level(logging.INFO):
        resumed = Checkpointer(tmp_path, keep=2).load_latest(*make_model(seed=1))
    assert resumed == (1, {"position": 1}, {"tag": 1})
    assert any("__0_0.distcp, which .metadata reads from, is not listed in any manifest part" in r.getMessage()
               for r in caplog.records)
