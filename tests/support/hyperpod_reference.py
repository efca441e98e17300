"""SageMaker HyperPod's own models of a HyperPodPyTorchJob, as AWS generates them from the CRD
(sagemaker-hyperpod 3.12.0: sagemaker/hyperpod/training/config/hyperpod_pytorch_job_unified_config.py).

The package cannot join the main lock (it pins pytest, tox, awscli...) and its `sagemaker.hyperpod`
package imports the kubernetes client, boto3 and its telemetry on import, so `make test` unpacks the
wheel alone into build/hyperpod-ref (requirements/hyperpod-ref.txt, from its hash) and this loads the
one module, which imports only pydantic, from its path.

`validated(manifest)` reads a manifest as AWS's SDK reads one back from the cluster (_load_hp_job:
the spec and status by field name) and writes it as the SDK writes one (model_dump, exclude_none):
every nested model forbids unknown keys and checks types; the spec's own model ignores unknown
keys, so those are compared here.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = (ROOT / "build" / "hyperpod-ref" / "sagemaker" / "hyperpod" / "training" / "config"
          / "hyperpod_pytorch_job_unified_config.py")


@functools.cache
def models() -> ModuleType:
    if not MODULE.exists():
        pytest.fail(f"{MODULE} is missing: build it with `make build/hyperpod-ref/.installed` (make test does)")
    spec = importlib.util.spec_from_file_location("hyperpod_pytorch_job_unified_config", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def validated(manifest: dict) -> dict:
    """The manifest through HyperPod's models; raises (pydantic's ValidationError, or ValueError for a
    key the spec's model would drop) where they refuse it."""
    spec_model = models()._HyperPodPytorchJob
    unknown = set(manifest["spec"]) - set(spec_model.model_fields)
    if unknown:
        raise ValueError(f"spec keys the HyperPodPyTorchJob does not have: {sorted(unknown)}")
    spec = spec_model.model_validate(manifest["spec"], by_name=True).model_dump(exclude_none=True)
    out = {**manifest, "spec": _present(spec, manifest["spec"])}
    if "status" in manifest:
        status = models().HyperPodPytorchJobStatus.model_validate(manifest["status"], by_name=True)
        out["status"] = _present(status.model_dump(exclude_none=True), manifest["status"])
    return out


def _present(dumped, given):
    """`dumped` limited to the keys `given` has: the models fill in their defaults (replicas' spares 0,
    runPolicy's ttl), which the manifest need not state; a key given and dropped still shows."""
    if isinstance(dumped, dict) and isinstance(given, dict):
        return {k: _present(dumped[k], v) if k in dumped else None for k, v in given.items()}
    if isinstance(dumped, list) and isinstance(given, list) and len(dumped) == len(given):
        return [_present(d, g) for d, g in zip(dumped, given, strict=True)]
    return dumped
