"""The names a Kubernetes job's controllers make of its name, and whether they will take them: validate
checks the name a job will get (base_job_name and the timestamp), submit and the dry run the name given.

A TrainJob's name is its JobSet's: Kubeflow Trainer runs the job's `instance_count` pods as one Job
(replicas 1, the default) of the replicated job `node`, `parallelism` and `completions` being numNodes
(kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/jobset/jobset.go, Build and IdentifyPodNetwork;
pkg/constants/constants.go DefaultJobReplicas; manifests/base/runtimes/torch_distributed.yaml). JobSet's
webhook refuses a JobSet whose longest pod name, `<jobset>-<replicated job>-<job index>-<pod index>`
(placement.GenPodName) with the 5 characters the Job controller's generated suffix adds, is not a
DNS-1035 label: letters, digits and '-', starting with a letter, at most 63 characters
(kubernetes-sigs/jobset v0.12.0, pkg/webhooks/jobset_webhook.go ValidateCreate: "JobSet name is too long,
pod names generated for this JobSet will exceed 63 characters").

A HyperPodPyTorchJob's operator is not open source: AWS's SDK documents its name as a DNS label of 1-63
characters (sagemaker-hyperpod 3.12.0, common/config/metadata.py); that is what is checked.
"""

from __future__ import annotations

import re

from launcher.config.job_names import make_job_name
from launcher.wire.training.issues import Issue

TRAINER = "node"  # the replicated job, and its container, that Kubeflow's torch runtimes train in
# A name Kubernetes gives a TrainJob's JobSet, Jobs and Service (DNS-1035): SageMaker's may hold capitals.
DNS_1035_LABEL = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
MAX_LABEL = 63
POD_SUFFIX = "-xxxxx"  # what the Job controller's generateName adds to a pod's name (JobSet checks "-abcde")


def longest_pod_name(name: str, nodes: int) -> str:
    """The longest pod name JobSet makes of a TrainJob `name` of `nodes` nodes (its suffix as x's)."""
    return f"{name}-{TRAINER}-0-{nodes - 1}{POD_SUFFIX}"


def name_issue(name: str, kind: str, nodes: int, field: str = "job_name") -> Issue | None:
    """Why the controllers of a `kind` job of `nodes` nodes will refuse the name `name`, else None."""
    if not re.fullmatch(DNS_1035_LABEL, name):
        return Issue(field, name, f"is not a name Kubernetes gives a {kind}: lower-case letters, digits and '-', "
                     f"starting with a letter, at most {MAX_LABEL} characters", "set --job-name, or base_job_name, "
                     "to such a name")
    pod = longest_pod_name(name, nodes)
    if kind == "TrainJob" and len(pod) > MAX_LABEL:
        room = MAX_LABEL - (len(pod) - len(name))
        return Issue(field, name, f"is {len(name)} characters: JobSet names the job's last pod {pod} ({len(pod)} "
                     f"characters) and refuses a JobSet whose pod names pass {MAX_LABEL}",
                     f"use a job name of at most {room} characters for {nodes} node(s) (a base_job_name of at most "
                     f"{room - len(make_job_name('x')) + 1}, as a timestamp is appended)")
    return None


def planned_name_issue(base_job_name: str | None, default_base: str, kind: str, nodes: int) -> Issue | None:
    """name_issue of the name submit will make (base_job_name, else the default, and a timestamp), as
    base_job_name's issue."""
    issue = name_issue(make_job_name(base_job_name or default_base), kind, nodes, "base_job_name")
    if issue is None:
        return None
    shown = base_job_name or f"{default_base} (the default, from entry_point)"
    return Issue("base_job_name", shown, f"makes job names such as {issue.value}, which {issue.problem}", issue.fix)
