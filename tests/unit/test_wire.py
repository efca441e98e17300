"""The wire format matches the SageMaker SDK v2 and the sagemaker-training toolkit (docs/sagemaker-contract.md)."""

from __future__ import annotations

import json

from launcher.config import ConfigError, validate_job
from launcher.config.sent_hyperparameters import distribution_from_hyperparameters
from launcher.wire import hyperparameters as wire
from launcher.wire.masking import mask_secrets


def toolkit_decode(value: str):
    # sagemaker-training's rule: json.loads each value, fall back to the raw string.
    try:
        return json.loads(value)
    except ValueError:
        return value


def test_encode_follows_sdk_v2():
    enc = wire.encode({"model_type": "llama", "fp8": True, "steps": 8, "lr": 1e-4, "d": {"a": 1}})
    assert enc == {"model_type": '"llama"', "fp8": "true", "steps": "8", "lr": "0.0001", "d": '{"a": 1}'}


def test_decode_accepts_json_and_raw_strings():
    assert wire.decode({"a": '"llama"', "b": "llama", "c": "8", "d": "True"}) == {
        "a": "llama", "b": "llama", "c": 8, "d": "True"}


def test_distribution_round_trip_through_hyperparameters():
    decoded = {k: toolkit_decode(v) for k, v in wire.encode({
        "mp_parameters": {"hybrid_shard_degree": 8, "context_parallel_degree": 8},
        "sagemaker_torch_distributed_enabled": True,
        "sagemaker_distributed_dataparallel_enabled": False,
        "sagemaker_instance_type": "ml.p5.48xlarge",
    }).items()}
    assert distribution_from_hyperparameters(decoded) == {
        "torch_distributed": {"enabled": True},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 8, "context_parallel_degree": 8}}},
    }


def test_mpi_distribution_round_trip():
    decoded = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 8,
               "sagemaker_mpi_custom_mpi_options": "-verbose", "mp_parameters": '{"ddp": true}'}
    dist = distribution_from_hyperparameters(decoded)
    assert dist["mpi"] == {"enabled": True, "processes_per_host": 8, "custom_mpi_options": "-verbose"}
    assert dist["smdistributed"]["modelparallel"]["parameters"] == {"ddp": True}


def test_split_reserved():
    user, reserved = wire.split_reserved({"lr": 1, "sagemaker_program": "t.py", "mp_parameters": {},
                                          "sagemaker_smlaunch_processes_per_host": 2})
    assert user == {"lr": 1}
    assert set(reserved) == {"sagemaker_program", "mp_parameters", "sagemaker_smlaunch_processes_per_host"}


def test_mask_secrets():
    masked = mask_secrets({
        "Environment": {"HF_TOKEN": "hf_abc", "AWS_SECRET_ACCESS_KEY": "s", "NCCL_DEBUG": "INFO"},
        "HyperParameters": {"api_key": '"k"', "db_password": "p", "num_key_value_heads": "8", "lr": "0.1"},
        "Tags": [{"Key": "team", "Value": "ml"}, {"Key": "deployToken", "Value": "t"}],
        "nested": [{"clientSecret": "x"}],
    })
    assert masked["Environment"] == {"HF_TOKEN": "****", "AWS_SECRET_ACCESS_KEY": "****", "NCCL_DEBUG": "INFO"}
    assert masked["HyperParameters"] == {"api_key": "****", "db_password": "****",
                                         "num_key_value_heads": "8", "lr": "0.1"}
    assert masked["Tags"] == [{"Key": "team", "Value": "ml"}, {"Key": "deployToken", "Value": "****"}]
    assert masked["nested"] == [{"clientSecret": "****"}]


def test_validation_errors_do_not_print_secret_values(tmp_path):
    (tmp_path / "train.py").touch()
    try:
        validate_job({"entry_point": "train.py", "instance_type": "local", "source_dir": str(tmp_path),
                      "environment": {"HF TOKEN": "hf_SECRET123"},
                      "distribution": {"mpi": {"custom_mpi_options": 3, "password": "pw_SECRET456"}}})
    except ConfigError as exc:
        text = str(exc) + str([i.to_dict() for i in exc.issues])
    else:
        raise AssertionError("an environment variable name with a space must be rejected")
    assert "environment" in text and "distribution.mpi.password" in text
    assert "hf_SECRET123" not in text and "pw_SECRET456" not in text and "****" in text


def test_metric_lines_match_the_metric_definitions():
    import re

    from launcher.wire.metric_lines import METRIC_REGEXES, METRICS, format_metric_line

    line = format_metric_line(12, loss=2.5, grad_norm=0.75, samples_per_s=2.03, tokens_per_s=33256.0,
                              tokens_per_s_per_gpu=4157.0, tflops_per_gpu=247.1, mfu=0.25)
    found = {name: re.search(regex, line) for name, regex in METRIC_REGEXES.items()}
    values = {name: float(m.group(1)) for name, m in found.items() if m}
    assert values == {"train:loss": 2.5, "train:grad_norm": 0.75, "train:samples_per_sec": 2.03,
                      "train:tokens_per_sec": 33256.0, "train:tokens_per_sec_per_gpu": 4157.0,
                      "train:tflops_per_gpu": 247.1, "train:mfu": 0.25}
    # a validation step's line gives validation:loss only: `loss=` does not match inside `val_loss=`
    val_line = format_metric_line(40, val_loss=2.25)
    assert {name: float(m.group(1)) for name, regex in METRIC_REGEXES.items()
            if (m := re.search(regex, val_line))} == {"validation:loss": 2.25}
    assert set(METRICS) == set(values) | {"validation:loss"}
