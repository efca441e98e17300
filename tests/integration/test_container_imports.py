"""The training container loads of the launcher the contract only (launcher.wire, docs/architecture.md):
importing its modules in a fresh interpreter, and what entrypoints/train.py imports, brings in none of
the client's job schema, rules, backends, sweeps, SDK faces or CLI, and neither boto3 nor click; and
the CLI's start-up brings in neither torch nor boto3."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from tests.support.train_runs import ROOT

CONTAINER_MODULES = [
    "container.trainer", "container.args", "container.toolkit.bootstrap", "container.data.packing",
    "container.distributed.pipeline", "container.checkpoint.hf_export", "container.checkpoint.pretrained",
    "container.toolkit.pod", "container.__main__",  # python -m container train|pod
]
NEVER_IN_THE_CONTAINER = ("launcher.config", "launcher.backends", "launcher.local", "launcher.slurm",
                          "launcher.kubernetes", "launcher.tune", "launcher.sdk", "launcher.cli", "launcher.plan",
                          "boto3", "botocore", "click")


def _entrypoint_imports() -> list[str]:
    """Every module entrypoints/train.py imports (inside main too), as `import` lines."""
    tree = ast.parse((ROOT / "entrypoints" / "train.py").read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return [f"import {name}" for name in sorted(names)]


def _loaded_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.splitlines()[-1])


def _offending(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in prefixes or m.startswith(tuple(p + "." for p in prefixes))
            or m in prefixes]


def _outside_the_contract(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] == "launcher" and m != "launcher"
            and not m.startswith("launcher.wire")]


def test_the_container_loads_of_the_launcher_only_the_contract():
    loaded = _loaded_after("\n".join([*(f"import {m}" for m in CONTAINER_MODULES), *_entrypoint_imports()]))
    assert "container.trainer" in loaded and "launcher.wire.training.hyperparameters" in loaded  # they did happen
    assert _offending(loaded, NEVER_IN_THE_CONTAINER) == []
    assert _outside_the_contract(loaded) == []


def test_the_check_sees_the_job_schema_and_a_backend_when_they_are_imported():
    # the control: importing the client's rules (and with them the job schema) or a backend is caught
    loaded = _loaded_after("import container.args\nimport launcher.config.rules\nimport launcher.backends.local")
    for module in ("launcher.config.rules", "launcher.config.job", "launcher.backends.local"):
        assert module in _offending(loaded, NEVER_IN_THE_CONTAINER) and module in _outside_the_contract(loaded)


def test_the_cli_starts_without_torch_or_boto3():
    loaded = _loaded_after("import launcher.cli\nimport launcher.config.jobfile\nimport launcher.plan")
    assert "launcher.cli.app" in loaded
    assert _offending(loaded, ("torch", "boto3", "botocore")) == []
