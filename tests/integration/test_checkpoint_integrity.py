"""Checkpoints are verified before resume: a corrupt or partial one is skipped with its reason,
the previous one is used, and when none is usable the job fails with every reason and the fix.

The corruptions are those the issue met and their relatives: garbage inside a shard with its
size unchanged, a shard cut short or missing, a garbage `rng-<rank>.pt`, `.metadata` or
`trainer.pt`, a missing or garbage manifest part or marker, and a checkpoint from before
manifests. The last tests run the issue's case end to end, through `smlaunch submit --local`.
Here the tests that start processes; the rest are tests/unit/test_checkpoint_integrity.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch.distributed as dist
import yaml
from torch.distributed.device_mesh import init_device_mesh

from container.checkpoint.checkpointer import Checkpointer
from tests.support.checkpoint_integrity import _garbage, _shard, _two_checkpoints
from tests.support.checkpoints import make_model
from tests.support.gloo import spawn
from tests.support.local_jobs import cli_env, smlaunch
from tests.support.train_runs import ROOT


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
    # the load is timed: its time includes the verification that rejected step 4
    assert re.search(r"resumed from step 2 in \S+ \(verified and loaded in \d+\.\d\d s\)", second.stdout)
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


def _two_ranks_marker_names_one_part(root: str) -> None:
    """Issue 31, item 11: `.complete` says parts=1 on a world-2 checkpoint and rank 1's shard is
    cut short; resume must take the previous checkpoint, not crash reading the shard."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    directory = Path(root) / "ckpt"
    _two_checkpoints(directory, mesh=mesh)
    if dist.get_rank() == 0:
        marker = directory / "step-2" / ".complete"
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "parts": 1}))
        shard = directory / "step-2" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
    dist.barrier()
    resumed = Checkpointer(directory, keep=2).load_latest(*make_model(seed=1, mesh=mesh))
    assert resumed == (1, {"position": 1}, {"tag": 1}), resumed


def test_a_marker_naming_too_few_parts_is_not_trusted(tmp_path):
    spawn(2, _two_ranks_marker_names_one_part, str(tmp_path))
