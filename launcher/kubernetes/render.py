"""The objects a Kubernetes job's submit creates, checked as the cluster will see them, and its dry run.

`render` makes the job's name (checked by the names its controllers make of it:
launcher.config.backends.kubernetes_names), its code archive and its objects: the Secret (when the job
has secrets), the ConfigMap and the TrainJob or HyperPodPyTorchJob. Every value the masker treats as
secret (launcher.wire.masking.carries_secret: a secret name, or a URL with a password whatever its name)
is in the Secret and only referenced elsewhere (launcher.kubernetes.manifest); a job whose other objects
would still carry a secret in clear (a credential in a channel's URI, say, which cannot go by reference)
is refused. So the dry run masks nothing but the Secret's values, and shows every other byte submit sends.
"""

# Imports inside functions: the code bundle and yaml load to submit or print a dry run only (CLI start-up).
from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.backends.base import JobDryRun, SettingError
from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.config.backends.kubernetes_names import name_issue
from launcher.config.job_names import check_job_name, default_base_name, make_job_name
from launcher.kubernetes.hyperpod import hyperpod_job
from launcher.kubernetes.kinds import HYPERPOD_JOB
from launcher.kubernetes.manifest import env_secret, pod_config_map, train_job
from launcher.wire import pod_config
from launcher.wire.masking import MASK, Masker
from launcher.wire.training.issues import ConfigError

if TYPE_CHECKING:
    from launcher.config.validate import ValidatedJob


@dataclass(frozen=True)
class Rendered:
    name: str
    settings: KubernetesSettings
    objects: list[dict]  # [Secret?, ConfigMap, the job], in the order submit creates them
    archive_size: int  # the code archive's bytes


def render(job: ValidatedJob, job_name: str | None) -> Rendered:
    """The job's objects as submit creates them; nothing is sent. ConfigError for a name the cluster
    refuses, SettingError for a secret that would be in clear."""
    from launcher.backends.sourcedir import build_job_sourcedir  # only to submit: CLI start-up

    cfg = job.config
    settings = cfg.kubernetes or KubernetesSettings()
    name = check_job_name(job_name or make_job_name(cfg.base_job_name or default_base_name(cfg.entry_point)))
    if issue := name_issue(name, settings.kind, cfg.instance_count):
        raise ConfigError([issue])
    with tempfile.TemporaryDirectory() as tmp:
        archive = build_job_sourcedir(job, Path(tmp) / "sourcedir.tar.gz").path.read_bytes()
    make_job = hyperpod_job if settings.kind == HYPERPOD_JOB.name else train_job
    objects = [env_secret(job, name, settings), pod_config_map(job, name, settings, archive),
               make_job(job, name, settings)]
    objects = [o for o in objects if o is not None]
    _refuse_secrets_in_clear(job, objects)
    return Rendered(name, settings, objects, len(archive))


def _refuse_secrets_in_clear(job: ValidatedJob, objects: list[dict]) -> None:
    masker = Masker.of(job.config.environment, job.config.hyperparameters.model_dump(mode="json"))
    for obj in objects:
        if obj["kind"] == "Secret":
            continue
        for where, text in _strings(obj, ""):
            if masker(text) != text:
                raise SettingError(f"{where} of the {obj['kind']} {obj['metadata']['name']} would hold a secret in "
                                   f"clear ({masker(text)}): a credential in a path or URI the pods are given cannot "
                                   "go by reference to the job's Secret; give the pods their credentials through "
                                   "their service account's role, or in environment (which goes in the Secret)")


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(dotted path, text) of every string in an object, inside JSON texts (pod.json) too; the code
    archive (binaryData) is the job's code, not a value of the job file."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "binaryData":
                yield from _strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")
    elif isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            decoded = None
        if isinstance(decoded, (dict, list)):
            yield from _strings(decoded, path)
        else:
            yield path, value


def dry_run(backend: str, rendered: Rendered) -> ManifestDryRun:
    """The manifests as YAML: the Secret's values masked (the names of the hyperparameters it holds
    shown), the code archive by its size; everything else as sent."""
    import yaml  # the printing only: CLI start-up

    shown = [_shown(o, rendered.archive_size) for o in rendered.objects]
    return ManifestDryRun(backend, {"KubernetesJob": {"TrainingJobName": rendered.name, "Manifests": shown}},
                          text=yaml.safe_dump_all(shown, sort_keys=False))


@dataclass
class ManifestDryRun(JobDryRun):
    """The manifests, masked already: the generic masking would also hide the names of the Secret's
    keys, which the TrainJob quotes as `secretKeyRef.key` (a secret-named field)."""

    def to_dict(self, masked: bool = True) -> dict:
        return self.request

    def render(self) -> str:
        return self.text or ""


def _shown(obj: dict, size: int) -> dict:
    """An object as a dry run shows it: a Secret's values masked, the code archive by its size."""
    if obj["kind"] == "Secret":
        return {**obj, "stringData": {k: _masked_secret(k, v) for k, v in obj["stringData"].items()}}
    if obj["kind"] == "ConfigMap":
        return {**obj, "binaryData": dict.fromkeys(obj["binaryData"], f"<the code archive: {size} bytes, base64>")}
    return obj


def _masked_secret(key: str, value: str) -> str:
    """A Secret's value masked; its hyperparameters' JSON with each value masked, so their names show."""
    if key == pod_config.SECRET_HYPERPARAMETERS_KEY:
        return json.dumps(dict.fromkeys(json.loads(value), MASK))
    return MASK
