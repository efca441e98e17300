"""SageMaker jobs under moto: a validated job, moto's record of it, CloudWatch log streams."""

from __future__ import annotations

from pathlib import Path

from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends

from launcher.backends.cwlogs import LOG_GROUP
from launcher.config import validate_job

ROOT = Path(__file__).resolve().parents[2]


REGION = "us-east-1"


BUCKET = "smlaunch-test-bucket"


ROLE = "arn:aws:iam::111122223333:role/SageMakerExecutionRole"


def make_job(**fields):
    data = {
        "entry_point": "train.py",
        "source_dir": str(ROOT / "entrypoints"),
        "role": ROLE,
        "region": REGION,
        "instance_type": "ml.m5.xlarge",
        "output_path": f"s3://{BUCKET}/output/",
        "hyperparameters": {"max_steps": 3, "model_type": "llama_v2"},
    }
    data.update(fields)
    data["hyperparameters"] = {"model_preset": "llama3-tiny", **data["hyperparameters"]}  # train.py needs a model
    data = {k: v for k, v in data.items() if v is not None}
    return validate_job(data, base_dir=ROOT)


def moto_job(name: str):
    return sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].training_jobs[name]


def set_status(name: str, status: str, reason: str | None = None) -> None:
    job = moto_job(name)
    job.training_job_status = status
    job.secondary_status = status
    if reason is not None:
        job.failure_reason = reason  # moto renders every attribute, so this becomes FailureReason


def put_logs(session, job: str, host: int, events: list[tuple[int, str]], epoch: int = 1700000000) -> str:
    logs = session.client("logs")
    try:
        logs.create_log_group(logGroupName=LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    stream = f"{job}/algo-{host}-{epoch}"
    logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream,
                        logEvents=[{"timestamp": t, "message": m} for t, m in events])
    return stream
