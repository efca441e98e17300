"""The training container loads smlaunch's shared layer only (docs/architecture.md): importing its
modules in a fresh interpreter brings in no client backend, SDK face or CLI, and neither boto3
nor click; and the CLI's start-up brings in neither torch nor boto3."""

from __future__ import annotations

import json
import subprocess
import sys

CONTAINER_MODULES = [
    "container.trainer", "container.args", "container.toolkit.bootstrap", "container.data.packing",
    "container.distributed.pipeline", "container.checkpoint.hf_export", "container.checkpoint.pretrained",
    "container.toolkit.pod",
]
NEVER_IN_THE_CONTAINER = ("launcher.backends", "launcher.local", "launcher.slurm", "launcher.sdk", "launcher.cli",
                          "launcher.plan", "boto3", "botocore", "click")


def _loaded_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.splitlines()[-1])


def _offending(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in prefixes or m.startswith(tuple(p + "." for p in prefixes))
            or m in prefixes]


def test_the_container_loads_no_client_backend_boto3_or_click():
    loaded = _loaded_after("\n".join(f"import {m}" for m in CONTAINER_MODULES))
    assert "container.trainer" in loaded and "launcher.config" in loaded  # the imports did happen
    assert _offending(loaded, NEVER_IN_THE_CONTAINER) == []


def test_the_check_sees_a_backend_when_one_is_imported():
    # the control: importing a backend is caught by the same check
    loaded = _loaded_after("import container.args\nimport launcher.backends.local")
    assert "launcher.backends.local" in _offending(loaded, NEVER_IN_THE_CONTAINER)


def test_the_cli_starts_without_torch_or_boto3():
    loaded = _loaded_after("import launcher.cli\nimport launcher.config.jobfile\nimport launcher.plan")
    assert "launcher.cli.app" in loaded
    assert _offending(loaded, ("torch", "boto3", "botocore")) == []
