"""The wire format matches the SageMaker SDK v2 and the sagemaker-training toolkit (FACTS.md)."""

from __future__ import annotations

import json

from launcher import wire


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
    assert wire.distribution_from_hyperparameters(decoded) == {
        "torch_distributed": {"enabled": True},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 8, "context_parallel_degree": 8}}},
    }


def test_mpi_distribution_round_trip():
    decoded = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 8,
               "sagemaker_mpi_custom_mpi_options": "-verbose", "mp_parameters": '{"ddp": true}'}
    dist = wire.distribution_from_hyperparameters(decoded)
    assert dist["mpi"] == {"enabled": True, "processes_per_host": 8, "custom_mpi_options": "-verbose"}
    assert dist["smdistributed"]["modelparallel"]["parameters"] == {"ddp": True}


def test_split_reserved():
    user, reserved = wire.split_reserved({"lr": 1, "sagemaker_program": "t.py", "mp_parameters": {},
                                          "smlaunch_processes_per_host": 2})
    assert user == {"lr": 1}
    assert set(reserved) == {"sagemaker_program", "mp_parameters", "smlaunch_processes_per_host"}


def test_mask_secrets():
    masked = wire.mask_secrets({
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
