"""Asynchronous checkpoints (checkpoint_async_mode) in one process: the save returns once the state
is staged, training may change it meanwhile, one save is in flight at a time, a failed background
write stops the job and leaves the previous checkpoint usable; and validation of the mode.
Through train.py on gloo ranks: tests/integration/test_async_checkpoint.py."""

from __future__ import annotations

import contextlib
import errno
import os
import threading

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystem

from container.checkpoint import checkpointer as ckpt
from container.checkpoint.background import BackgroundSaves, CheckpointWriteError
from container.checkpoint.checkpointer import Checkpointer
from tests.support.checkpoints import assert_states_close, full_state, make_model, train_step
from tests.support.config_checks import issues_of, only_issue, paths
from tests.unit.test_config_rules import make_job

FIELD = "hyperparameters.checkpoint_async_mode"


@pytest.fixture
def held_writes(monkeypatch):
    """DCP's background writes wait until the test sets the returned event."""
    release = threading.Event()
    real = ckpt._RecordingWriter.write_data

    def held(self, plan, planner):
        assert release.wait(30), "the test never released the write"
        return real(self, plan, planner)

    monkeypatch.setattr(ckpt._RecordingWriter, "write_data", held)
    return release


def _trained(steps: int):
    model, optimizer, scheduler = make_model(seed=0)
    for step in range(steps):
        train_step(model, optimizer, scheduler, step)
    return model, optimizer, scheduler


def _resumed(directory, want_step: int) -> dict:
    model, optimizer, scheduler = make_model(seed=1)
    assert Checkpointer(directory, keep=2).load_latest(model, optimizer, scheduler)[0] == want_step
    return full_state(model)


def test_the_save_returns_staged_and_training_changes_nothing_saved(tmp_path, held_writes):
    model, optimizer, scheduler = _trained(2)
    saved = full_state(model)
    checkpointer = Checkpointer(tmp_path, keep=2, async_mode="async")
    checkpointer.save(2, model, optimizer, scheduler, {"position": 2})
    assert not (tmp_path / "step-2").exists()  # returned while the write waits: nothing committed yet
    train_step(model, optimizer, scheduler, 2)  # the parameters change in place while the save is in flight
    assert not torch.equal(full_state(model)["output.weight"], saved["output.weight"])
    held_writes.set()
    checkpointer.close()
    assert (tmp_path / "step-2" / ".complete").is_file()
    assert_states_close(_resumed(tmp_path, 2), saved, atol=0)  # the state of step 2, not of step 3


def test_one_save_in_flight_the_next_waits_for_it(tmp_path, held_writes):
    model, optimizer, scheduler = _trained(1)
    checkpointer = Checkpointer(tmp_path, keep=2, async_mode="async")
    checkpointer.save(1, model, optimizer, scheduler, {})
    train_step(model, optimizer, scheduler, 1)
    second = threading.Thread(target=checkpointer.save, args=(2, model, optimizer, scheduler, {}))
    second.start()
    second.join(0.5)
    assert second.is_alive() and not (tmp_path / "step-2.tmp").exists()  # waiting: step 2 not begun
    held_writes.set()
    second.join(30)
    checkpointer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1", "step-2"]
    assert all((tmp_path / name / ".complete").is_file() for name in ("step-1", "step-2"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: pinned (page-locked) staging")
def test_pinned_staging_on_a_gpu_saves_the_state_of_its_step(tmp_path, held_writes):
    """async_with_pinned_mem: the GPU state is copied into page-locked host buffers before save()
    returns, so the step after it, on the GPU, changes nothing saved; a second save reuses the
    buffers (DefaultStager keeps them) and is again the state of its own step."""
    model, optimizer, scheduler = make_model(seed=0)
    model.cuda()  # in place: the optimizer keeps the same parameters
    for step in range(2):
        train_step(model, optimizer, scheduler, step)
    saved = {k: v.cpu() for k, v in full_state(model).items()}
    checkpointer = Checkpointer(tmp_path, keep=2, async_mode="async_with_pinned_mem")
    checkpointer.save(2, model, optimizer, scheduler, {})
    train_step(model, optimizer, scheduler, 2)  # on the GPU, while the write is held
    held_writes.set()
    checkpointer.wait()
    assert_states_close(_resumed(tmp_path, 2), saved, atol=0)
    checkpointer.save(3, model, optimizer, scheduler, {})  # the same pinned buffers, now step 3's state
    third = {k: v.cpu() for k, v in full_state(model).items()}
    train_step(model, optimizer, scheduler, 3)
    checkpointer.close()
    assert_states_close(_resumed(tmp_path, 3), third, atol=0)


def test_a_failed_background_write_stops_the_job_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, optimizer, scheduler = _trained(1)
    checkpointer = Checkpointer(tmp_path, keep=1, async_mode="async")
    checkpointer.save(1, model, optimizer, scheduler, {})
    checkpointer.wait()
    saved = full_state(model)
    train_step(model, optimizer, scheduler, 1)

    def disk_full(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt._RecordingWriter, "write_data", disk_full)
    checkpointer.save(2, model, optimizer, scheduler, {})  # returns: the failure is in the background
    with pytest.raises(CheckpointWriteError) as failure:
        checkpointer.close()  # as at the next save, SIGTERM or the end of training
    message = str(failure.value)
    assert "step-2" in message and "No space left on device" in message
    assert f"newest complete: {tmp_path / 'step-1'}" in message and "Free space in checkpoint_dir" in message
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"]  # the failed save's .tmp is removed
    assert_states_close(_resumed(tmp_path, 1), saved, atol=0)


def test_a_synchronous_save_that_fails_says_the_same(tmp_path, monkeypatch):
    """Control: the synchronous path commits with the same protocol and fails alike."""
    model, optimizer, scheduler = _trained(1)
    checkpointer = Checkpointer(tmp_path, keep=1)
    checkpointer.save(1, model, optimizer, scheduler, {})
    monkeypatch.setattr(ckpt.manifest, "write_part", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(CheckpointWriteError, match="step-2.*full"):
        checkpointer.save(2, model, optimizer, scheduler, {})
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"]


class _FullDisk:
    """A file on a disk that has room for small writes, not for a tensor's data: that write raises
    ENOSPC, as a full disk's does, inside torch's zip writer (which then fails on its own)."""

    ROOM = 4096  # bytes: more than DCP's pickled non-tensor items (1.3 KB) and torch.save's headers need, less
    # than the data of any tensor of the test's model (8 KiB and more)

    def __init__(self, stream):
        self._stream = stream

    def write(self, data):
        if memoryview(data).nbytes > self.ROOM:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._stream.write(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@pytest.mark.parametrize("mode", ["async", "disabled"])
def test_a_full_disk_under_torchs_writer_is_named_by_its_cause_and_file(tmp_path, monkeypatch, mode):
    """torch.save into a file whose write fails with ENOSPC raises `RuntimeError: ... unexpected pos
    704 vs 598` (the OSError only its __context__), and that was the save's reason on the rank whose
    shard torch was writing. The reason is now the cause and the file, in both modes."""
    model, optimizer, scheduler = _trained(1)
    checkpointer = Checkpointer(tmp_path, keep=1, async_mode=mode)
    checkpointer.save(1, model, optimizer, scheduler, {})  # the control: the same save on a disk with room
    checkpointer.wait()
    real = FileSystem.create_stream

    @contextlib.contextmanager
    def full_disk(self, path, open_mode):
        with real(self, path, open_mode) as stream:
            yield _FullDisk(stream) if "step-2.tmp" in str(path) and str(path).endswith(".distcp") else stream

    monkeypatch.setattr(FileSystem, "create_stream", full_disk)
    with pytest.raises(CheckpointWriteError) as failure:
        checkpointer.save(2, model, optimizer, scheduler, {})
        checkpointer.close()
    message = str(failure.value)
    assert f"rank 0: No space left on device (ENOSPC) writing {tmp_path / 'step-2.tmp' / '__0_0.distcp'}." \
        in message, message
    assert "unexpected pos" not in message and f"newest complete: {tmp_path / 'step-1'}" in message
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: pinned staging is possible")
def test_pinned_staging_without_cuda_is_an_error_not_a_downgrade():
    with pytest.raises(ValueError, match="async_with_pinned_mem .*no CUDA device; use checkpoint_async_mode: async"):
        BackgroundSaves("async_with_pinned_mem", distributed=False)


def test_validation_of_the_mode(runtime_dir, user_script_dir):
    ok = {"checkpoint_freq": 100, "checkpoint_async_mode": "async_with_pinned_mem"}
    assert paths(make_job(runtime_dir, hp=ok)) == []
    cpu = make_job(runtime_dir, instance_type="ml.c5.18xlarge", processes_per_host=1, hp=ok,
                   params={"hybrid_shard_degree": 1})
    assert "ml.c5.18xlarge has no GPU" in only_issue(cpu, FIELD)[0].problem
    local = make_job(runtime_dir, instance_type="local", processes_per_host=2, hp=ok, params={"hybrid_shard_degree": 2})
    assert only_issue(local, FIELD)
    local["hyperparameters"]["checkpoint_async_mode"] = "async"
    assert paths(local) == []
    no_freq = make_job(runtime_dir, hp={"checkpoint_async_mode": "async"})
    assert "checkpoint_freq is unset" in only_issue(no_freq, FIELD)[0].problem
    assert paths(make_job(runtime_dir, hp={"checkpoint_async_mode": "disabled"})) == []
    typo = [str(i) for i in issues_of(make_job(runtime_dir, hp={**ok, "checkpoint_async_mode": "pinned"}))]
    assert any(FIELD in i and "async_with_pinned_mem" in i for i in typo), typo
    # a script of the user's own means what it likes by the key
    assert FIELD not in paths(make_job(user_script_dir, hp={"checkpoint_async_mode": "async"},
                                       image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1"))
