"""Asynchronous checkpoints through train.py on gloo ranks: a run resumed from a checkpoint written
in the background continues exactly as one resumed from a synchronous checkpoint and as the run
that was never stopped, on the same and on another number of ranks; a disk that fills up during a
background write fails the job with the reason and leaves the previous checkpoint usable."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from launcher.wire.checkpoints import complete_steps
from tests.support.close import order_tolerance
from tests.support.train_runs import run_train, series

# 6 steps, a decay over all of them; checkpoints at 2 and 4: the save of step 2 is written while
# steps 3 and 4 train (the one of step 4 at the end of the run, which waits for it).
COMMON = {"lr_decay_iters": 6, "checkpoint_freq": 2, "train_batch_size": 2}  # 2 ranks x 2 = global batch 4
ONE_RANK = {**COMMON, "train_batch_size": 4}


def _first_half(tmp_path, mode: str):
    run = tmp_path / mode
    first = run_train(run, 2, max_steps=4, checkpoint_async_mode=mode, **COMMON)
    assert complete_steps(run / "checkpoints") == [2, 4]
    # the same checkpoints resumed by one rank, from step 2: the one written while training went on
    shutil.copytree(run / "checkpoints", tmp_path / f"{mode}-1rank" / "checkpoints")
    shutil.rmtree(tmp_path / f"{mode}-1rank" / "checkpoints" / "step-4")
    return first


def test_resume_from_an_async_checkpoint_is_exact_on_the_same_and_another_world_size(tmp_path):
    straight = run_train(tmp_path / "straight", 2, max_steps=6, **COMMON)
    resumed, one_rank = {}, {}
    for mode in ("disabled", "async"):
        first = _first_half(tmp_path, mode)
        second = run_train(tmp_path / mode, 2, max_steps=6, checkpoint_async_mode=mode, **COMMON)
        assert series(second, "step")[-2:] == [5, 6]  # metrics.jsonl holds both runs' records
        resumed[mode] = series(first, "loss") + series(second, "loss")[-2:]
        one_rank[mode] = series(run_train(tmp_path / f"{mode}-1rank", 1, max_steps=6, **ONE_RANK), "loss")
        assert len(one_rank[mode]) == 4  # steps 3 to 6
    # async and sync checkpoints hold the same state: the resumed runs are the same bit for bit
    assert resumed["async"] == resumed["disabled"]
    assert one_rank["async"] == one_rank["disabled"]
    # ... and the run never stopped: the same ranks add in the same order (fp32, <= 1e-6 asked);
    assert resumed["async"] == pytest.approx(series(straight, "loss"), rel=1e-6)
    # one rank sums the global batch's tokens (4 x 64) in another order than two
    tolerance = max(1e-6, order_tolerance(4 * 64))
    assert one_rank["async"] == pytest.approx(series(straight, "loss")[2:], rel=tolerance)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 3 MiB as the checkpoint directory: one checkpoint of the tiny model (about 2.2 MiB)
    fits, a second beside it does not. Needs root (mount)."""
    where = tmp_path / "disk" / "checkpoints"
    where.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_during_a_background_write_fails_the_job_and_keeps_the_previous_checkpoint(
        tmp_path, small_disk):
    run = small_disk.parent
    with pytest.raises(AssertionError) as failure:  # run_train's report of a failed train.py
        run_train(run, 2, max_steps=6, checkpoint_async_mode="async", num_kept_checkpoints=1, **COMMON)
    output = str(failure.value)
    # every rank says the same: which rank's file could not be written, and why (not how torch's
    # writer of that rank reported it, e.g. `unexpected pos 704 vs 598`)
    errors = re.findall(r"^\S*CheckpointWriteError: (.*)$", output, re.MULTILINE)
    assert len(errors) == 2 and errors[0] == errors[1], output
    assert errors[0].startswith(f"checkpoint {small_disk / 'step-4'} (checkpoint_dir) could not be written: rank ")
    failed_file = rf"{re.escape(str(small_disk))}/step-4\.tmp/\S+"
    assert re.search(rf"rank [01]: No space left on device \(ENOSPC\) writing {failed_file}", errors[0]), errors[0]
    assert f"newest complete: {small_disk / 'step-2'}" in errors[0]
    assert [p.name for p in small_disk.iterdir()] == ["step-2"]
    trained = [json.loads(line)["step"] for line in (run / "out" / "metrics.jsonl").read_text().splitlines()]
    # step 4's save failed in the background while steps 5 and 6 trained; the save of step 6 waited
    # for it first and stopped the job: no step-6 over a failed step 4, no model exported
    assert trained == [1, 2, 3, 4, 5, 6] and not (run / "model" / "model.safetensors").exists()
    # the previous checkpoint resumes (on a disk with room)
    shutil.copytree(small_disk, tmp_path / "again" / "checkpoints")
    again = run_train(tmp_path / "again", 2, max_steps=6, checkpoint_async_mode="async", **COMMON)
    assert series(again, "step") == [3, 4, 5, 6]
