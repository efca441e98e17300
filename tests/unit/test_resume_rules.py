"""What a resume may change and what it must keep (launcher/wire/training/resume.py): the runtime's check
of a checkpoint's record, and the note validation gives a job that resumes from checkpoints
(`smlaunch validate`, the estimator). Resuming itself, through train.py: test_resume_world_size.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.config import TrainingHyperparameters, validate_job
from launcher.wire.training.models import PRESETS
from launcher.wire.training.resume import RunIdentity
from launcher.wire.training.run_settings import run_settings

ROOT = Path(__file__).resolve().parents[2]
URI = "s3://my-bucket/llama/checkpoints/"
ALLOWED = ("instance_count", "processes_per_host", "hybrid_shard_degree", "context_parallel_degree",
           "tensor_parallel_degree", "pipeline_parallel_degree", "expert_parallel_degree")


def identity(data_parallel=2, **hp) -> RunIdentity:
    settings = run_settings(TrainingHyperparameters(**{"max_context_width": 64, "train_batch_size": 2,
                                                       "dataset_type": "synthetic", "seed": 7, **hp}), None, 1)
    return RunIdentity(settings, PRESETS["llama3-tiny"], data_parallel)


SAVED = identity().record()  # global batch 4 = 2 per data-parallel rank x 2 ranks


def test_the_same_run_at_another_data_parallel_degree_continues():
    assert identity(data_parallel=4, train_batch_size=1).conflicts(SAVED) == []
    assert identity(data_parallel=1, train_batch_size=2, gradient_accumulation_steps=2).conflicts(SAVED) == []


def test_another_global_batch_is_refused_with_the_settings_that_keep_it():
    [line] = identity(data_parallel=4).conflicts(SAVED)
    assert line == ("global batch in sequences per step was 4 when saved, now 8 = train_batch_size 2 x "
                    "data-parallel degree 4 x gradient_accumulation_steps 1; set train_batch_size x "
                    "gradient_accumulation_steps = 1 (e.g. train_batch_size 1, gradient_accumulation_steps 1)")
    [line] = identity(data_parallel=3, train_batch_size=1).conflicts(SAVED)
    assert line.endswith("4 sequences do not split over 3 data-parallel ranks: use a data-parallel degree "
                         "that divides 4")


@pytest.mark.parametrize("change,expected", [
    ({"max_context_width": 128}, ("sequence length (max_context_width) was 64 when saved, now 128; "
                                  "set max_context_width back to 64")),
    ({"seed": 8}, ("data stream (dataset_type, seed, shuffle, data_mixture and truncation_mode) was synthetic, "
                   "seed 7 when saved, now synthetic, seed 8; set dataset_type, seed, shuffle, data_mixture and "
                   "truncation_mode back to synthetic, seed 7")),
    ({"optimizer": "anyprecision"}, "optimizer was adamw when saved, now anyprecision; set optimizer back to adamw"),
])
def test_what_a_resume_must_keep_is_refused_when_changed(change, expected):
    assert identity(**change).conflicts(SAVED) == [expected]


def test_a_jsonl_runs_seed_may_change():
    saved = identity(dataset_type="jsonl").record()
    assert identity(dataset_type="jsonl", seed=8).conflicts(saved) == []


def test_indexed_shards_keep_their_shuffle_and_mixture():
    """Shuffled indexed shards: the seed orders them, so it is kept; read in order, it may change;
    another mixture is another stream (its weights normalised: 7:3 is 0.7:0.3)."""
    mixed = {"dataset_type": "indexed", "data_mixture": "web:0.7,code:0.3"}
    saved = identity(**mixed).record()
    assert saved["data_stream"] == "indexed, shuffled with seed 7, mixture web:0.7,code:0.3"
    assert identity(dataset_type="indexed", data_mixture="web:7,code:3").conflicts(saved) == []
    [reseeded] = identity(**mixed, seed=8).conflicts(saved)
    assert "now indexed, shuffled with seed 8, mixture web:0.7,code:0.3" in reseeded
    [reweighted] = identity(dataset_type="indexed", data_mixture="web:0.5,code:0.5").conflicts(saved)
    assert "now indexed, shuffled with seed 7, mixture web:0.5,code:0.5" in reweighted
    in_order = identity(dataset_type="indexed", shuffle=0).record()
    assert identity(dataset_type="indexed", shuffle=0, seed=8).conflicts(in_order) == []
    assert identity(dataset_type="indexed").conflicts(in_order)  # the control: a shuffle is another order


def test_another_model_shape_is_refused_field_by_field():
    tiny = identity()
    deeper = replace(tiny, model=replace(tiny.model, num_layers=3, name="renamed"))
    assert deeper.conflicts(SAVED) == [("model shape (model_preset or the model's config) was num_layers 2 when "
                                        "saved, now num_layers 3; train the model the checkpoint holds")]
    assert replace(tiny, model=replace(tiny.model, name="renamed")).conflicts(SAVED) == []  # a name is no shape


def test_a_record_asks_only_what_it_holds():
    """A record written before a key (or a model field) existed asks nothing of it."""
    older = {k: v for k, v in SAVED.items() if k != "optimizer"}
    older["model"] = {k: v for k, v in SAVED["model"].items() if k != "norm_eps"}
    tiny = identity(optimizer="anyprecision")
    assert tiny.conflicts(older) == []
    assert replace(tiny, model=replace(tiny.model, norm_eps=1e-6)).conflicts(older) == []


# --- the validator's note -----------------------------------------------------------------------
def job(runtime_dir, **fields) -> dict:
    data = {
        "entry_point": "train.py", "source_dir": str(runtime_dir), "instance_type": "ml.p4d.24xlarge",
        "instance_count": 2, "checkpoint_s3_uri": URI,
        "role": "arn:aws:iam::111122223333:role/SageMakerRole",
        "hyperparameters": {"model_preset": "llama3-tiny", "max_context_width": 4096, "train_batch_size": 2,
                            "gradient_accumulation_steps": 3, "checkpoint_freq": 100},
        "distribution": {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
            "enabled": True, "parameters": {"hybrid_shard_degree": 8, "context_parallel_degree": 2}}}},
    }
    data.update(fields)
    return data


def test_a_job_that_resumes_gets_a_note_with_its_global_batch(runtime_dir):
    validated = validate_job(job(runtime_dir))
    [note] = validated.notes
    assert (note.path, note.value, note.level) == ("checkpoint_s3_uri", URI, "info")
    # 2 hosts x 8 GPUs = 16 ranks; cp 2 leaves 8 data-parallel ranks: 2 x 8 x 3 = 48 sequences
    assert "global batch in sequences per step (here 48 = train_batch_size 2 x data-parallel degree 8 x " \
           "gradient_accumulation_steps 3)" in note.detail
    assert "sequence length (here 4096)" in note.detail and "model shape (here llama3-tiny)" in note.detail
    for key in ALLOWED:
        assert key in note.detail.split("; it must keep")[0], key
    assert "to resume on a fleet with another data-parallel degree d, keep the global batch: train_batch_size " \
           "x gradient_accumulation_steps = 48 / d" in note.detail
    assert "must keep the global batch, sequence length, data stream, model and optimizer" in note.problem
    assert note not in validated.warnings
    # what the runtime records for this job: the note's number
    assert RunIdentity(validated.settings, validated.model, validated.layout.data_parallel).record()[
        "global_batch"] == 48


def test_no_note_where_nothing_resumes(runtime_dir, user_script_dir):
    without_freq = job(runtime_dir)
    without_freq["hyperparameters"] = {k: v for k, v in without_freq["hyperparameters"].items()
                                       if k != "checkpoint_freq"}
    for data in (job(runtime_dir, checkpoint_s3_uri=None),  # /opt/ml/checkpoints dies with the job
                 without_freq,  # the runtime neither saves nor resumes
                 job(user_script_dir, image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/"
                     "pytorch-training:2.8.0-gpu-py312")):  # a script's checkpoints are its own
        assert validate_job(data).notes == []


def test_a_local_job_with_its_own_checkpoint_directory_gets_the_note(runtime_dir, tmp_path):
    data = job(runtime_dir, instance_type="local", instance_count=1, processes_per_host=2,
               checkpoint_s3_uri=None, checkpoint_local_path=str(tmp_path / "ckpt"), distribution=None)
    [note] = validate_job(data).notes
    assert (note.path, note.value) == ("checkpoint_local_path", str(tmp_path / "ckpt"))
    assert "here 12 = train_batch_size 2 x data-parallel degree 2 x gradient_accumulation_steps 3" in note.detail
    assert validate_job(job(runtime_dir, instance_type="local", instance_count=1, checkpoint_s3_uri=None,
                            distribution=None)).notes == []  # each local job's own directory


def test_smlaunch_validate_prints_the_note(runtime_dir, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job(runtime_dir)))
    result = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
    assert result.exit_code == 0
    line = next(x for x in result.output.splitlines() if x.startswith("  note "))
    assert f'checkpoint_s3_uri = "{URI}": this job resumes from the newest checkpoint there' in line
    assert len(line) < 400 and "here 48" not in result.output  # one line; the detail behind --verbose
    verbose = CliRunner().invoke(main, ["validate", str(path), "--verbose"], catch_exceptions=False).output
    assert "here 48 = train_batch_size" in verbose
    result = CliRunner().invoke(main, ["validate", str(path), "--json"], catch_exceptions=False)
    [note] = json.loads(result.output)["notes"]
    assert note["level"] == "info" and "here 48" in note["detail"]


def test_the_estimator_prints_the_note(fake_credentials, capsys):
    from launcher.sdk.estimator import PyTorch

    PyTorch(**job(ROOT / "entrypoints"))
    assert f'note: checkpoint_s3_uri = "{URI}": this job resumes' in capsys.readouterr().err
