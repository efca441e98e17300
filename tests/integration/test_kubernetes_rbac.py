"""The example Role (configs/kubernetes/rbac.yaml) is what the Kubernetes backend needs: a job's whole
life against the fake API server (submit, status with a queued job's Kueue reason, logs, a watched
wait, metrics from its pods' logs, stop by suspending a queued job's Workload, stop by deletion) makes
only requests the Role allows, as the API server's authorizer reads a request: its verb (get, list,
watch, create, patch, delete), API group, resource and subresource (k8s.io/apiserver,
pkg/endpoints/request/requestinfo.go). The Role and its binding are valid Kubernetes objects."""

from __future__ import annotations

import copy
import json
import re
import threading
import time

import pytest
import yaml

from launcher.backends.kubernetes import KubernetesBackend
from tests.integration.test_kubernetes_backend import COMPLETE, NS, PLURALS, SUSPENDED, _cli, _job, kube  # noqa: F401
from tests.support.train_runs import ROOT

RBAC = ROOT / "configs" / "kubernetes" / "rbac.yaml"
PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?P<namespaced>/namespaces/[^/]+)?/(?P<resource>[^/]+)"
                  r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


def _attributes(method: str, path: str, query: dict) -> tuple[str, str, str]:
    """(verb, API group, resource[/subresource]) of a namespaced request, as the authorizer sees it;
    a cluster-scoped one's resource is `resource:name` (its rule names the objects)."""
    match = PATH.match(path)
    assert match, path
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    if not match["namespaced"]:
        resource += f":{match['name']}"
    if method == "GET":
        verb = "get" if match["name"] else ("watch" if query.get("watch") in ("true", "True", "1") else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return verb, match["group"] or "", resource


def _allowed(rules: list[dict], verb: str, group: str, resource: str) -> bool:
    resource, _, name = resource.partition(":")
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               and (not name or name in r.get("resourceNames", [name])) for r in rules)


def _role(kind: str = "Role") -> dict:
    return next(doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc["kind"] == kind)


def _a_jobs_life(server, tmp_path, kind: str) -> None:
    """Every command the backend has, on a queued job (stopped through its Workload) and a deleted one."""
    job = {**_job(kind=kind), "metric_definitions": [{"Name": "loss", "Regex": r"loss ([0-9.]+)"}]}
    job["kubernetes"] = {**job["kubernetes"], "on_stop": "suspend"}
    (tmp_path / "queued.json").write_text(json.dumps(job))
    assert _cli("submit", str(tmp_path / "queued.json"), "--job-name", "k-1", "--no-wait").exit_code == 0
    server.set_conditions(NS, "k-1", SUSPENDED)
    server.add_workload(NS, "k-1", ("QuotaReserved", "False", "Pending", "waiting for quota"))
    assert _cli("status", "kubernetes:k-1").exit_code == 0
    pod = server.add_pod(NS, "k-1", 0)
    server.log(NS, pod, "step 1 loss 4.2")
    assert _cli("logs", "kubernetes:k-1").exit_code == 0
    assert _cli("metrics", "kubernetes:k-1").exit_code == 0
    assert _cli("stop", "kubernetes:k-1").exit_code == 0  # through the Workload

    job["kubernetes"] = {**job["kubernetes"], "on_stop": "delete"}
    (tmp_path / "deleted.json").write_text(json.dumps(job))
    assert _cli("submit", str(tmp_path / "deleted.json"), "--job-name", "k-2", "--no-wait").exit_code == 0
    waiter = threading.Thread(target=lambda: KubernetesBackend().wait("k-2", logs=False, poll=30))
    waiter.start()
    time.sleep(0.5)
    server.set_conditions(NS, "k-2", COMPLETE)
    waiter.join(15)
    assert not waiter.is_alive()
    assert _cli("list", "--backend", "kubernetes").exit_code == 0
    _cli("submit", str(tmp_path / "deleted.json"), "--job-name", "k-3", "--no-wait")
    assert _cli("stop", "kubernetes:k-3").exit_code == 0  # deleted: the job, its ConfigMap and Secret


@pytest.mark.parametrize("kind", list(PLURALS))
def test_the_example_role_allows_every_request_a_jobs_life_makes(kube, tmp_path, kind):  # noqa: F811
    _a_jobs_life(kube, tmp_path, kind)
    made = {_attributes(*request) for request in kube.requests}
    rules = _role()["rules"] + _role("ClusterRole")["rules"]
    assert [a for a in made if not _allowed(rules, *a)] == []
    # every verb the backend has was used, so the check covered it
    assert {v for v, _, _ in made} == {"create", "get", "list", "watch", "patch", "delete"}
    # the control: a Role without the Workloads' rule refuses what a queued job's stop sends
    narrower = [r for r in copy.deepcopy(rules) if r["apiGroups"] != ["kueue.x-k8s.io"]]
    assert ("patch", "kueue.x-k8s.io", "workloads") in [a for a in made if not _allowed(narrower, *a)]
    # and one whose ClusterRole names no object refuses submit's version check (kind TrainJob makes it)
    unnamed = [{**r, "resourceNames": ["other.example.com"]} if "resourceNames" in r else r for r in rules]
    checks = [a for a in made if a[1] == "apiextensions.k8s.io"]
    assert (checks != []) == (kind == "TrainJob") and not any(_allowed(unnamed, *a) for a in checks)


@pytest.mark.parametrize("version", ["1.32", "1.37"])
def test_the_role_and_its_binding_are_valid_kubernetes_objects(version):
    from kubernetes_validate import ValidationError
    from kubernetes_validate.utils import validate

    docs = list(yaml.safe_load_all(RBAC.read_text()))
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
    for doc in docs:
        validate(doc, version, strict=True)
    broken = {**docs[0], "rules": [{"apiGroups": [""], "resources": "pods", "verbs": ["get"]}]}  # the control
    with pytest.raises(ValidationError):
        validate(broken, version, strict=True)
