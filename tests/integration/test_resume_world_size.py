"""Resume at another world size, through train.py: a checkpoint saved at world 4 (hybrid_shard_degree
2 x context_parallel_degree 2) continues at world 2 (tensor parallel, gradient accumulation) and at
world 8 (hybrid_shard_degree 4 x cp 2) with the losses and gradient norms of an uninterrupted run:
the data position, optimizer moments and learning-rate schedule carry over. A run whose global
batch differs is refused before it loads anything; a checkpoint written before checkpoints
recorded what a resume must keep still resumes.

Every layout trains like one process (test_train_parity.py), so the uninterrupted reference is one
process. The global batch is 4 sequences everywhere: train_batch_size is one data-parallel rank's.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from container.checkpoint import manifest
from container.checkpoint.checkpointer import TRAINER_FILE
from tests.support.train_runs import run_train, series

STEPS, SAVED_AT = 8, 4
COMMON = {"lr_decay_iters": STEPS, "checkpoint_freq": SAVED_AT}
REL = 1e-5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_train(tmp_path_factory.mktemp("ref"), 1, max_steps=STEPS, train_batch_size=4, **COMMON)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, reference):
    """World 4: dp_replicate 2 x cp 2, two sequences per data-parallel rank; stops at step 4."""
    path = tmp_path_factory.mktemp("world4")
    records = run_train(path, 4, max_steps=SAVED_AT, train_batch_size=2,
                        mp_parameters="hybrid_shard_degree=2,context_parallel_degree=2", **COMMON)
    assert series(records, "loss") == pytest.approx(series(reference, "loss")[:SAVED_AT], rel=REL)
    return path / "checkpoints"


def resume(checkpoints, run_dir, nproc, **settings) -> list[dict]:
    """Continue a copy of `checkpoints` to step STEPS in `run_dir` on `nproc` processes."""
    shutil.copytree(checkpoints, run_dir / "checkpoints")
    return run_train(run_dir, nproc, max_steps=STEPS, **COMMON, **settings)


def assert_continues(records, reference):
    assert series(records, "step") == list(range(SAVED_AT + 1, STEPS + 1))  # nothing recomputed
    for key in ("loss", "grad_norm", "lr"):
        ours, ref = series(records, key), series(reference, key)[SAVED_AT:]
        assert ours == pytest.approx(ref, rel=REL), f"{key}: {ours} != {ref}"


def test_checkpoint_records_what_a_resume_must_keep(saved):
    keeps = torch.load(saved / f"step-{SAVED_AT}" / TRAINER_FILE, weights_only=True)["keeps"]
    assert (keeps["global_batch"], keeps["sequence_length"], keeps["optimizer"]) == (4, 64, "adamw")
    assert keeps["data_stream"] == "synthetic, seed 7" and keeps["model"]["num_layers"] == 2


def test_resumes_at_world_2_with_tensor_parallelism(tmp_path, saved, reference):
    # tp 2: one data-parallel rank, so 2 sequences x 2 accumulation steps keep the global batch of 4
    records = resume(saved, tmp_path, 2, train_batch_size=2, gradient_accumulation_steps=2,
                     mp_parameters="tensor_parallel_degree=2")
    assert_continues(records, reference)


def test_resumes_at_world_8(tmp_path, saved, reference):
    # dp_replicate 2 x dp_shard 2 x cp 2: FSDP shards over 4 ranks, not 2; 4 data-parallel ranks
    records = resume(saved, tmp_path, 8, train_batch_size=1,
                     mp_parameters="hybrid_shard_degree=4,context_parallel_degree=2")
    assert_continues(records, reference)


def test_refuses_another_global_batch(tmp_path, saved):
    with pytest.raises(AssertionError) as failure:  # run_train's report of a failed train.py
        resume(saved, tmp_path, 1, train_batch_size=2)
    output = str(failure.value)
    assert "CheckpointError: this run cannot continue checkpoint" in output
    assert ("global batch in sequences per step was 4 when saved, now 2 = train_batch_size 2 x "
            "data-parallel degree 1 x gradient_accumulation_steps 1; set train_batch_size x "
            "gradient_accumulation_steps = 4") in output
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # not one step was trained
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [f"step-{SAVED_AT}"]


def test_a_checkpoint_without_the_record_still_resumes(tmp_path, saved, reference):
    """Checkpoints written before trainer.pt held `keeps`: rewritten as such (manifest included,
    so it verifies), then resumed on one process."""
    shutil.copytree(saved, tmp_path / "old")
    step = tmp_path / "old" / f"step-{SAVED_AT}"
    trainer = torch.load(step / TRAINER_FILE, weights_only=True)
    del trainer["keeps"]
    torch.save(trainer, step / TRAINER_FILE)
    names = list(json.loads((step / manifest.part_name(0)).read_text())["files"])
    manifest.write_part(step, 0, names)
    assert_continues(resume(tmp_path / "old", tmp_path / "run", 1, train_batch_size=4), reference)
