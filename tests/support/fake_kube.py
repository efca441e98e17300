"""A Kubernetes API server on 127.0.0.1 that speaks enough of the REST protocol for the official
`kubernetes` client to drive smlaunch's Kubernetes backend: create, get, list (label selectors), watch
(a chunked stream of events) and delete of Secrets, ConfigMaps, Kubeflow Trainer's TrainJobs and
SageMaker HyperPod's HyperPodPyTorchJobs; pods listed by label; a pod's log read or followed (a chunked
stream that ends when the container does).

No controller runs: a test plays Kubeflow Trainer, JobSet, HyperPod's training operator and Kueue by
setting a job's conditions and adding the pods with their logs (`FakeKube.set_conditions`, `add_pod`,
`log`, `end_pod`), labelled as each controller labels them, and the
garbage collector by ending a foreground deletion (`collect_garbage`).

What it answers as the real API server does (k8s.io/apiserver's REST handlers): an error is a
`Status` object (kind, code, reason, message, details); a deletion answers a `Status` for a core
object, and for a TrainJob deleted with propagationPolicy=Foreground the object itself, which stays
(metadata.deletionTimestamp, finalizer `foregroundDeletion`, a MODIFIED event) until its dependents
are gone; a patch is applied by its content type (merge patch, JSON patch; a strategic merge patch
of a custom resource is 415); a watch streams one `{"type", "object"}` JSON line per event.

Why not a package: of PyPI's Kubernetes mock servers, kmock (0.8, alpha) serves through aiohttp in
an event loop its pytest plugin owns, and mockernetes patches the client instead of serving HTTP; the
point here is the client's real requests over a socket.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

COLLECTION = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+/[^/]+))/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
                        r"(?:/(?P<name>[^/]+))?(?P<log>/log)?$")
KINDS = {"secrets": "Secret", "configmaps": "ConfigMap", "pods": "Pod", "trainjobs": "TrainJob",
         "hyperpodpytorchjobs": "HyperPodPyTorchJob", "workloads": "Workload"}
JOBS = ("trainjobs", "hyperpodpytorchjobs")
CUSTOM = {*JOBS, "workloads"}  # custom resources: no strategic merge patch, the object back from a delete
# What Kubernetes' Job controller and JobSet put on a pod of the TrainJob's trainer job.
INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME, REPLICATED_JOB = "jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name"
CRD_PATH = re.compile(r"^/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions/(?P<name>[^/]+)$")


def crd(name: str, versions: dict[str, list[str]], release: str | None = None) -> dict:
    """A CustomResourceDefinition as the API server gives it: each served version with the fields
    its spec's schema has (`versions`: name -> spec fields), Helm's version label where `release`."""
    labels = {"app.kubernetes.io/version": release} if release else {}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "labels": labels},
            "spec": {"versions": [{"name": v, "served": True, "storage": i == len(versions) - 1,
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                                       "type": "object", "properties": {f: {"type": "object"} for f in fields}}}}}}
                                  for i, (v, fields) in enumerate(versions.items())]}}


# The cluster these tests model (docs/kubernetes.md, "On a cluster"): Kubeflow Trainer v2.3, Kueue v0.19.
TRAINER_2_3 = crd("trainjobs.trainer.kubeflow.org", {"v1alpha1": ["runtimeRef", "trainer", "runtimePatches",
                                                                   "suspend", "managedBy"]}, "v2.3.0")
TRAINER_2_1 = crd("trainjobs.trainer.kubeflow.org", {"v1alpha1": ["runtimeRef", "trainer", "podTemplateOverrides",
                                                                   "suspend", "managedBy"]}, "v2.1.0")
KUEUE_0_19 = crd("workloads.kueue.x-k8s.io", {"v1beta1": ["podSets", "active"], "v1beta2": ["podSets", "active"]})
KUEUE_0_14 = crd("workloads.kueue.x-k8s.io", {"v1beta1": ["podSets", "active"]}, "v0.14.4")


@dataclass
class _Pod:
    logs: list[str] = field(default_factory=list)
    started: bool = True  # the container has started (its log can be read)
    ended: bool = False  # the container has ended (a followed log closes)


class FakeKube:
    """The server's state, and what a test does to it."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}  # (plural, namespace, name) -> object
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, query) of every request
        self.deleted: list[tuple[str, str, str, str | None]] = []  # (plural, ns, name, propagationPolicy)
        self.patches: list[tuple[str, str, str, str, dict]] = []  # (plural, ns, name, content type, patch)
        self.refuse: set[str] = set()  # plurals whose collection the server does not have (no CRD: 404)
        self.crds = {c["metadata"]["name"]: c for c in (TRAINER_2_3, KUEUE_0_19)}  # what a CRD read finds
        self.crds_forbidden = False  # a user without the cluster-wide right to read them (403)
        self.changed = threading.Condition()
        self.events: list[tuple[str, str, dict]] = []  # (plural, type, object) for watchers
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeKube:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.changed:
            for pod in self.pods.values():
                pod.ended = True
            self.changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(json.dumps({  # JSON is YAML: the client reads it as a kubeconfig
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}]}))
        return path

    # --- what a test does as the cluster's controllers ------------------------------------------
    def get(self, plural: str, namespace: str, name: str) -> dict | None:
        return self.objects.get((plural, namespace, name))

    def job_plural(self, namespace: str, name: str) -> str:
        """The plural (trainjobs, hyperpodpytorchjobs) of the job `name`."""
        return next(p for p in JOBS if (p, namespace, name) in self.objects)

    def set_conditions(self, namespace: str, name: str, *conditions: tuple[str, str, str]) -> None:
        """The job's conditions, each (type, reason, message) with status True, a second apart in order."""
        plural = self.job_plural(namespace, name)
        job = self.objects[(plural, namespace, name)]
        job["status"] = {"conditions": [{"type": t, "status": "True", "reason": r, "message": m,
                                         "lastTransitionTime": f"2026-11-27T12:00:{i:02d}Z"}
                                        for i, (t, r, m) in enumerate(conditions)]}
        self._event(plural, "MODIFIED", job)

    def add_workload(self, namespace: str, job: str, *conditions: tuple[str, str, str, str]) -> None:
        """Kueue's Workload of TrainJob `job` (labelled with its uid), each condition (type, status, reason,
        message)."""
        uid = self.objects[(self.job_plural(namespace, job), namespace, job)]["metadata"]["uid"]
        name = f"trainjob-{job}-{uid[:5]}"
        self.objects[("workloads", namespace, name)] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/job-uid": uid}},
            "status": {"conditions": [{"type": t, "status": st, "reason": r, "message": m,
                                       "lastTransitionTime": "2026-11-27T12:00:00Z"} for t, st, r, m in conditions]}}

    def add_pod(self, namespace: str, job: str, index: int, phase: str = "Running", started: bool = True,
                exit_code: int | None = None, reason: str | None = None, replicated_job: str = "node",
                start_time: str = "2026-11-27T12:00:00Z") -> str:
        """A pod of the job at node rank `index`, labelled as its controller labels it (a TrainJob's
        JobSet: its name, its replicated job's (the trainer's `node`, or an initializer's) and the
        completion index; HyperPod's operator: HPJob, as AWS's SDK selects them), and the kubelet's
        status.startTime `start_time`; its name."""
        name = f"{job}-{replicated_job}-0-{index}-{uuid.uuid4().hex[:5]}"
        hyperpod = self.job_plural(namespace, job) == "hyperpodpytorchjobs"
        labels = ({"HPJob": job} if hyperpod else {JOBSET_NAME: job, REPLICATED_JOB: replicated_job, INDEX: str(index)})
        annotations = {} if hyperpod else {JOBSET_NAME: job, INDEX: str(index)}
        ended = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error")}
        state = ({"terminated": ended} if exit_code is not None else {"running": {}} if started
                 else {"waiting": {"reason": "PodInitializing"}})
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": labels,
            "annotations": annotations},
            "spec": {"containers": [{"name": "node", "image": "smlaunch"}]},
            "status": {"phase": phase, "startTime": start_time,
                       "containerStatuses": [{"name": "node", "ready": phase == "Running",
                                                              "restartCount": 0, "image": "smlaunch",
                                                              "imageID": "", "state": state}]}}
        with self.changed:
            self.objects[("pods", namespace, name)] = pod
            self.pods[(namespace, name)] = _Pod(started=started, ended=exit_code is not None)
            self.changed.notify_all()
        return name

    def log(self, namespace: str, pod: str, *lines: str) -> None:
        with self.changed:
            self.pods[(namespace, pod)].logs.extend(lines)
            self.pods[(namespace, pod)].started = True
            self.changed.notify_all()

    def end_pod(self, namespace: str, pod: str) -> None:
        with self.changed:
            self.pods[(namespace, pod)].ended = True
            self.changed.notify_all()

    def collect_garbage(self) -> None:
        """Play the garbage collector: each object deleted in the foreground goes, with its JobSet's pods."""
        for key, obj in list(self.objects.items()):
            if "foregroundDeletion" in obj["metadata"].get("finalizers", []):
                plural, namespace, name = key
                with self.changed:
                    for pod in [k for k, o in self.objects.items() if k[0] == "pods" and k[1] == namespace
                                and name in (o["metadata"]["labels"].get(label) for label in (JOBSET_NAME, "HPJob"))]:
                        self.pods[pod[1:]].ended = True
                        self._event("pods", "DELETED", self.objects.pop(pod))
                    del self.objects[key]
                    obj["metadata"]["finalizers"].remove("foregroundDeletion")
                    self._event(plural, "DELETED", obj)

    def _event(self, plural: str, kind: str, obj: dict) -> None:
        with self.changed:
            obj["metadata"]["resourceVersion"] = str(len(self.events) + 1)
            self.events.append((plural, kind, json.loads(json.dumps(obj))))
            self.changed.notify_all()


def _handler(kube: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the test's output is the client's
            pass

        def _route(self):
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            kube.requests.append((self.command, url.path, query))
            length = int(self.headers.get("Content-Length") or 0)  # read whatever the answer: the connection is kept
            self.body = json.loads(self.rfile.read(length)) if length else {}
            if (definition := CRD_PATH.match(url.path)) and self.command == "GET":
                self._crd(definition["name"])
                return None
            match = COLLECTION.match(url.path)
            if match is None or match["plural"] not in KINDS or match["plural"] in kube.refuse:
                self._status(404, "NotFound", "the server could not find the requested resource")
                return None
            return match, query

        def _crd(self, name: str) -> None:
            if kube.crds_forbidden:
                self._status(403, "Forbidden", f'customresourcedefinitions.apiextensions.k8s.io "{name}" is '
                             'forbidden: User "fake" cannot get resource "customresourcedefinitions" at the '
                             "cluster scope")
            elif name not in kube.crds:
                self._not_found("customresourcedefinitions.apiextensions.k8s.io", name)
            else:
                self._json(200, kube.crds[name])

        # --- replies ----------------------------------------------------------------------
        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
            self._json(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "details": details or {}, "code": code})

        def _not_found(self, plural: str, name: str) -> None:
            self._status(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _start_stream(self, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        # --- verbs ------------------------------------------------------------------------
        def do_POST(self):
            routed = self._route()
            if routed is None:
                return
            match, _ = routed
            obj = self.body
            key = (match["plural"], match["ns"], obj["metadata"]["name"])
            if key in kube.objects:
                self._status(409, "AlreadyExists", f'{match["plural"]} "{key[2]}" already exists')
                return
            obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp="2026-11-27T12:00:00Z", generation=1)
            kube.objects[key] = obj
            kube._event(match["plural"], "ADDED", obj)
            self._json(201, obj)

        def do_GET(self):
            routed = self._route()
            if routed is None:
                return
            match, query = routed
            if match["log"]:
                self._log(match["ns"], match["name"], query)
            elif match["name"]:
                obj = kube.get(match["plural"], match["ns"], match["name"])
                if obj is None:
                    self._not_found(match["plural"], match["name"])
                else:
                    self._json(200, obj)
            elif query.get("watch") in ("true", "1"):
                self._watch(match["plural"], match["ns"], query)
            else:
                items = [o for (p, ns, _), o in sorted(kube.objects.items())
                         if p == match["plural"] and ns == match["ns"]
                         and _selected(o, query.get("labelSelector"), query.get("fieldSelector"))]
                self._json(200, {"kind": KINDS[match["plural"]] + "List", "apiVersion": match["group"] or "v1",
                                 "metadata": {"resourceVersion": str(len(kube.events))}, "items": items})

        def do_PATCH(self):
            """The patch its content type names: a JSON merge patch (RFC 7386, what the client sends for a
            dict) or a JSON patch (RFC 6902, a list); a strategic merge patch only for a built-in kind."""
            routed = self._route()
            if routed is None:
                return
            match, _ = routed
            kind = self.headers.get("Content-Type", "").split(";")[0].strip()
            merge = kind == "application/merge-patch+json" or (
                kind == "application/strategic-merge-patch+json" and match["plural"] not in CUSTOM)
            if not merge and kind != "application/json-patch+json":
                self._status(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                             "accepted media types include: application/json-patch+json, "
                             "application/merge-patch+json, application/apply-patch+yaml")
                return
            obj = kube.get(match["plural"], match["ns"], match["name"])
            if obj is None:
                self._not_found(match["plural"], match["name"])
                return
            if merge != isinstance(self.body, dict):
                self._status(400, "BadRequest", f"the {kind} body is not a JSON " + ("object" if merge else "array"))
                return
            kube.patches.append((match["plural"], match["ns"], match["name"], kind, self.body))
            if merge:
                _merge(obj, self.body)
            else:
                _json_patch(obj, self.body)
            kube._event(match["plural"], "MODIFIED", obj)
            self._json(200, obj)

        def do_DELETE(self):
            """Gone at once, answered with a Status; or, for a custom resource deleted in the foreground,
            marked (deletionTimestamp, finalizer foregroundDeletion) and answered with itself until the
            garbage collector has deleted its dependents (FakeKube.collect_garbage)."""
            routed = self._route()
            if routed is None:
                return
            match, query = routed
            policy = query.get("propagationPolicy") or self.body.get("propagationPolicy")
            key = (match["plural"], match["ns"], match["name"])
            obj = kube.objects.get(key)
            if obj is None:
                self._not_found(match["plural"], match["name"])
                return
            kube.deleted.append((*key, policy))
            if match["plural"] in CUSTOM and policy == "Foreground":
                if "deletionTimestamp" not in obj["metadata"]:
                    obj["metadata"].update(deletionTimestamp="2026-11-27T12:30:00Z", deletionGracePeriodSeconds=0)
                    obj["metadata"].setdefault("finalizers", []).append("foregroundDeletion")
                    kube._event(match["plural"], "MODIFIED", obj)
                self._json(200, obj)
                return
            del kube.objects[key]
            kube._event(match["plural"], "DELETED", obj)
            if match["plural"] in CUSTOM:
                self._json(200, obj)
            else:
                self._json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                 "details": {"name": match["name"], "kind": match["plural"],
                                             "uid": obj["metadata"].get("uid")}})

        # --- streams ----------------------------------------------------------------------
        def _log(self, namespace: str, name: str, query: dict) -> None:
            pod = kube.pods.get((namespace, name))
            if pod is None:
                self._not_found("pods", name)
                return
            container = query.get("container", "node")
            if container != "node":  # the pods' one container: the API names the one it does not have
                self._status(400, "BadRequest", f"container {container} is not valid for pod {name}")
                return
            if not pod.started:
                self._status(400, "BadRequest", f'container "node" in pod "{name}" is waiting to start: '
                                                "PodInitializing")
                return
            if query.get("follow") not in ("true", "1"):
                data = "".join(f"{line}\n" for line in pod.logs).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self._start_stream("text/plain")
            sent = 0
            while True:
                with kube.changed:
                    while sent == len(pod.logs) and not pod.ended:
                        kube.changed.wait(1.0)
                    lines, ended = pod.logs[sent:], pod.ended
                sent += len(lines)
                if lines:
                    self._chunk("".join(f"{line}\n" for line in lines).encode())
                if ended and sent == len(pod.logs):
                    break
            self._chunk(b"")

        def _watch(self, plural: str, namespace: str, query: dict) -> None:
            """Each event after resourceVersion (all of them without one), one JSON line each, until
            timeoutSeconds."""
            self._start_stream("application/json")
            seen = int(query.get("resourceVersion") or 0)
            deadline = time.monotonic() + float(query.get("timeoutSeconds") or 5)
            while time.monotonic() < deadline:
                with kube.changed:
                    if len(kube.events) == seen:
                        kube.changed.wait(min(0.5, max(deadline - time.monotonic(), 0)))
                    fresh, seen = kube.events[seen:], len(kube.events)
                for p, kind, obj in fresh:
                    if p == plural and obj["metadata"].get("namespace") == namespace and \
                            _selected(obj, query.get("labelSelector"), query.get("fieldSelector")):
                        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            self._chunk(b"")

    return Handler


def _selected(obj: dict, labels: str | None, fields: str | None = None) -> bool:
    """`key=value[,key=value]` of labels, and `metadata.name=NAME`: the selectors the backend sends."""
    have = obj["metadata"].get("labels") or {}
    if not all(have.get(k) == v for k, _, v in (term.partition("=") for term in (labels or "").split(",") if term)):
        return False
    return all(k == "metadata.name" and obj["metadata"]["name"] == v
               for k, _, v in (term.partition("=") for term in (fields or "").split(",") if term))


def _json_patch(target: dict, ops: list[dict]) -> None:
    """RFC 6902's add, replace and remove: what a client sends as a list."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = target
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if op["op"] == "remove":
            node.pop(int(last) if isinstance(node, list) else last)
        else:
            node[int(last) if isinstance(node, list) else last] = op["value"]


def _merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value
