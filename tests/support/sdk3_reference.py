"""The official SageMaker SDK v3 `ModelTrainer`, run in its own virtual environment (.venv-sdk3).

SDK v3 (`sagemaker-train`, on `sagemaker-core` 2.x) cannot share a venv with the SDK v2 the rest of
the suite compares with (both are the `sagemaker` package, on sagemaker-core 1.x and 2.x), so
tests/integration/test_model_trainer_parity.py runs this file as a script with .venv-sdk3's Python. It reads a
job spec (JSON, on stdin), builds the SDK's own config objects from it, calls
`ModelTrainer.train(wait=False)` against the moto server the test started (AWS_ENDPOINT_URL),
catches the CreateTrainingJob request as botocore builds it (nothing reaches moto's SageMaker),
and prints the request and the driver files of the `sm_drivers` channel as JSON.

`build` is shared: the test builds smlaunch's objects from the same spec with it. This file
imports only the standard library at module level, so both interpreters can load it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

REGION = "us-east-1"
ROLE_NAME = "SageMakerRole"
ROLE = f"arn:aws:iam::123456789012:role/{ROLE_NAME}"  # moto's account, where the role is created
# The SDK finds its default bucket name with an STS client whose endpoint it sets itself, past
# AWS_ENDPOINT_URL; the Session is given the name that call would return for moto's account.
DEFAULT_BUCKET = f"sagemaker-{REGION}-123456789012"
# The shapes a ModelTrainer argument takes, by argument name.
SHAPES = {"source_code": "SourceCode", "compute": "Compute", "networking": "Networking",
          "stopping_condition": "StoppingCondition", "output_data_config": "OutputDataConfig",
          "checkpoint_config": "CheckpointConfig"}
# What the SDK's telemetry would send to AWS is switched off the documented way (SDK defaults).
TELEMETRY_OFF = "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"


class Sent(Exception):
    """Raised from the request hook: the request is captured and nothing reaches moto's SageMaker."""


def build(spec: Mapping[str, Any], classes: Mapping[str, Any]) -> dict[str, Any]:
    """ModelTrainer keyword arguments from a JSON spec, made of `classes` (the SDK's or smlaunch's).

    `distributed` is {"kind": "Torchrun" | "MPI", ...fields}, its `smp` the SMP fields;
    `input_data_config` a list of InputData fields."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key in SHAPES:
            out[key] = classes[SHAPES[key]](**value)
        elif key == "distributed":
            fields = {k: v for k, v in value.items() if k != "kind"}
            if "smp" in fields:
                fields["smp"] = classes["SMP"](**fields["smp"])
            out[key] = classes[value["kind"]](**fields)
        elif key == "input_data_config":
            out[key] = channels(value, classes)
        else:
            out[key] = value
    return out


def channels(spec: list[Mapping[str, Any]], classes: Mapping[str, Any]) -> list[Any]:
    return [classes["InputData"](**channel) for channel in spec]


def _sdk_classes() -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # sagemaker.train.configs is a shim in 1.27
        from sagemaker.train import configs, distributed
    names = [*SHAPES.values(), "InputData"]
    return {**{n: getattr(configs, n) for n in names},
            **{n: getattr(distributed, n) for n in ("Torchrun", "MPI", "SMP")}}


def _driver_files(boto_session: Any, request: dict) -> dict[str, Any]:
    """The sm_drivers channel: its object names, and the JSON files its driver reads."""
    channel = next(c for c in request.get("InputDataConfig", []) if c["ChannelName"] == "sm_drivers")
    bucket, _, prefix = channel["DataSource"]["S3DataSource"]["S3Uri"].removeprefix("s3://").partition("/")
    s3 = boto_session.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    names = sorted(k.removeprefix(prefix).lstrip("/") for k in keys)

    def read(name: str) -> Any:
        return json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{name}")["Body"].read())

    return {"files": names, "distributed.json": read("distributed.json"),
            "sourcecode.json": read("sourcecode.json")}


def submit(spec: Mapping[str, Any], boto_session: Any, classes: Mapping[str, Any], request: dict) -> dict[str, Any]:
    """One job: ModelTrainer(**trainer).train(train_inputs), caught at CreateTrainingJob into `request`."""
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.train.model_trainer import ModelTrainer

    request.clear()
    trainer = ModelTrainer(sagemaker_session=Session(boto_session=boto_session, default_bucket=DEFAULT_BUCKET),
                           **build(spec["trainer"], classes))
    try:
        trainer.train(input_data_config=channels(spec.get("train_inputs", []), classes) or None,
                      wait=False, logs=False)
    except Sent:
        pass
    return {"request": dict(request), "sm_drivers": _driver_files(boto_session, request)}


def _tuner_args(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The SDK v3 tuner's arguments from a JSON spec: ranges as {name: {"kind", ...}}, `warm_start`,
    `hyperband` and `completion` as the fields of the SDK v3's shapes."""
    from sagemaker.core import parameter, shapes

    kinds = {"continuous": parameter.ContinuousParameter, "integer": parameter.IntegerParameter}
    args = {k: v for k, v in spec.items() if k not in ("ranges", "warm_start", "hyperband", "completion")}
    args["hyperparameter_ranges"] = {
        name: parameter.CategoricalParameter(r["values"]) if r["kind"] == "categorical"
        else kinds[r["kind"]](r["min_value"], r["max_value"], r.get("scaling_type", "Auto"))
        for name, r in spec["ranges"].items()}
    if "warm_start" in spec:
        args["warm_start_config"] = shapes.HyperParameterTuningJobWarmStartConfig(
            warm_start_type=spec["warm_start"]["type"], parent_hyper_parameter_tuning_jobs=[
                shapes.ParentHyperParameterTuningJob(hyper_parameter_tuning_job_name=p)
                for p in spec["warm_start"]["parents"]])
    if "hyperband" in spec:
        args["strategy_config"] = shapes.HyperParameterTuningJobStrategyConfig(
            hyperband_strategy_config=shapes.HyperbandStrategyConfig(**spec["hyperband"]))
    if "completion" in spec:
        c = spec["completion"]
        args["completion_criteria_config"] = shapes.TuningJobCompletionCriteria(
            target_objective_metric_value=c["target"],
            best_objective_not_improving=shapes.BestObjectiveNotImproving(
                max_number_of_training_jobs_not_improving=c["not_improving"]),
            convergence_detected=shapes.ConvergenceDetected(complete_on_convergence=c["convergence"]))
    return args


def tune(spec: Mapping[str, Any], boto_session: Any, classes: Mapping[str, Any], request: dict) -> dict[str, Any]:
    """One sweep: HyperparameterTuner(model_trainer=ModelTrainer(**trainer), **tuner).tune(), caught at
    CreateHyperParameterTuningJob into `request`."""
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.train.model_trainer import ModelTrainer
    from sagemaker.train.tuner import HyperparameterTuner

    request.clear()
    trainer = ModelTrainer(sagemaker_session=Session(boto_session=boto_session, default_bucket=DEFAULT_BUCKET),
                           **build(spec["trainer"], classes))
    tuner = HyperparameterTuner(model_trainer=trainer, **_tuner_args(spec["tuner"]))
    try:
        tuner.tune(job_name=spec.get("job_name"), wait=False)
    except Sent:
        pass
    return {"request": dict(request)}


def main() -> None:
    """stdin: {name: {"trainer": spec, "train_inputs": [...]}} (with "tuner": a sweep); stdout:
    {name: submit's (or tune's) answer}."""
    jobs = json.load(sys.stdin)
    import boto3

    boto_session = boto3.Session(region_name=REGION)
    request: dict = {}

    def grab(params: dict, **_: Any) -> None:
        request.update(params)
        raise Sent

    # Before any client exists: a client copies the session's handlers when it is made, and the
    # SDK keeps its SageMaker client for the session's life.
    boto_session.events.register("provide-client-params.sagemaker.CreateTrainingJob", grab)
    boto_session.events.register("provide-client-params.sagemaker.CreateHyperParameterTuningJob", grab)
    iam = boto_session.client("iam")
    if not any(r["RoleName"] == ROLE_NAME for r in iam.list_roles()["Roles"]):
        iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "sagemaker.amazonaws.com"}}]}))
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "config.yaml")
        with open(config, "w") as f:
            f.write(TELEMETRY_OFF)
        os.environ["SAGEMAKER_USER_CONFIG_OVERRIDE"] = config
        classes = _sdk_classes()
        out = {name: (tune if "tuner" in spec else submit)(spec, boto_session, classes, request)
               for name, spec in jobs.items()}
    print(json.dumps(out, default=str))

if __name__ == "__main__":
    main()
