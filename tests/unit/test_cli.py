"""The `smlaunch` CLI: exit codes (0 ok, 1 failed/AWS, 2 invalid), messages, JSON, light imports.
Here the tests that run in one process; those that start processes are tests/integration/test_cli.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends

from launcher.cli.app import main
from tests.conftest import REGION, SEED_BUCKET
from tests.support.cli import ROOT

pytestmark = pytest.mark.usefixtures("no_network")  # every test here runs with the network refused

SEED = ROOT / "configs" / "seed"
SEED_FILES = sorted(SEED.glob("*.yaml"))
RUNS = [SEED / f"{run}.yaml" for run in ("p4d-no-cp", "p4d-cp8", "p5-cp8-bf16", "p5-cp8-fp8")]
MP = "distribution.smdistributed.modelparallel.parameters"


def run_cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def set_failed(name: str, reason: str) -> None:
    job = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].training_jobs[name]
    job.training_job_status = job.secondary_status = "Failed"
    job.failure_reason = reason


# --- validate -----------------------------------------------------------------------------------
def test_seed_has_the_four_runs() -> None:
    assert {p.name for p in SEED_FILES} >= {p.name for p in RUNS}


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_validate_accepts_seed_runs(path: Path) -> None:
    result = run_cli("validate", path)
    assert result.exit_code == 0, result.output
    assert "valid" in result.stdout


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_validate_json_of_seed_runs(path: Path) -> None:
    result = run_cli("validate", path, "--json")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["valid"] is True and out["errors"] == []


@pytest.mark.parametrize(("overrides", "path", "words"), [
    (["hyperparameters.fp8=1"], "hyperparameters.fp8", ["A100"]),
    (["context_paralel_degree=8"], "--set", ["did you mean", "context_parallel_degree"]),
    ([f"{MP}.context_paralel_degree=8"], f"{MP}.context_paralel_degree",
     ["unknown key", "did you mean", "'context_parallel_degree'"]),
    (["context_parallel_degree=3"], f"{MP}.context_parallel_degree", ["must divide"]),
    (["hybrid_shard_degree=0", "instance_count=banana"], "instance_count", ["whole number"]),
], ids=["fp8-on-a100", "typo-short", "typo-full-path", "cp-3", "bad-int"])
def test_validate_rejects_broken_variants(overrides: list[str], path: str, words: list[str]) -> None:
    args = ["validate", SEED / "p4d-cp8.yaml"]
    for item in overrides:
        args += ["--set", item]
    result = run_cli(*args)
    assert result.exit_code == 2
    assert f"{path} = " in result.stderr, result.stderr  # every error names its field path
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    assert "p4d-cp8.yaml" in result.stderr or path == "--set"


def test_validate_reports_every_error_at_once() -> None:
    result = run_cli("validate", SEED / "p4d-cp8.yaml", "--set", "hyperparameters.fp8=1",
                     "--set", "context_parallel_degree=3")
    assert result.exit_code == 2
    assert "hyperparameters.fp8 = " in result.stderr
    assert f"{MP}.context_parallel_degree = 3" in result.stderr


def test_validate_json_errors_have_path_value_fix() -> None:
    result = run_cli("validate", SEED / "p4d-cp8.yaml", "--json", "--set", "hyperparameters.fp8=1",
                     "--set", "context_parallel_degree=3")
    assert result.exit_code == 2
    out = json.loads(result.stdout)
    assert out["valid"] is False
    by_path = {}
    for error in out["errors"]:
        assert {"path", "value", "problem", "fix"} <= set(error)
        by_path.setdefault(error["path"], error)
    assert by_path["hyperparameters.fp8"]["value"] is True
    assert by_path["hyperparameters.fp8"]["fix"]
    assert by_path[f"{MP}.context_parallel_degree"]["value"] == 3


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("entry_point: train.py\ninstance_count: 1\nrole: arn: oops\n")
    result = run_cli("validate", bad)
    assert result.exit_code == 2
    assert str(bad) in result.stderr
    assert "line 3" in result.stderr


def test_yaml_syntax_error_in_base_names_the_base(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("entry_point: train.py\nhyperparameters: {bf16: 1\nrole: x\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ninstance_type: ml.p5.48xlarge\n")
    result = run_cli("validate", tmp_path / "child.yaml")
    assert result.exit_code == 2
    assert str(tmp_path / "base.yaml") in result.stderr
    assert "line " in result.stderr


def test_missing_file(tmp_path: Path) -> None:
    result = run_cli("validate", tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert "nope.yaml" in result.stderr and "no such file" in result.stderr


def test_extends_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nentry_point: train.py\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\ninstance_type: ml.p5.48xlarge\n")
    result = run_cli("validate", tmp_path / "a.yaml")
    assert result.exit_code == 2
    assert "extends" in result.stderr and "circular" in result.stderr


def test_malformed_set_is_a_usage_error() -> None:
    result = run_cli("validate", SEED / "p4d-cp8.yaml", "--set", "no-equals-sign")
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.stderr


def test_validate_says_which_kernel_masks_documents_and_refuses_one_the_job_cannot_run() -> None:
    result = run_cli("validate", SEED / "p5-cp8-fp8.yaml")
    assert result.exit_code == 0
    assert "attention_kernel auto: FlexAttention block masks on GPUs" in result.output
    chosen = run_cli("validate", SEED / "p5-cp8-fp8.yaml", "--set", "hyperparameters.attention_kernel=varlen")
    assert chosen.exit_code == 0 and "attention_kernel varlen: flash attention" in chosen.output
    # varlen is flash attention: half precision only
    fp32 = run_cli("validate", SEED / "p4d-cp8.yaml", "--set", "hyperparameters.attention_kernel=varlen",
                   "--set", "hyperparameters.bf16=0", "--set", "hyperparameters.fp8=0")
    assert fp32.exit_code == 2
    assert 'hyperparameters.attention_kernel = "varlen": flash attention\'s variable-length kernel is half ' \
           "precision only" in fp32.stderr and "add bf16: 1" in fp32.stderr
    # FlexAttention has no backward on CPUs
    cpu = run_cli("validate", SEED / "p4d-cp8.yaml", "--set", "instance_type=ml.c5.18xlarge",
                  "--set", "hyperparameters.attention_kernel=flex")
    assert cpu.exit_code == 2 and "FlexAttention has no backward pass on CPU" in cpu.stderr
    unknown = run_cli("validate", SEED / "p5-cp8-fp8.yaml", "--set", "hyperparameters.attention_kernel=flash")
    assert unknown.exit_code == 2 and "attention_kernel" in unknown.stderr


# --- submit -------------------------------------------------------------------------------------
def test_submit_dry_run_prints_the_request(monkeypatch, tmp_path) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    result = run_cli("submit", SEED / "p5-cp8-fp8.yaml", "--dry-run", "--job-name", "x-1")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    req = out["CreateTrainingJob"]
    assert req["TrainingJobName"] == "x-1"
    assert req["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"
    hp = req["HyperParameters"]
    assert all(isinstance(v, str) for v in hp.values())
    assert json.loads(hp["mp_parameters"]) == {"hybrid_shard_degree": 8, "delayed_parameter_initialization": True,
                                               "context_parallel_degree": 8}
    assert (hp["train_batch_size"], hp["fp8"]) == ("4", "1")
    assert hp["sagemaker_torch_distributed_enabled"] == "true"
    assert hp["sagemaker_distributed_dataparallel_enabled"] == "false"
    assert hp["sagemaker_program"] == '"train.py"'
    source = f"s3://{SEED_BUCKET}/x-1/source/sourcedir.tar.gz"
    assert hp["sagemaker_submit_directory"] == json.dumps(source)
    assert out["SourceUpload"] == source


def test_submit_dry_run_of_invalid_job_exits_2() -> None:
    result = run_cli("submit", SEED / "p4d-cp8.yaml", "--dry-run", "--set", "hyperparameters.fp8=1")
    assert result.exit_code == 2
    assert "hyperparameters.fp8" in result.stderr


def test_submit_no_wait_creates_the_job(aws) -> None:
    result = run_cli("submit", SEED / "p4d-cp8.yaml", "--no-wait", "--job-name", "cli-cp8")
    assert result.exit_code == 0, result.output
    assert "cli-cp8" in result.stdout
    desc = aws.client("sagemaker").describe_training_job(TrainingJobName="cli-cp8")
    assert desc["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    keys = [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=SEED_BUCKET)["Contents"]]
    assert keys == ["cli-cp8/source/sourcedir.tar.gz"]


def test_submit_and_wait_on_completed_job(aws) -> None:
    result = run_cli("submit", SEED / "p4d-cp8.yaml", "--job-name", "cli-waits")
    assert result.exit_code == 0, result.output
    assert "cli-waits completed" in result.stdout


def test_submit_taken_name_exits_1(aws) -> None:
    assert run_cli("submit", SEED / "p4d-cp8.yaml", "--no-wait", "--job-name", "twice").exit_code == 0
    result = run_cli("submit", SEED / "p4d-cp8.yaml", "--no-wait", "--job-name", "twice")
    assert result.exit_code == 1
    assert "twice" in result.stderr and "already" in result.stderr


def test_submit_to_missing_bucket_exits_1(aws) -> None:
    result = run_cli("submit", SEED / "p4d-cp8.yaml", "--no-wait", "--job-name", "nobucket",
                     "--set", "output_path=s3://smlaunch-missing-bucket/out/")
    assert result.exit_code == 1
    assert "smlaunch-missing-bucket" in result.stderr
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


# --- status, logs, list ---------------------------------------------------------------------------
def test_status_of_failed_job_shows_reason(aws) -> None:
    assert run_cli("submit", SEED / "p4d-no-cp.yaml", "--no-wait", "--job-name", "oom-run", "--force").exit_code == 0
    reason = "AlgorithmError: CUDA out of memory. Tried to allocate 7.83 GiB"
    set_failed("oom-run", reason)
    result = run_cli("status", "oom-run")
    assert result.exit_code == 1, result.output  # a failed job (the README's exit codes)
    assert "Failed" in result.stdout
    assert reason in result.stdout


def test_status_json_masks_secrets(aws) -> None:
    assert run_cli("submit", SEED / "p4d-cp8.yaml", "--no-wait", "--job-name", "secret-run",
                   "--set", "hyperparameters.api_key=sk-live-123").exit_code == 0
    result = run_cli("status", "secret-run", "--json")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["TrainingJobName"] == "secret-run"
    assert "sk-live-123" not in result.stdout


@pytest.mark.parametrize("command", ["status", "stop", "logs"])
def test_unknown_job_is_neither_local_nor_on_sagemaker(aws, command, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    result = run_cli(command, "no-such-job")
    assert result.exit_code == 1
    assert "no job named 'no-such-job': not a local, slurm or kubernetes job" in result.stderr
    assert f"nor a SageMaker training job in {REGION}" in result.stderr
    assert "Traceback" not in result.output


def test_unknown_job_when_sagemaker_cannot_be_asked(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    result = run_cli("status", "no-such-job")
    assert result.exit_code == 1
    assert "not a local, slurm or kubernetes job" in result.stderr
    assert "SageMaker cannot be asked: no AWS region" in result.stderr


def test_wait_on_failed_job_exits_1(aws, monkeypatch) -> None:
    assert run_cli("submit", SEED / "p4d-no-cp.yaml", "--no-wait", "--job-name", "failing", "--force").exit_code == 0
    set_failed("failing", "AlgorithmError: boom")
    result = run_cli("logs", "failing", "--follow", "--poll", "0")
    assert result.exit_code == 1
    assert "AlgorithmError: boom" in result.stderr


def test_interrupted_follow_exits_130_with_hint(aws, monkeypatch) -> None:
    assert run_cli("submit", SEED / "p4d-cp8.yaml", "--no-wait", "--job-name", "running").exit_code == 0
    job = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].training_jobs["running"]
    job.training_job_status = "InProgress"

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr("launcher.backends.sagemaker.time.sleep", interrupted)
    result = run_cli("logs", "running", "--follow", "--poll", "0")
    assert result.exit_code == 130
    assert "smlaunch logs running --follow" in result.stdout


def test_list_shows_jobs(aws) -> None:
    for name in ("list-a", "list-b"):
        assert run_cli("submit", SEED / "p4d-cp8.yaml", "--no-wait", "--job-name", name).exit_code == 0
    set_failed("list-b", "x")
    result = run_cli("list", "--status", "Failed")
    assert result.exit_code == 0
    assert "list-b" in result.stdout and "list-a" not in result.stdout


def test_no_credentials_is_one_clear_line(monkeypatch, tmp_path) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = run_cli("status", "some-job", "--region", REGION)
    assert result.exit_code == 1
    assert "no AWS credentials" in result.stderr
    assert "Traceback" not in result.output


# --- schema and start-up ------------------------------------------------------------------------------
def test_schema_matches_the_committed_file() -> None:
    result = run_cli("schema")
    assert result.exit_code == 0
    committed = (ROOT / "configs" / "schema.json").read_text()
    assert json.loads(result.stdout) == json.loads(committed), \
        "configs/schema.json is stale: regenerate it with `make schema`"




# --- validate: indexed token channels on this machine (launcher.config.data_rules) --------------

def _indexed_job(tmp_path: Path, train: Path, **hyperparameters) -> Path:
    hp = {"model_preset": "llama3-tiny", "max_context_width": 8, "dataset_type": "indexed", **hyperparameters}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 1, "processes_per_host": 1, "inputs": {"train": str(train)}, "hyperparameters": hp}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job))
    return path


def _shards(directory: Path, docs, vocab_size=256, tokenizer=None) -> Path:
    from container.data.indexed import write_shards

    write_shards(docs, directory, "train", vocab_size=vocab_size,
                 tokenizer=tokenizer or {"name": "UTF-8 bytes", "vocabulary_sha256": None})
    return directory


def test_validate_checks_a_local_indexed_channel(tmp_path: Path) -> None:
    good = _shards(tmp_path / "good", [[1, 2, 3, 4, 5]] * 10)
    result = run_cli("validate", _indexed_job(tmp_path, good))
    assert result.exit_code == 0, result.output
    assert "indexed, shuffled with seed 12345" in result.output
    assert "indexed, in order" in run_cli("validate", _indexed_job(tmp_path, good, shuffle=0)).output
    # a truncated .bin
    bad = _shards(tmp_path / "bad", [[1, 2, 3, 4, 5]] * 10)
    binary = bad / "train-00000.bin"
    binary.write_bytes(binary.read_bytes()[:-4])
    result = run_cli("validate", _indexed_job(tmp_path, bad))
    assert result.exit_code == 2 and "truncated or mismatched" in result.stderr, result.stderr
    assert "train-00000.bin" in result.stderr, result.stderr
    # ids beyond llama3-tiny's 256
    wide = _shards(tmp_path / "wide", [[1, 2, 300]] * 10, vocab_size=512)
    result = run_cli("validate", _indexed_job(tmp_path, wide))
    assert result.exit_code == 2 and "holds token id 300, outside llama3-tiny's vocabulary of 256" in result.stderr
    # shards read as JSON Lines
    result = run_cli("validate", _indexed_job(tmp_path, good, dataset_type="jsonl"))
    assert result.exit_code == 2 and "holds indexed token shards" in result.stderr
    assert "set dataset_type: indexed" in result.stderr


def test_validate_checks_the_shards_tokenizer_against_a_local_models(tmp_path: Path) -> None:
    from launcher.wire.token_shards import tokenizer_identity
    from tests.support.hf_models import llama_config, save_llama, save_tokenizer

    model = tmp_path / "model"
    save_llama(model, llama_config())
    save_tokenizer(model)
    hp = {"model_preset": "", "hf_pretrained_model_name_or_dir": str(model)}
    result = run_cli("validate", _indexed_job(tmp_path, _shards(tmp_path / "bytes", [[1, 2, 3]] * 10, 320), **hp))
    assert result.exit_code == 2, result.output
    assert "train-00000.idx was packed with UTF-8 bytes, whose ids mean other tokens than the model's " \
           "tokenizer" in " ".join(result.stderr.split())
    same = _shards(tmp_path / "same", [[1, 2, 3]] * 10, 320, tokenizer_identity("m", model / "tokenizer.json"))
    assert run_cli("validate", _indexed_job(tmp_path, same, **hp)).exit_code == 0


@pytest.mark.parametrize(("hyperparameters", "words"), [
    ({"data_mixture": "web=0.7"}, ["hyperparameters.data_mixture", "is not channel:weight"]),
    ({"data_mixture": "web:0"}, ["the weight of web is 0.0", "positive weight"]),
    ({"data_mixture": "web:1,books:1"}, ["names channel(s) web, books, which the job's inputs do not have"]),
    ({"data_mixture": "train:1", "dataset_type": "jsonl"}, ["mixes indexed token shards, and dataset_type is jsonl"]),
    ({"shuffle": 1, "dataset_type": "jsonl"}, ["hyperparameters.shuffle", "jsonl data is read in order"]),
])
def test_validate_refuses_an_order_the_data_cannot_have(tmp_path: Path, hyperparameters, words) -> None:
    good = _shards(tmp_path / "good", [[1, 2, 3, 4, 5]] * 10)
    result = run_cli("validate", _indexed_job(tmp_path, good, **hyperparameters))
    assert result.exit_code == 2
    for word in words:
        assert word in result.stderr, (word, result.stderr)
