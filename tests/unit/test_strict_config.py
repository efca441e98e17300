"""Every bad setting is a validation error naming the field, the value and the fix: strict
numbers (no YAML `yes` as 1, no .inf), JSON-only hyperparameters, SageMaker's request limits,
bounded degrees and counts, sound model configs, and the estimator's own arguments."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import time

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.config import ConfigError, ParallelLayout, validate_job
from launcher.plan import PlanError, plan, workload_of
from launcher.sdk.estimator import PyTorch
from launcher.wire.training.layout import divisors
from launcher.wire.training.models import ModelSpec

MP = "distribution.smdistributed.modelparallel.parameters"
HF = "hyperparameters.hf_pretrained_model_name_or_dir"
BOOLEAN = "is a boolean, not a number"


def job(source_dir, *, hp=None, params=None, **fields):
    data = {"entry_point": "train.py", "source_dir": str(source_dir), "instance_type": "local",
            "processes_per_host": 1, "hyperparameters": {"model_preset": "llama3-tiny", **(hp or {})}}
    if params is not None:
        data["distribution"] = {"torch_distributed": {"enabled": True},
                                "smdistributed": {"modelparallel": {"enabled": True, "parameters": params}}}
    data.update(fields)
    return data


def errors(data) -> dict[str, list]:
    """{path: [issue, ...]} of the errors validation reports; {} when the job is valid."""
    try:
        validate_job(data)
    except ConfigError as exc:
        out: dict[str, list] = {}
        for issue in exc.issues:
            assert issue.problem and issue.fix, f"an error without a problem or a fix: {issue}"
            out.setdefault(issue.path, []).append(issue)
        return out
    return {}


def only(data, path):
    found = errors(data)
    assert path in found, f"no error at {path}; got {found}"
    return found[path][0]


# --- numbers as written ---------------------------------------------------------------------------

@pytest.mark.parametrize("fields, path, value", [
    ({"instance_count": True}, "instance_count", True),  # YAML's `instance_count: yes`
    ({"processes_per_host": True}, "processes_per_host", True),
    ({"max_run": False}, "max_run", False),
    ({"params": {"hybrid_shard_degree": True}}, f"{MP}.hybrid_shard_degree", True),
    ({"params": {"tensor_parallel_degree": True}}, f"{MP}.tensor_parallel_degree", True),
    ({"hp": {"train_batch_size": True}}, "hyperparameters.train_batch_size", True),
    ({"hp": {"hybrid_shard_degree": True}}, "hyperparameters.hybrid_shard_degree", True),
    ({"hp": {"lr": True}}, "hyperparameters.lr", True),
])
def test_a_boolean_is_not_a_number(runtime_dir, fields, path, value):
    issue = only(job(runtime_dir, **fields), path)
    assert issue.value is value
    assert BOOLEAN in issue.problem and "yes/no" in issue.problem
    assert issue.fix == "write the number"


@pytest.mark.parametrize("fields, path", [
    ({"instance_count": "2"}, "instance_count"),
    ({"instance_count": 2.0}, "instance_count"),
    ({"params": {"context_parallel_degree": "2"}}, f"{MP}.context_parallel_degree"),
])
def test_job_numbers_are_numbers_as_written(runtime_dir, fields, path):
    issue = only(job(runtime_dir, **fields), path)
    assert "number" in issue.fix


@pytest.mark.parametrize("fields, path", [
    ({"hp": {"lr": math.inf}}, "hyperparameters.lr"),
    ({"hp": {"lr": "nan"}}, "hyperparameters.lr"),
    ({"hp": {"weight_decay": -math.inf}}, "hyperparameters.weight_decay"),
    ({"params": {"sdp_gradient_clipping": math.inf}}, f"{MP}.sdp_gradient_clipping"),
])
def test_numbers_are_finite(runtime_dir, fields, path):
    issue = only(job(runtime_dir, **fields), path)
    assert "finite" in issue.problem and ".inf" in issue.fix


def test_hyperparameters_written_as_text_still_read(runtime_dir):
    """Notebooks pass hyperparameters as strings; the wire keeps them as written."""
    hp = {"lr": "1e-4", "train_batch_size": "8", "bf16": "1", "activation_checkpointing": 1}
    result = validate_job(job(runtime_dir, hp=hp))
    typed = result.config.hyperparameters
    assert (typed.lr, typed.train_batch_size, typed.bf16, typed.activation_checkpointing) == (1e-4, 8, True, True)
    assert result.config.hyperparameters.raw() == {"model_preset": "llama3-tiny", **hp}


# --- hyperparameters travel as JSON ---------------------------------------------------------------

@pytest.mark.parametrize("value, problem", [
    (datetime.date(2024, 1, 31), "date"),  # YAML's unquoted 2024-01-31
    (b"\x00\x01", "bytes"),  # YAML's !!binary
    ({1, 2}, "set"),  # YAML's !!set
    ([1, math.nan], "nan"),
    ({"a": {1: "x"}}, "JSON keys are strings"),
    (object(), "object"),
])
@pytest.mark.parametrize("kind", ["runtime", "script"])
def test_hyperparameters_are_json_values(runtime_dir, user_script_dir, value, problem, kind):
    where = runtime_dir if kind == "runtime" else user_script_dir
    issue = only(job(where, hp={"my_setting": value}), "hyperparameters.my_setting")
    assert problem in issue.problem
    assert "write a string, a number" in issue.fix


def test_a_user_scripts_free_choice_is_a_json_value_too(user_script_dir):
    """optimizer & co. are any value for a user script, but still JSON."""
    issue = only(job(user_script_dir, hp={"optimizer": datetime.date(2024, 1, 31)}), "hyperparameters.optimizer")
    assert "date" in issue.problem


@pytest.mark.parametrize("key", ["", "  "])
def test_a_hyperparameter_needs_a_name(runtime_dir, key):
    path = 'hyperparameters[""]' if key == "" else f"hyperparameters.{key}"
    issue = only(job(runtime_dir, hp={key: 1}), path)
    assert "needs a name" in issue.problem and "remove it" in issue.fix


def test_nested_json_values_are_accepted(user_script_dir):
    value = {"layers": [1, 2.5, None, True, "x"], "inner": {"k": [{}]}}
    result = validate_job(job(user_script_dir, hp={"my_setting": value}))
    assert result.config.hyperparameters.raw()["my_setting"] == value


# --- SageMaker's request limits (botocore's CreateTrainingJob shapes) ---------------------------

def test_hyperparameter_value_limit_is_on_the_encoded_value(user_script_dir):
    at_limit = "x" * 2498  # json.dumps adds the two quotes: 2500 characters as sent
    assert "hyperparameters.text" not in errors(job(user_script_dir, hp={"text": at_limit}))
    issue = only(job(user_script_dir, hp={"text": at_limit + "x"}), "hyperparameters.text")
    assert "2501 characters" in issue.problem and "2500" in issue.problem


def test_hyperparameter_name_limit(user_script_dir):
    assert errors(job(user_script_dir, hp={"k" * 256: 1})) == {}
    found = [i for issues in errors(job(user_script_dir, hp={"k" * 257: 1})).values() for i in issues]
    assert len(found) == 1 and found[0].path.startswith("hyperparameters.k")
    assert "257 characters" in found[0].problem and "256" in found[0].problem


def test_hyperparameter_count_includes_the_keys_the_launcher_adds(user_script_dir):
    # A local job with processes_per_host and no distribution carries six reserved keys:
    # sagemaker_program, _submit_directory, _container_log_level, _job_name, _region and
    # sagemaker_smlaunch_processes_per_host; with model_preset, 93 more make 100.
    fits = {f"k{i}": i for i in range(93)}
    assert errors(job(user_script_dir, hp=fits)) == {}
    issue = only(job(user_script_dir, hp={**fits, "one_more": 1}), "hyperparameters")
    assert "would carry 101" in issue.problem and "sagemaker_program" in issue.problem
    assert "remove at least 1" in issue.fix


def test_environment_limits(user_script_dir):
    assert "environment" in errors(job(user_script_dir, environment={f"V{i}": "1" for i in range(101)}))
    assert errors(job(user_script_dir, environment={f"V{i}": "1" for i in range(100)})) == {}
    assert "environment.LONG" in errors(job(user_script_dir, environment={"LONG": "x" * 513}))
    assert "environment" in errors(job(user_script_dir, environment={"V" * 513: "1"}))


@pytest.mark.parametrize("tags", [
    [{"Key": f"k{i}", "Value": "v"} for i in range(51)],
    {f"k{i}": "v" for i in range(51)},
])
def test_at_most_50_tags(user_script_dir, tags):
    issue = only(job(user_script_dir, tags=tags), "tags")
    assert "50" in issue.fix


def test_a_tag_mapping_is_checked_as_a_mapping(user_script_dir):
    found = errors(job(user_script_dir, tags={"team#1": "ml", "k" * 129: "v", "ok": "v" * 257}))
    assert "tags.team#1" in found and f"tags.{'k' * 129}" in found and "tags.ok" in found
    assert "tags" not in found  # no "should be a list" beside the real problems
    assert errors(job(user_script_dir, tags={"team": "ml research", "cost-center": "a/b:c=d+e@f"})) == {}


# --- bounded counts and degrees -------------------------------------------------------------------

@pytest.mark.parametrize("fields, path, bound", [
    ({"instance_count": 2147483647}, "instance_count", "4096"),
    ({"instance_count": 4097}, "instance_count", "4096"),
    ({"processes_per_host": 257}, "processes_per_host", "256"),
    ({"params": {"tensor_parallel_degree": 2**21}}, f"{MP}.tensor_parallel_degree", "1048576"),
    ({"params": {"hybrid_shard_degree": 2**40}}, f"{MP}.hybrid_shard_degree", "1048576"),
    ({"hp": {"vocab_size": 2**31}}, "hyperparameters.vocab_size", "2147483647"),
])
def test_counts_and_degrees_are_bounded(runtime_dir, fields, path, bound):
    started = time.monotonic()
    issue = only(job(runtime_dir, **fields), path)
    assert time.monotonic() - started < 5
    assert bound in issue.fix


def test_a_degree_check_on_the_largest_world_is_quick(runtime_dir):
    """world = 4096 hosts x 256 processes; the divisors of a world are found in sqrt steps."""
    started = time.monotonic()
    issue = only(job(runtime_dir, instance_count=4096, processes_per_host=256,
                     params={"tensor_parallel_degree": 3}), f"{MP}.tensor_parallel_degree")
    assert time.monotonic() - started < 5
    assert "world size 1048576" in issue.problem and "524288" in issue.fix


def test_divisors():
    for n in (1, 2, 12, 36, 97, 360):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(2147483647) == [1, 2147483647]  # prime: sqrt(n) steps, not n


# --- model configs ------------------------------------------------------------------------------

TINY_CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 256}


@pytest.mark.parametrize("text, said", [
    ("[1, 2]", "JSON list, not an object"),
    ('{"hidden_size": 64,', "cannot be read"),
    (json.dumps({k: v for k, v in TINY_CONFIG.items() if k != "vocab_size"}), "has no 'vocab_size'"),
    (json.dumps({**TINY_CONFIG, "num_attention_heads": 0}), "num_attention_heads is 0"),
    (json.dumps({**TINY_CONFIG, "num_hidden_layers": -2}), "num_hidden_layers is -2"),
    (json.dumps({**TINY_CONFIG, "num_attention_heads": True}), "num_attention_heads is True"),
    (json.dumps({**TINY_CONFIG, "hidden_size": "64"}), "hidden_size is '64'"),
    (json.dumps({**TINY_CONFIG, "rope_scaling": "llama3"}), "rope_scaling is 'llama3', not an object"),
    (json.dumps({**TINY_CONFIG, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}),
     "has no 'rope_scaling.low_freq_factor'"),
    (json.dumps({**TINY_CONFIG, "rope_theta": 1e400}), "rope_theta is inf"),
    (json.dumps({**TINY_CONFIG, "tie_word_embeddings": "false"}), "tie_word_embeddings is 'false'"),
    (json.dumps({**TINY_CONFIG, "num_key_value_heads": 3}), "3 key/value heads do not divide 4"),
    (json.dumps({**TINY_CONFIG, "num_attention_heads": 128, "num_key_value_heads": 128}),
     "128 attention heads leave no head dimension"),
])
def test_a_broken_config_json_is_an_error_naming_the_key(runtime_dir, tmp_path, text, said):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(text)
    issue = only(job(runtime_dir, hp={"model_preset": None, "hf_pretrained_model_name_or_dir": str(model),
                                      "init_from_scratch": 1}), HF)
    assert said in issue.problem and "config.json" in issue.problem
    assert issue.value == str(model) and issue.fix


@pytest.mark.parametrize("sizes, path, said", [
    ({"hidden_width": 8, "num_heads": 16}, "hyperparameters.num_heads", "16 attention heads leave no head"),
    ({"num_heads": 4, "num_key_value_heads": 3}, "hyperparameters.num_key_value_heads", "3 key/value heads"),
])
def test_size_hyperparameters_that_make_no_model(runtime_dir, sizes, path, said):
    hp = {"model_preset": None, "model_type": "llama_v3", "hidden_width": 64, "num_layers": 2, "num_heads": 4,
          "intermediate_size": 176, "vocab_size": 256, **sizes}
    issue = only(job(runtime_dir, hp=hp), path)
    assert said in issue.problem


def test_a_model_spec_cannot_have_an_impossible_shape():
    with pytest.raises(ValueError, match="num_heads 0 is not a whole number"):
        ModelSpec("broken", 64, 2, 0, 2, 176, 256, 4096)
    with pytest.raises(ValueError, match="key/value heads do not divide"):
        ModelSpec("broken", 64, 2, 4, 3, 176, 256, 4096)


def test_the_planner_refuses_a_layout_that_does_not_tile_the_world(runtime_dir):
    """A ValidatedJob put together by hand: PlanError, not ZeroDivisionError."""
    # an instance the planner models (a local job has nothing to plan, so it could not show the refusal)
    valid = validate_job(job(runtime_dir, instance_type="ml.p4d.24xlarge", processes_per_host=8))
    broken = dataclasses.replace(valid, layout=ParallelLayout(world=8, dp_replicate=0, dp_shard=8, cp=1, tp=1))
    with pytest.raises(PlanError, match="does not tile the world of 8 ranks"):
        workload_of(broken)
    assert not plan(broken).valid


# --- the estimator's own arguments ------------------------------------------------------------

def test_estimator_hyperparameters_must_be_a_dict(user_script_dir):
    with pytest.raises(ConfigError) as caught:
        PyTorch(entry_point="train.py", source_dir=str(user_script_dir), instance_type="local",
                hyperparameters="lr=1")
    (issue,) = caught.value.issues
    assert (issue.path, issue.value) == ("hyperparameters", "lr=1")
    assert "str" in issue.problem and "dict" in issue.fix
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("name", ["sagemaker_session", "session"])
def test_estimator_session_must_be_a_session(user_script_dir, name):
    with pytest.raises(ConfigError) as caught:
        PyTorch(entry_point="train.py", source_dir=str(user_script_dir), instance_type="local", **{name: "x"})
    (issue,) = caught.value.issues
    assert (issue.path, issue.value) == (name, "x")
    assert "sagemaker.Session" in issue.problem and "boto3.Session" in issue.fix


@pytest.mark.parametrize("name, said", [(123, "is not text"), ("", "is empty"), ("my job", "contains ' '")])
def test_attach_checks_the_job_name_first(name, said, monkeypatch, tmp_path):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        PyTorch.attach(name)
    (issue,) = caught.value.issues
    assert (issue.path, issue.value) == ("training_job_name", name)
    assert said in issue.problem and "letters, digits and hyphens" in issue.fix


# --- the CLI: exit 2, nothing written ---------------------------------------------------------

def write_job(directory, text: str):
    (directory / "train.py").write_text("from container.trainer import train\n")
    path = directory / "job.yaml"
    path.write_text("entry_point: train.py\ninstance_type: local\nprocesses_per_host: 1\n"
                    "hyperparameters:\n  model_preset: llama3-tiny\n" + text)
    return path


@pytest.mark.parametrize("text, said", [
    ("instance_count: yes\n", "instance_count = true"),
    ("instance_count: 2147483647\n", "instance_count = 2147483647"),
])
def test_cli_validate_exits_2(tmp_path, text, said):
    started = time.monotonic()
    result = CliRunner().invoke(main, ["validate", str(write_job(tmp_path, text))])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert time.monotonic() - started < 10


def test_cli_plan_of_a_broken_config_json_exits_2(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({**TINY_CONFIG, "num_attention_heads": 0}))
    path = write_job(tmp_path, "")
    path.write_text(path.read_text().replace("model_preset: llama3-tiny",
                                             "hf_pretrained_model_name_or_dir: model\n  init_from_scratch: 1"))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert "num_attention_heads is 0" in result.output


def test_cli_submit_of_an_invalid_job_writes_nothing(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SMLAUNCH_HOME", str(home))
    path = write_job(tmp_path, "  lr: .inf\n")  # inside the hyperparameters mapping
    result = CliRunner().invoke(main, ["submit", str(path), "--no-wait"])
    assert result.exit_code == 2, result.output
    assert "hyperparameters.lr" in result.output
    assert not home.exists()
