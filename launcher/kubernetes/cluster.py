"""The calls the Kubernetes backend makes, through the official `kubernetes` client: connect (a
kubeconfig's context, or the pod's service account), create and delete the job's objects, read its
job and pods, and read or follow a pod's log. Objects go and come as plain dicts, in the API's
own (camelCase) shape, so what is created is exactly what launcher.kubernetes.manifest (or .hyperpod)
rendered. The job itself is a custom object of its kind (launcher.kubernetes.kinds).

The client is an optional dependency (`pip install 'smlaunch[kubernetes]'`), imported inside these
functions: the CLI's start-up never loads it, and a machine without it fails here with that fix.
"""

# Imports inside functions: the kubernetes client is optional and heavy, loaded when a cluster is asked.
from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from launcher.backends.base import BackendError
from launcher.kubernetes.kinds import KINDS, TRAINER, JobKind

_CORE = {"Secret": "secret", "ConfigMap": "config_map"}  # CoreV1Api's name for each kind the backend makes


def unconfigured() -> str | None:
    """Why this machine has no cluster to ask by default (no kubeconfig where the client looks for one,
    and not in a pod with a service account), else None; read without importing the client."""
    where = os.environ.get("KUBECONFIG") or "~/.kube/config"
    if os.environ.get("KUBERNETES_SERVICE_HOST") or any(
            os.path.isfile(os.path.expanduser(path)) for path in where.split(os.pathsep) if path):
        return None
    return f"no kubeconfig at {where} and not in a pod"


def connect(kubeconfig: str | None, context: str | None) -> Any:
    """An ApiClient for the kubeconfig's context (default: KUBECONFIG, ~/.kube/config, its current
    context), or, in a pod with neither, its service account."""
    try:
        from kubernetes import client, config  # optional, and heavy: only when a cluster is asked
    except ImportError:
        raise BackendError("the kubernetes backend needs the kubernetes client: pip install "
                           "'smlaunch[kubernetes]'") from None
    configuration = client.Configuration()
    # KUBECONFIG as it is now: the client's own default reads it once, when it is first imported
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        if kubeconfig or context:
            raise BackendError(f"kubeconfig {kubeconfig or '(default)'} context {context or '(current)'}: {exc}; "
                               "fix kubernetes.kubeconfig / kubernetes.context") from None
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            raise BackendError(f"no Kubernetes cluster configured ({exc}): set KUBECONFIG or "
                               "kubernetes.kubeconfig, or run in a pod with a service account") from None
    return client.ApiClient(configuration)


def _reaching(call):
    """The API server not reached (refused, timed out, a TLS failure) as a BackendError that says where."""
    @functools.wraps(call)
    def reached(api, *args, **kwargs):
        from urllib3.exceptions import HTTPError  # the client's transport, loaded with it

        try:
            return call(api, *args, **kwargs)
        except HTTPError as exc:
            raise BackendError(f"the Kubernetes API server at {api.configuration.host} cannot be reached: "
                               f"{exc}; check the kubeconfig's context (kubectl cluster-info)") from None
    return reached


def _apis(api: Any) -> tuple[Any, Any]:
    from kubernetes import client  # connect() imported it already

    return client.CoreV1Api(api), client.CustomObjectsApi(api)


def _refused(exc: Any, what: str) -> BackendError:
    """The API server's answer, as the fix a user needs."""
    try:
        message = json.loads(exc.body).get("message", exc.reason)
    except (TypeError, ValueError, AttributeError):
        message = exc.reason
    kind = next((k for k in KINDS.values() if f" {k.name} " in f" {what} "), None)
    if exc.status == 404 and kind is not None:
        return BackendError(f"{what}: the cluster has no {kind.name} resource ({message}): {kind.installs}")
    if exc.status == 409:
        return BackendError(f"{what}: {message}: choose another job name")
    return BackendError(f"{what}: the API server answered {exc.status} {exc.reason}: {message}")


@_reaching
def create(api: Any, obj: dict) -> None:
    from kubernetes.client.exceptions import ApiException

    core, custom = _apis(api)
    namespace, kind = obj["metadata"]["namespace"], obj["kind"]
    try:
        if kind in KINDS:
            custom.create_namespaced_custom_object(KINDS[kind].group, KINDS[kind].version, namespace,
                                                   KINDS[kind].plural, obj)
        else:
            getattr(core, f"create_namespaced_{_CORE[kind]}")(namespace, obj)
    except ApiException as exc:
        raise _refused(exc, f"creating {kind} {namespace}/{obj['metadata']['name']}") from None


@_reaching
def delete(api: Any, kind: str, namespace: str, name: str) -> None:
    """Delete one object; one already gone is no error. A job goes in the foreground: its pods (a
    TrainJob's through its JobSet) are deleted with it, each pod with SIGTERM and its grace period."""
    from kubernetes.client.exceptions import ApiException

    core, custom = _apis(api)
    try:
        if kind in KINDS:
            custom.delete_namespaced_custom_object(KINDS[kind].group, KINDS[kind].version, namespace,
                                                   KINDS[kind].plural, name, propagation_policy="Foreground")
        else:
            getattr(core, f"delete_namespaced_{_CORE[kind]}")(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise _refused(exc, f"deleting {kind} {namespace}/{name}") from None


@_reaching
def suspend(api: Any, kind: JobKind, namespace: str, name: str) -> None:
    """Suspend the job (kind.suspension): its controller deletes its pods (SIGTERM and their grace period)
    and keeps the job, which resumes when the field is set back to false."""
    from kubernetes.client.exceptions import ApiException

    try:
        _apis(api)[1].patch_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, name,
                                                     kind.suspension(True))
    except ApiException as exc:
        raise _refused(exc, f"suspending {kind.name} {namespace}/{name}") from None


@_reaching
def get_job(api: Any, kind: JobKind, namespace: str, name: str) -> dict | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return _apis(api)[1].get_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _refused(exc, f"reading {kind.name} {namespace}/{name}") from None


@_reaching
def wait_for_change(api: Any, kind: JobKind, namespace: str, name: str, timeout_s: float) -> None:
    """Return when the job changes (a watch event: its conditions, its deletion) or after
    `timeout_s`: a follower polls no more often than the job changes, and hears of a change at once."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    custom = _apis(api)[1]
    found = get_job(api, kind, namespace, name)
    if found is None:
        return
    stream = watch.Watch()
    try:
        for _ in stream.stream(custom.list_namespaced_custom_object, kind.group, kind.version, namespace, kind.plural,
                               field_selector=f"metadata.name={name}", timeout_seconds=max(int(timeout_s), 1),
                               resource_version=found["metadata"].get("resourceVersion")):
            return
    except ApiException as exc:
        if exc.status != 410:  # 410 Gone: the version is too old to watch from; the caller asks again
            raise _refused(exc, f"watching {kind.name} {namespace}/{name}") from None
    finally:
        stream.stop()


@_reaching
def list_pods(api: Any, kind: JobKind, namespace: str, name: str) -> list[dict]:
    from kubernetes.client.exceptions import ApiException

    try:
        pods = _apis(api)[0].list_namespaced_pod(namespace, label_selector=kind.pod_selector(name))
    except ApiException as exc:
        raise _refused(exc, f"listing the pods of {namespace}/{name}") from None
    return api.sanitize_for_serialization(pods).get("items", [])


@_reaching
def pod_log(api: Any, namespace: str, pod: str) -> str:
    """The trainer container's log so far ("" while it has not started)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return _apis(api)[0].read_namespaced_pod_log(pod, namespace, container=TRAINER)
    except ApiException as exc:
        if exc.status in (400, 404):  # not started yet, or gone
            return ""
        raise _refused(exc, f"reading the log of pod {namespace}/{pod}") from None


def follow_pod_log(api: Any, namespace: str, pod: str, retry_s: float = 1.0) -> Iterator[str]:
    """The trainer container's log, line by line, until it ends; while the container has not started
    (the API answers 400), asked again until it has or the pod has ended or gone."""
    from kubernetes.client.exceptions import ApiException

    core = _apis(api)[0]
    while True:
        try:
            response = core.read_namespaced_pod_log(pod, namespace, container=TRAINER, follow=True,
                                                    _preload_content=False)
        except ApiException as exc:
            if exc.status == 404 or (exc.status == 400 and _ended(core, namespace, pod)):
                return
            if exc.status != 400:
                raise _refused(exc, f"following the log of pod {namespace}/{pod}") from None
            time.sleep(retry_s)
            continue
        rest = b""
        for chunk in response.stream(4096, decode_content=True):
            *complete, rest = (rest + chunk).split(b"\n")
            yield from (line.decode("utf-8", "replace") for line in complete)
        if rest:
            yield rest.decode("utf-8", "replace")
        return


def _ended(core: Any, namespace: str, pod: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_namespaced_pod(pod, namespace).status.phase in ("Succeeded", "Failed")
    except ApiException:
        return True
