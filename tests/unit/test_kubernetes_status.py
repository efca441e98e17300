"""A TrainJob's conditions and pods as smlaunch's statuses (launcher.kubernetes.status), with the
conditions, reasons and pod metadata the sources write: Kubeflow Trainer v2.3.0
(pkg/apis/trainer/v1alpha1/trainjob_types.go, pkg/controller/trainjob_controller.go), JobSet v0.12.0
(pkg/constants/constants.go) and Kubernetes' Job controller (the completion index annotation)."""

from __future__ import annotations

import pytest

from launcher.kubernetes.status import host_of, job_status

INDEX = "batch.kubernetes.io/job-completion-index"


def _job(*conditions: tuple[str, str, str, str], suspend: bool = False) -> dict:
    return {"spec": {"suspend": suspend}, "status": {"conditions": [
        {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}}


def test_a_pods_host_is_its_completion_index_annotation_or_label():
    annotated = {"metadata": {"name": "k-1-node-0-1-abcde", "annotations": {INDEX: "1"}}}
    labelled = {"metadata": {"name": "k-1-node-0-2-abcde", "labels": {INDEX: "2"}}}
    assert (host_of(annotated), host_of(labelled)) == ("algo-2", "algo-3")
    assert host_of({"metadata": {"name": "stray"}}) == "stray"  # the control: no index, its own name


@pytest.mark.parametrize("conditions, status, secondary", [
    ((("Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline"),), "Failed", "Failed"),
    ((("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures"),), "Failed", "Failed"),
    ((("Complete", "True", "AllJobsCompleted", "jobset completed successfully"),), "Completed", "Completed"),
    ((("Suspended", "True", "Suspended", "TrainJob is suspended"),), "InProgress", "Pending"),
    ((("Suspended", "False", "Resumed", "TrainJob is resumed"),), "InProgress", "Starting"),  # the control
])
def test_the_trainers_conditions_read_as_smlaunchs_statuses(conditions, status, secondary):
    said = job_status(_job(*conditions), [])
    assert (said["TrainingJobStatus"], said["SecondaryStatus"]) == (status, secondary)
    assert conditions[0][2] in said["StatusMessage"] or secondary == "Starting"


def test_a_deadline_is_said_with_the_trainers_reason():
    said = job_status(_job(("Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline")), [])
    assert said["FailureReason"] == "DeadlineExceeded: TrainJob exceeded its active deadline"


def test_a_resumed_trainjob_that_shows_created_again_is_read_from_its_pods():
    """kubeflow/sdk #803: after a resume a TrainJob's newest condition can be Created again; the pods
    say whether it trains (the control: without running pods it is starting)."""
    resumed = _job(("Suspended", "False", "Resumed", "TrainJob is resumed"),
                   ("Created", "True", "JobSetCreated", "JobSet is created"))
    running = [{"metadata": {"name": "k-1-node-0-0-x", "annotations": {INDEX: "0"}}, "status": {"phase": "Running"}}]
    assert job_status(resumed, running)["SecondaryStatus"] == "Training"
    assert job_status(resumed, [])["SecondaryStatus"] == "Starting"
