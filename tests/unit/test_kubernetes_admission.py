"""What a Kubernetes cluster's controllers will take from a job, checked before anything is sent: the
names JobSet makes of a TrainJob's name (launcher.config.backends.kubernetes_names), and a secret that
could only go in clear (launcher.kubernetes.render)."""

from __future__ import annotations

import pytest

from launcher.backends.base import SettingError
from launcher.config import validate_job
from launcher.config.backends.kubernetes_names import name_issue, planned_name_issue
from launcher.config.issues import ConfigError
from launcher.kubernetes.render import render
from tests.unit.test_kubernetes_manifest import JOB, SECTION


def _said(job: dict) -> dict[str, tuple[str, str]]:
    try:
        validated = validate_job(job)
    except ConfigError as exc:
        return {i.path: (i.level, i.problem) for i in exc.issues}
    return {i.path: (i.level, i.problem) for i in validated.warnings}


# The timestamp make_job_name appends is 24 characters ("-2026-11-28-22-12-42-905").
@pytest.mark.parametrize(("name_length", "nodes", "refused"), [
    (48, 2, False), (49, 2, True), (63, 2, True), (47, 11, False), (48, 11, True)])
def test_a_train_jobs_name_is_checked_by_the_pod_names_jobset_makes(name_length, nodes, refused):
    name = "j" * name_length
    issue = name_issue(name, "TrainJob", nodes)
    assert (issue is not None) == refused
    if refused:
        assert f"{name}-node-0-{nodes - 1}-xxxxx" in issue.problem and f"{len(name) + 15 + len(str(nodes - 1)) - 1}" \
            " characters" in issue.problem
    assert name_issue(name, "HyperPodPyTorchJob", nodes) is None  # its operator's names: the job's 63


def test_validate_and_the_dry_run_check_the_names_the_job_will_get():
    assert planned_name_issue("b" * 24, "smlaunch-train", "TrainJob", 2) is None  # the control
    issue = planned_name_issue("b" * 25, "smlaunch-train", "TrainJob", 2)
    assert issue.path == "base_job_name" and "a base_job_name of at most 24" in issue.fix
    assert _said({**JOB, "base_job_name": "b" * 25})["base_job_name"][0] == "error"
    assert "base_job_name" not in _said({**JOB, "base_job_name": "b" * 24})
    job = validate_job(JOB)
    with pytest.raises(ConfigError, match="JobSet names the job's last pod"):
        render(job, "j" * 49)
    assert render(job, "j" * 48).name == "j" * 48


def test_a_secret_that_could_only_go_in_clear_is_refused():
    """What cannot go by reference to the Secret (a password in the storage's S3 URI, which every pod
    is given in pod.json) is refused rather than sent in clear; the control: the same job without it."""
    section = {**SECTION, "storage": {"s3": "s3://u:pw12345@bucket/jobs"}}
    job = validate_job({**JOB, "kubernetes": section, "inputs": {"train": "s3://bucket/data"}})
    with pytest.raises(SettingError, match=r"data\.pod\.json\.s3\.checkpoints of the ConfigMap j-1-smlaunch would "
                                           r"hold a secret in clear \(s3://u:\*\*\*\*@bucket/jobs/j-1/checkpoints\)"):
        render(job, "j-1")
    plain = validate_job({**JOB, "kubernetes": {**section, "storage": {"s3": "s3://bucket/jobs"}},
                          "inputs": {"train": "s3://bucket/data"}})
    assert [o["kind"] for o in render(plain, "j-1").objects] == ["Secret", "ConfigMap", "TrainJob"]
