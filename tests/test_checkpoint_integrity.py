"""Checkpoints are verified before resume: a corrupt or partial one is skipped with its reason,
the previous one is used, and when none is usable the job fails with every reason and the fix.

The corruptions are those the issue met and their relatives: garbage inside a shard with its
size unchanged, a shard cut short or missing, a garbage `rng-<rank>.pt`, `.metadata` or
`trainer.pt`, a missing or garbage manifest part or marker, and a checkpoint from before
manifests. The last tests run the issue's case end to end, through `smlaunch submit --local`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest
import torch.distributed as dist
import yaml
from torch.distributed.device_mesh import init_device_mesh

from container.checkpoint import manifest
from container.checkpoint.checkpointer import Checkpointer, CheckpointError
from tests.support.checkpoints import make_model, train_step
from tests.support.gloo import spawn
from tests.support.local_jobs import cli_env, smlaunch
from tests.support.train_runs import ROOT


def _garbage(path: Path, offset: int | None = None, length: int = 4096) -> None:
    """`length` random bytes over the file's content from `offset` (default: its middle), size unchanged."""
    data = bytearray(path.read_bytes())
    length = min(length, len(data))
    start = max(0, len(data) // 2 - length // 2) if offset is None else offset
    data[start:start + length] = os.urandom(length)
    path.write_bytes(bytes(data))


def _two_checkpoints(directory: Path, mesh=None) -> Checkpointer:
    model, optimizer, scheduler = make_model(seed=0, mesh=mesh)
    checkpointer = Checkpointer(directory, keep=2)
    for step in (1, 2):
        train_step(model, optimizer, scheduler, step)
        checkpointer.save(step, model, optimizer, scheduler, {"position": step}, {"tag": step})
    return checkpointer


def _shard(step_dir: Path) -> Path:
    return step_dir / "__0_0.distcp"


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


def _two_ranks_skip_garbage_rng(root: str) -> None:
    """The issue's case on 2 FSDP2 ranks: rng-1.pt of the newest checkpoint is garbage. Both ranks
    must take the previous checkpoint (rank 1 never raises while rank 0 goes on)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    directory = Path(root) / "ckpt"
    _two_checkpoints(directory, mesh=mesh)
    if dist.get_rank() == 0:
        _garbage(directory / "step-2" / "rng-1.pt")
    dist.barrier()
    resumed = Checkpointer(directory, keep=2).load_latest(*make_model(seed=1, mesh=mesh))
    assert resumed == (1, {"position": 1}, {"tag": 1}), resumed


def test_two_ranks_agree_to_skip_a_garbage_rng_file(tmp_path):
    spawn(2, _two_ranks_skip_garbage_rng, str(tmp_path))


# --- end to end: smlaunch submit --local, one host x 2 processes -------------------------------

HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64,
      "train_batch_size": 2, "checkpoint_freq": 2, "logging_freq": 1, "lr": 0.03, "seed": 7}
METRIC = re.compile(r"^\S+ \| \[metrics\] step=(\d+) loss=(\S+)", re.MULTILINE)


def _submit(tmp_path: Path, max_steps: int):
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 1, "processes_per_host": 2, "distribution": {"torch_distributed": {"enabled": True}},
           "base_job_name": "resume", "checkpoint_local_path": str(tmp_path / "ckpt"),
           "hyperparameters": {**HP, "max_steps": max_steps}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    env = cli_env(tmp_path / "home")
    proc = smlaunch("submit", str(tmp_path / "job.yaml"), "--local", env=env, timeout=180)
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    return proc, {int(s): float(loss) for s, loss in METRIC.findall(proc.stdout)}, name, env


def test_resume_skips_a_garbage_rng_file_then_all_corrupt_fails_fast(tmp_path):
    first, losses, _, _ = _submit(tmp_path, max_steps=4)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ckpt = tmp_path / "ckpt"
    _garbage(ckpt / "step-4" / "rng-1.pt")

    second, resumed, _, _ = _submit(tmp_path, max_steps=6)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert re.search(r"checkpoint \S+/step-4 is not usable, trying the one before it: rng-1\.pt does not match",
                     second.stdout)
    assert "resumed from step 2" in second.stdout
    assert sorted(resumed) == [3, 4, 5, 6]
    # from step 2's state, steps 3 and 4 are trained again exactly as the first time
    assert [resumed[3], resumed[4]] == pytest.approx([losses[3], losses[4]], rel=1e-6)

    assert sorted(p.name for p in ckpt.iterdir()) == ["step-4", "step-6"]
    _garbage(_shard(ckpt / "step-6"))
    (ckpt / "step-4" / ".complete").write_text("garbage")
    third, trained, name, env = _submit(tmp_path, max_steps=8)
    assert third.returncode == 1 and trained == {}, third.stdout[-3000:]  # not a step from step 1
    reason = json.loads(smlaunch("status", name, "--json", env=env).stdout)["FailureReason"]
    assert f"CheckpointError: no usable checkpoint in {ckpt} (checkpoint_dir)" in reason, reason
    assert "step-6: __0_0.distcp does not match its sha256" in reason, reason
    assert "step-4: .complete is not valid JSON" in reason, reason
