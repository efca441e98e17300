"""A Kubernetes API server on 127.0.0.1 that speaks enough of the REST protocol for the official
`kubernetes` client to drive smlaunch's Kubernetes backend: create, get, list (label selectors), watch
(a chunked stream of events) and delete of Secrets, ConfigMaps and Kubeflow Trainer's TrainJobs; pods
listed by label; a pod's log read or followed (a chunked stream that ends when the container does).

No controller runs: a test plays Kubeflow Trainer, JobSet and Kueue by setting a TrainJob's conditions
and adding the pods with their logs (`FakeKube.set_conditions`, `add_pod`, `log`, `end_pod`).

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
KINDS = {"secrets": "Secret", "configmaps": "ConfigMap", "pods": "Pod", "trainjobs": "TrainJob"}


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

    def set_conditions(self, namespace: str, name: str, *conditions: tuple[str, str, str]) -> None:
        """The TrainJob's conditions, each (type, reason, message) with status True."""
        job = self.objects[("trainjobs", namespace, name)]
        job["status"] = {"conditions": [{"type": t, "status": "True", "reason": r, "message": m,
                                         "lastTransitionTime": "2026-11-27T12:00:00Z"} for t, r, m in conditions]}
        self._event("trainjobs", "MODIFIED", job)

    def add_pod(self, namespace: str, job: str, index: int, phase: str = "Running", started: bool = True,
                exit_code: int | None = None, reason: str | None = None,
                start_time: str = "2026-11-27T12:00:00Z") -> str:
        """A pod of the job's JobSet at node rank `index` (the kubelet's status.startTime: `start_time`);
        its name."""
        name = f"{job}-node-0-{index}-{uuid.uuid4().hex[:5]}"
        ended = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error")}
        state = ({"terminated": ended} if exit_code is not None else {"running": {}} if started
                 else {"waiting": {"reason": "PodInitializing"}})
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
            "labels": {"jobset.sigs.k8s.io/jobset-name": job, "batch.kubernetes.io/job-completion-index": str(index)}},
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
            match = COLLECTION.match(url.path)
            if match is None or match["plural"] not in KINDS or match["plural"] in kube.refuse:
                self._status(404, "NotFound", f"the server could not find the requested resource ({url.path})")
                return None
            return match, query

        # --- replies ----------------------------------------------------------------------
        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                              "reason": reason, "code": code})

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
            obj["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp="2026-11-27T12:00:00Z")
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
                    self._status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found')
                else:
                    self._json(200, obj)
            elif query.get("watch") in ("true", "1"):
                self._watch(match["plural"], match["ns"], query)
            else:
                items = [o for (p, ns, _), o in sorted(kube.objects.items())
                         if p == match["plural"] and ns == match["ns"]
                         and _selected(o, query.get("labelSelector"), query.get("fieldSelector"))]
                self._json(200, {"kind": KINDS[match["plural"]] + "List", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": str(len(kube.events))}, "items": items})

        def do_PATCH(self):
            """A JSON merge patch (RFC 7386), as the client sends a dict to a custom object."""
            routed = self._route()
            if routed is None:
                return
            match, _ = routed
            obj = kube.get(match["plural"], match["ns"], match["name"])
            if obj is None:
                self._status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found')
                return
            kube.patches.append((match["plural"], match["ns"], match["name"], self.headers["Content-Type"],
                                 self.body))
            _merge(obj, self.body)
            kube._event(match["plural"], "MODIFIED", obj)
            self._json(200, obj)

        def do_DELETE(self):
            routed = self._route()
            if routed is None:
                return
            match, query = routed
            body = self.body
            key = (match["plural"], match["ns"], match["name"])
            obj = kube.objects.pop(key, None)
            if obj is None:
                self._status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found')
                return
            kube.deleted.append((*key, query.get("propagationPolicy") or body.get("propagationPolicy")))
            kube._event(match["plural"], "DELETED", obj)
            self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        # --- streams ----------------------------------------------------------------------
        def _log(self, namespace: str, name: str, query: dict) -> None:
            pod = kube.pods.get((namespace, name))
            if pod is None:
                self._status(404, "NotFound", f'pods "{name}" not found')
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


def _merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value
