"""The official SageMaker SDK v2 (the `sagemaker` extra) and smlaunch's estimator, side by side.

Both estimators get the same arguments and submit against one moto account; the CreateTrainingJob
request each sends is caught as botocore builds it (and the call is stopped there), and the code
archive each uploaded is read back from moto's S3 with its encryption settings.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's account
ROLE = "arn:aws:iam::111122223333:role/SageMakerRole"
JOB = "parity-1"


class Sent(Exception):
    """Raised from the request hook: the request is captured and nothing reaches moto's SageMaker."""


@dataclass
class Submission:
    request: dict
    upload: dict  # the PutObject parameters of the code archive (Body left out), or {}


@contextmanager
def aws(monkeypatch):
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION, "SAGEMAKER_SUPPRESS_V2_WARNING": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield


def _session() -> tuple[boto3.Session, dict, dict]:
    request: dict = {}
    upload: dict = {}
    session = boto3.Session(region_name=REGION)

    def grab(params, **_):
        request.update(params)
        raise Sent

    def grab_upload(params, **_):
        if params.get("Key", "").endswith("sourcedir.tar.gz"):
            upload.update({k: v for k, v in params.items() if k not in ("Body", "ChecksumAlgorithm")})

    session.events.register("provide-client-params.sagemaker.CreateTrainingJob", grab)
    session.events.register("provide-client-params.sagemaker.CreateHyperParameterTuningJob", grab)
    session.events.register("provide-client-params.s3.PutObject", grab_upload)
    return session, request, upload


def sdk_submit(args: dict, inputs: Any = None, job_name: str = JOB, **fit: Any) -> Submission:
    import sagemaker
    from sagemaker.pytorch import PyTorch

    session, request, upload = _session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = PyTorch(sagemaker_session=sagemaker.Session(boto_session=session), **args)
        try:
            est.fit(inputs, wait=False, logs=False, job_name=job_name, **fit)
        except Sent:
            pass
    return Submission(request, upload)


def ours_submit(args: dict, inputs: Any = None, job_name: str = JOB, **fit: Any) -> Submission:
    from launcher import PyTorch

    session, request, upload = _session()
    est = PyTorch(session=session, **args)
    try:
        est.fit(inputs, wait=False, logs=False, job_name=job_name, force=True, **fit)
    except Sent:
        pass
    return Submission(request, upload)


def sdk_tune(args: dict, tuner: dict, inputs: Any = None, job_name: str = JOB) -> Submission:
    """The SDK's HyperparameterTuner over its PyTorch estimator; `tuner` holds its other arguments
    (and `instance_configs`, given to override_resource_config)."""
    import sagemaker
    from sagemaker.pytorch import PyTorch
    from sagemaker.tuner import HyperparameterTuner

    session, request, upload = _session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = PyTorch(sagemaker_session=sagemaker.Session(boto_session=session), **args)
        tuner = dict(tuner)
        instances = tuner.pop("instance_configs", None)
        made = HyperparameterTuner(est, **tuner)
        if instances is not None:
            made.override_resource_config(instances)
        try:
            made.fit(inputs, job_name=job_name, wait=False)
        except Sent:
            pass
    return Submission(request, upload)


def ours_tune(args: dict, tuner: dict, inputs: Any = None, job_name: str = JOB) -> Submission:
    from launcher import HyperparameterTuner, PyTorch

    session, request, upload = _session()
    est = PyTorch(session=session, **args)
    tuner = dict(tuner)
    instances = tuner.pop("instance_configs", None)
    made = HyperparameterTuner(est, **tuner)
    if instances is not None:
        made.override_resource_config(instances)
    try:
        made.fit(inputs, job_name=job_name, wait=False, force=True)
    except Sent:
        pass
    return Submission(request, upload)


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Every field where two requests differ, as 'path: ours != theirs'."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = []
        for key in sorted(set(ours) | set(theirs)):
            where = f"{path}.{key}" if path else key
            if key not in ours:
                out.append(f"{where}: missing in ours (SDK: {theirs[key]!r})")
            elif key not in theirs:
                out.append(f"{where}: extra in ours ({ours[key]!r})")
            else:
                out += differences(ours[key], theirs[key], where)
        return out
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(ours, theirs)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if ours == theirs else [f"{path}: {ours!r} != SDK {theirs!r}"]
