"""What the cluster has installed, read before a TrainJob is submitted (docs/kubernetes.md,
"Versions the cluster must have").

smlaunch writes a TrainJob's pod settings as its own entry of `spec.runtimePatches`, which Kubeflow
Trainer has since v2.2 (v2.1 and older had `podTemplateOverrides`, and a TrainJob sent there would
lose its settings or be refused), and reads Kueue's Workloads as kueue.x-k8s.io/v1beta2, served
since Kueue v0.15. Kueue >= 0.17 needs `runtimePatches` too: with Trainer 2.1 it never unsuspends a
job (its own docs: "TrainJob CRD does not support the 'runtimePatches' field"). So before anything
is created the TrainJob's CustomResourceDefinition is read (the versions it serves, whether its spec
has `runtimePatches`), and where the job names a Kueue queue the Workload's: a cluster that cannot
run the job is refused naming what it has and what to install, instead of a job that never starts.

Reading a CustomResourceDefinition is a cluster-wide permission a namespace's user may lack: then
nothing is refused and the submit says that the versions were not checked. The labels Helm puts on
a chart's resources (`app.kubernetes.io/version`) name the release where they are there.
"""

# Imports inside functions: the kubernetes client is optional and heavy (launcher.kubernetes.cluster).
from __future__ import annotations

import json
from typing import Any

from launcher.backends.base import BackendError
from launcher.kubernetes.cluster import _reaching
from launcher.kubernetes.kinds import TRAIN_JOB

TRAINER_CRD = f"{TRAIN_JOB.plural}.{TRAIN_JOB.group}"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_CRD = f"workloads.{KUEUE_GROUP}"
INSTALL_TRAINER = "install Kubeflow Trainer v2.3 (docs/kubernetes.md, 'On a cluster')"
INSTALL_KUEUE = "install Kueue v0.15 or later, v0.19 as tested (docs/kubernetes.md, 'On a cluster')"
VERSION_LABEL = "app.kubernetes.io/version"


@_reaching
def read_crd(api: Any, name: str) -> dict | None:
    """The CustomResourceDefinition `name` as the API server gives it; None where it has none;
    PermissionError where this user may not read it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        answer = client.ApiextensionsV1Api(api).read_custom_resource_definition(name, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status in (401, 403):
            raise PermissionError(exc.reason) from None
        raise BackendError(f"reading CustomResourceDefinition {name}: the API server answered {exc.status} "
                           f"{exc.reason}") from None
    return json.loads(answer.data)


def check_cluster(api: Any, queued: bool) -> list[str]:
    """Refuse (BackendError) a cluster whose Kubeflow Trainer, or Kueue where the job is `queued`,
    cannot run a TrainJob as smlaunch writes it; the notes for the submit's output."""
    try:
        trainer = read_crd(api, TRAINER_CRD)
        kueue = read_crd(api, KUEUE_CRD) if queued else None
    except PermissionError as exc:
        return [f"the cluster's Kubeflow Trainer and Kueue versions were not checked: this user may not read "
                f"CustomResourceDefinitions ({exc}); smlaunch needs Trainer >= 2.2 and Kueue >= 0.15"]
    problems = trainer_problems(trainer) + (kueue_problems(kueue) if queued else [])
    if problems:
        raise BackendError("; ".join(problems))
    return []


def trainer_problems(crd: dict | None) -> list[str]:
    if crd is None:
        return [f"the cluster has no TrainJob resource ({TRAINER_CRD}): {INSTALL_TRAINER}"]
    served = _served(crd)
    if TRAIN_JOB.version not in served:
        return [f"the cluster's Kubeflow Trainer{_release(crd)} serves TrainJob as {', '.join(served) or 'nothing'}, "
                f"not {TRAIN_JOB.version}, which smlaunch writes: {INSTALL_TRAINER}"]
    if "runtimePatches" not in _spec_fields(crd, TRAIN_JOB.version):
        return [f"the cluster's Kubeflow Trainer{_release(crd)} has no TrainJob spec.runtimePatches (Trainer 2.1 or "
                f"older), where smlaunch puts its pods' settings, and which Kueue needs to start a job: "
                f"{INSTALL_TRAINER}"]
    return []


def kueue_problems(crd: dict | None) -> list[str]:
    if crd is None:
        return [f"kubernetes.queue is set, and the cluster has no Kueue ({KUEUE_CRD}): {INSTALL_KUEUE}, or "
                "remove kubernetes.queue"]
    served = _served(crd)
    if KUEUE_VERSION not in served:
        return [f"the cluster's Kueue{_release(crd)} serves Workloads as {', '.join(served) or 'nothing'}, not "
                f"{KUEUE_VERSION} (Kueue 0.14 or older), which smlaunch reads: {INSTALL_KUEUE}"]
    return []


def _served(crd: dict) -> list[str]:
    return [v["name"] for v in crd.get("spec", {}).get("versions", []) if v.get("served")]


def _spec_fields(crd: dict, version: str) -> set[str]:
    found = next((v for v in crd.get("spec", {}).get("versions", []) if v.get("name") == version), {})
    schema = found.get("schema", {}).get("openAPIV3Schema", {})
    return set(schema.get("properties", {}).get("spec", {}).get("properties", {}))


def _release(crd: dict) -> str:
    """' v2.1.0' where the resource's labels name the release, else ''."""
    version = crd.get("metadata", {}).get("labels", {}).get(VERSION_LABEL)
    return f" {version}" if version else ""
