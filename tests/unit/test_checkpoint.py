"""DCP checkpoints: exact resume (plain and FSDP2 models), resharding, partial saves, SIGTERM.
Here the tests that run in one process; those that start processes are tests/integration/test_checkpoint.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from dataclasses import replace

import pytest
import torch

from container.checkpoint.checkpointer import Checkpointer, CheckpointError
from container.checkpoint.sigterm import install_sigterm_flag, should_stop
from tests.support.checkpoints import SEQ, SPEC, assert_states_close, full_state, make_model, train_step


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_plain_round_trip_resumes_exactly(tmp_path, tied):
    spec = replace(SPEC, tie_embeddings=tied)
    model, optimizer, scheduler = make_model(seed=0, spec=spec)
    for step in range(3):
        train_step(model, optimizer, scheduler, step)
    checkpointer = Checkpointer(tmp_path, keep=2)
    checkpointer.save(3, model, optimizer, scheduler, {"position": 96}, {"tokens_seen": 96 * SEQ})
    random_after_save = torch.rand(4)
    lr_after_save = scheduler.get_last_lr()
    train_step(model, optimizer, scheduler, 3)
    want = full_state(model)

    model2, optimizer2, scheduler2 = make_model(seed=1, spec=spec)
    resumed = checkpointer.load_latest(model2, optimizer2, scheduler2)
    assert resumed == (3, {"position": 96}, {"tokens_seen": 96 * SEQ})
    assert torch.equal(torch.rand(4), random_after_save)
    assert scheduler2.get_last_lr() == lr_after_save
    train_step(model2, optimizer2, scheduler2, 3)
    assert_states_close(full_state(model2), want, atol=1e-7)


def test_a_checkpoint_with_the_earlier_optimizer_layout_still_resumes(tmp_path, monkeypatch):
    """Checkpoints saved before trainer.pt recorded the optimizer layout hold it unflattened."""
    from container.checkpoint import checkpointer as checkpoint

    model, optimizer, scheduler = make_model(seed=0)
    for step in range(2):
        train_step(model, optimizer, scheduler, step)
    with monkeypatch.context() as patched:
        patched.setattr(checkpoint, "OPTIMIZER_LAYOUT", None)
        Checkpointer(tmp_path, keep=1).save(2, model, optimizer, scheduler, {"position": 8})
    trainer = torch.load(tmp_path / "step-2" / checkpoint.TRAINER_FILE, weights_only=True)
    assert trainer["optimizer_layout"] is None
    train_step(model, optimizer, scheduler, 2)
    want = full_state(model)

    model2, optimizer2, scheduler2 = make_model(seed=1)
    assert Checkpointer(tmp_path, keep=1).load_latest(model2, optimizer2, scheduler2)[0] == 2
    train_step(model2, optimizer2, scheduler2, 2)
    assert_states_close(full_state(model2), want, atol=1e-7)


def test_nothing_to_resume(tmp_path):
    model, optimizer, scheduler = make_model(seed=0)
    checkpointer = Checkpointer(tmp_path / "absent", keep=1)
    assert checkpointer.load_latest(model, optimizer, scheduler) is None


def test_keep_and_partial_checkpoints(tmp_path):
    model, optimizer, scheduler = make_model(seed=0)
    checkpointer = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        train_step(model, optimizer, scheduler, step)
        checkpointer.save(step, model, optimizer, scheduler, {"position": step}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3"]

    # A save killed before the rename; renamed copies without the marker, with their metadata
    # or a shard cut short (as an interrupted S3 sync leaves them).
    shutil.copytree(tmp_path / "step-3", tmp_path / "step-9.tmp")
    for step in (4, 5, 6):
        shutil.copytree(tmp_path / "step-3", tmp_path / f"step-{step}")
        marker = tmp_path / f"step-{step}" / ".complete"
        marker.write_text(marker.read_text().replace('"step": 3', f'"step": {step}'))
    metadata = tmp_path / "step-4" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:50])
    (tmp_path / "step-5" / ".complete").unlink()
    shard = next((tmp_path / "step-6").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    # Marked complete; whether they are whole is found at resume.
    assert checkpointer.complete_steps() == [2, 3, 4, 6]

    fresh = make_model(seed=1)
    assert checkpointer.load_latest(*fresh)[:2] == (3, {"position": 3})

    train_step(model, optimizer, scheduler, 7)
    checkpointer.save(7, model, optimizer, scheduler, {"position": 7}, {})
    # Everything older than the newest two usable ones goes; the later partial save stays.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3", "step-7", "step-9.tmp"]


def streams(tokenizer: dict, vocab_size: int) -> dict:
    """A record of the data read (launcher.wire.checkpoints), as the runtime gives the checkpointer."""
    shard = {"name": "web-00000.idx", "bytes": 2000, "documents": 10, "tokens": 1000}
    return {"dataset_type": "indexed", "shuffled": True,
            "channels": {"train": {"tokenizer": tokenizer, "vocab_size": vocab_size, "shards": [shard]}}}


BYTES = streams({"name": "UTF-8 bytes", "vocabulary_sha256": None}, 256)
BPE = streams({"name": "my-bpe", "vocabulary_sha256": "ab" * 32}, 300)


def test_the_data_a_checkpoint_was_trained_on_is_recorded_and_another_tokenizer_refused_before_loading(tmp_path):
    model, optimizer, scheduler = make_model(seed=0)
    path = Checkpointer(tmp_path, keep=1, streams=BYTES).save(1, model, optimizer, scheduler, {"position": 8})
    assert json.loads((path / "data-streams.json").read_text()) == BYTES
    assert "data-streams.json" in json.loads((path / "manifest-0.json").read_text())["files"]  # verified at resume

    fresh = make_model(seed=1)
    before = full_state(fresh[0])
    with pytest.raises(CheckpointError, match=r"cannot continue checkpoint \S*step-1 \(checkpoint_dir\) on this data:\n"
                                              r"  channel train was packed with UTF-8 bytes \(vocab_size 256\) when"):
        Checkpointer(tmp_path, keep=1, streams=BPE).load_latest(*fresh)
    assert_states_close(full_state(fresh[0]), before, atol=0)  # refused before anything was loaded
    # the control: the same data resumes
    assert Checkpointer(tmp_path, keep=1, streams=BYTES).load_latest(*fresh)[:2] == (1, {"position": 8})


def test_a_checkpoint_saved_before_the_data_was_recorded_resumes_with_a_note(tmp_path, caplog):
    model, optimizer, scheduler = make_model(seed=0)
    path = Checkpointer(tmp_path, keep=1).save(1, model, optimizer, scheduler, {"position": 8})  # as before
    assert not (path / "data-streams.json").exists()
    with caplog.at_level(logging.INFO, logger="container.checkpoint.checkpointer"):
        resumed = Checkpointer(tmp_path, keep=1, streams=BPE).load_latest(*make_model(seed=1))
    assert resumed[:2] == (1, {"position": 8})
    assert f"checkpoint {path} does not record its data (saved by an earlier smlaunch)" in caplog.text


def test_resaving_a_complete_step_keeps_it(tmp_path):
    model, optimizer, scheduler = make_model(seed=0)
    checkpointer = Checkpointer(tmp_path, keep=1)
    path = checkpointer.save(1, model, optimizer, scheduler, {}, {})
    stamp = (path / ".complete").stat().st_mtime_ns
    assert checkpointer.save(1, model, optimizer, scheduler, {}, {}) == path
    assert (path / ".complete").stat().st_mtime_ns == stamp


def test_fsdp_two_ranks_resume_exactly(two_rank_checkpoint):
    assert Checkpointer(two_rank_checkpoint / "ckpt", keep=2).complete_steps() == [3]
    assert sorted(p.name for p in (two_rank_checkpoint / "ckpt" / "step-3").glob("rng-*.pt")) == [
        "rng-0.pt", "rng-1.pt"]


def test_fsdp_checkpoint_reshards_to_one_process(two_rank_checkpoint):
    reference = torch.load(two_rank_checkpoint / "reference.pt")
    model, optimizer, scheduler = make_model(seed=1)
    checkpointer = Checkpointer(two_rank_checkpoint / "ckpt", keep=2)
    assert checkpointer.load_latest(model, optimizer, scheduler)[0] == 3
    assert_states_close(full_state(model), reference["saved"], atol=0)
    train_step(model, optimizer, scheduler, 3)
    assert_states_close(full_state(model), reference["after"], atol=1e-6)


def test_sigterm_sets_the_flag():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        flag = install_sigterm_flag()
        assert not should_stop(flag)
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.requested and should_stop(flag)
    finally:
        signal.signal(signal.SIGTERM, previous)


