"""Checkpoints through train.py: a stopped and resumed run continues exactly; artifacts are written,
never half: directories training cannot write fail the job before it trains, and a failed export
leaves nothing behind."""

from __future__ import annotations

import json
import os

import pytest
import torch

from container.checkpoint import hf_export as hf
from container.models.llama import build_model
from container.trainer import check_writable
from launcher.wire.training.models import PRESETS
from tests.support.train_runs import run_train, series


def test_resume_continues_exactly(tmp_path):
    common = {"lr_decay_iters": 6, "checkpoint_freq": 3, "train_batch_size": 2}
    straight = run_train(tmp_path / "straight", 2, max_steps=6, **common)
    run_dir = tmp_path / "resumed"
    first = run_train(run_dir, 2, max_steps=3, **common)
    assert (run_dir / "checkpoints" / "step-3").is_dir()
    second = run_train(run_dir, 2, max_steps=6, **common)
    # the resumed run starts at step 4: nothing before it is recomputed
    assert series(second, "step")[-3:] == [4, 5, 6]
    resumed = series(first, "loss") + series(second, "loss")[-3:]
    assert resumed == pytest.approx(series(straight, "loss"), rel=1e-6)


def test_four_process_hybrid_run_writes_artifacts(tmp_path):
    records = run_train(tmp_path, 4, train_batch_size=1, max_steps=8, mp_parameters="hybrid_shard_degree=2",
                        checkpoint_freq=4)
    # four ranks of one host: the host's first says each save once (rank logs of run_train: one file a rank)
    said = [(tmp_path / "rank-logs" / f"rank{r}.log").read_text().count("saved checkpoint") for r in range(4)]
    assert said == [2, 0, 0, 0]
    losses = series(records, "loss")
    assert losses[-1] < losses[0]
    for key in ("loss", "grad_norm", "lr", "tokens_per_s_per_gpu", "tflops_per_gpu",
                "tflops_per_gpu_seed_formula", "samples_per_s", "peak_memory_gib"):
        assert key in records[-1], key
    model_dir = tmp_path / "model"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    assert (model_dir / "model.safetensors").stat().st_size > 0


def test_pretrained_weights_from_a_channel_are_loaded(tmp_path, monkeypatch):
    """Fine-tuning: weights exported by one run, given to the next as a channel, give the same
    first loss as the end of the first run's training (the model continues, not restarts)."""
    first = run_train(tmp_path / "a", 1, max_steps=3)
    channel = tmp_path / "a" / "model"  # HF safetensors + config.json written by the first run
    monkeypatch.setenv("SM_CHANNEL_PRETRAINED", str(channel))
    scratch = run_train(tmp_path / "b", 1, max_steps=1)
    tuned = run_train(tmp_path / "c", 1, max_steps=1, model_preset="", hf_pretrained_model_name_or_dir="pretrained")
    assert series(tuned, "loss")[0] < series(scratch, "loss")[0]
    assert series(tuned, "loss")[0] < series(first, "loss")[0]


def test_an_unwritable_directory_fails_before_training(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where run_train's checkpoint_dir should be")
    with pytest.raises(AssertionError) as failure:  # run_train's report of a failed train.py
        run_train(tmp_path, 1, max_steps=2, checkpoint_freq=1)
    output = str(failure.value)
    assert f"PermissionError: checkpoint_dir {tmp_path / 'checkpoints'} is not writable" in output
    assert "point checkpoint_dir at a directory this job can write" in output
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # not one step was trained


def test_writable_directories_are_created_and_left_clean(tmp_path):
    check_writable({"model_dir": tmp_path / "model", "output_data_dir": tmp_path / "out" / "data"})
    assert [p.name for p in tmp_path.rglob("*")] == ["model", "out", "data"]


def test_hosts_whose_ranks_share_a_pid_probe_a_shared_directory_side_by_side(tmp_path, monkeypatch):
    """Containers of one local job (and hosts on one FSx mount) share model_dir, and their ranks
    have the same pids: one host's probe must not be the file another host deletes. Here the
    other host's rank (this process: the same pid) probes just before this rank deletes its probe."""
    shared = tmp_path / "model"
    real_unlink = os.unlink
    other_host = []

    def other_host_probes_first(path, *args, **kwargs):
        if not other_host:
            other_host.append(path)
            check_writable({"model_dir": shared})
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", other_host_probes_first)
    check_writable({"model_dir": shared})  # a pid-named probe: "model_dir ... is not writable (No such file...)"
    assert other_host and list(shared.iterdir()) == []



def test_a_failed_export_leaves_no_truncated_artifact(tmp_path, monkeypatch):
    spec = PRESETS["llama3-tiny"]
    model = build_model(spec, 16)
    model.init_weights()
    (tmp_path / "README.md").write_text("kept")
    real_save = hf.save_file

    def disk_full(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)
        with open(path, "r+b") as f:
            f.truncate(100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        hf.export_hf(model, spec, tmp_path, dtype=torch.float32, max_shard_bytes=200_000)
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]

    monkeypatch.setattr(hf, "save_file", real_save)
    hf.export_hf(model, spec, tmp_path, dtype=torch.float32)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors"]
