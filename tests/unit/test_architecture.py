"""The package grammar of docs/architecture.md, held on every run: which package may import which,
no import cycles (imports inside functions and for type checking count), a function-level import of
smlaunch's own code says why it is one, and the runtime reaches of the launcher only the contract
(launcher.wire). Read from the source with ast: nothing is imported or executed."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The layer of a module, and the layers it may import (docs/architecture.md's table).
ALLOWED = {
    "wire": {"wire"},
    "config": {"wire", "config"},
    "plan": {"wire", "config", "plan"},
    "backends": {"wire", "config", "plan", "backends"},
    # sweeps run their trials through the backends, beside them in the "run it" row, never below them
    "tune": {"wire", "config", "plan", "backends", "tune"},
    "sdk": {"wire", "config", "plan", "backends", "tune", "sdk"},
    "cli": {"wire", "config", "plan", "backends", "tune", "sdk", "cli"},
    # the runtime (container/, entrypoints/) takes of the launcher only the contract both sides share
    "container": {"wire", "container"},
    "entrypoints": {"wire", "container"},
    "launcher": {"wire", "config", "sdk", "launcher"},
}
ENGINES = {"local", "slurm", "kubernetes", "backends"}  # the backends and their engines form one layer
# Names users' code and the notebook have long imported, kept as re-exports of their new homes.
PUBLIC_NAMES = {"model_trainer": "sdk", "jobmetrics": "backends", "metrics_view": "cli"}
# A module that imports smlaunch's own code inside functions says why once, in a module-level
# comment: start-up time (the CLI starts without boto3, torch or the backends' modules), or code
# that only some commands need. A cycle is never the reason: the cycle test counts these imports.
REASON = re.compile(r"^# Imports inside functions: \S", re.M)


def _modules() -> dict[str, Path]:
    found = {}
    for package in ("launcher", "container"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    found["entrypoints.train"] = ROOT / "entrypoints" / "train.py"  # the script a job ships, not a package
    return found


MODULES = _modules()


def _owner(target: str) -> str | None:
    """The module a dotted import target lands in (a name inside a module counts as the module)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _imports(source: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for each import of smlaunch's own code, those under
    `if TYPE_CHECKING:` too: a module that names another's class depends on it as much as one that
    calls it, and a circle of them is a circle all the same."""
    tree = ast.parse(source)
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in node.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("launcher", "container", "entrypoints"):
                owner = _owner(name)
                if owner:
                    out.append((owner, node.lineno, id(node) in top))
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] in ("container", "entrypoints"):
        return parts[0]
    if len(parts) == 1:
        return "launcher"
    if parts[1] in ENGINES:
        return "backends"
    return PUBLIC_NAMES.get(parts[1], parts[1])


@functools.cache
def _graph() -> dict[str, list[tuple[str, int, bool]]]:
    """Each module's imports of smlaunch's own code, parsed once, by the worker that runs these tests
    (not at every worker's collection: ~1.5 CPU s)."""
    return {module: _imports(path.read_text()) for module, path in MODULES.items()}


def test_every_package_imports_only_the_layers_below_it():
    wrong = [f"{module} -> {target} (line {line})"
             for module, imports in _graph().items() for target, line, _ in imports
             if target != module and _layer(target) not in ALLOWED[_layer(module)]]
    assert wrong == []


def test_the_layer_rule_would_catch_a_config_module_importing_a_backend():
    # the control: the rule is not vacuous
    assert "backends" not in ALLOWED[_layer("launcher.config.job")]
    assert _layer("launcher.local.prepare") == "backends" and "backends" not in ALLOWED["container"]
    assert _layer("entrypoints.train") == "entrypoints"
    assert "config" not in ALLOWED["container"] | ALLOWED["entrypoints"]
    assert _layer("launcher.tune.sweep") == "tune" and "tune" not in ALLOWED["backends"]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_counting_imports_inside_functions():
    edges = {m: {t for t, _, _ in imports if t != m} for m, imports in _graph().items()}
    assert _cycles(edges) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_import_for_type_checking_counts():
    # the control: the circle config/rules.py <-> config/backends/slurm.py hid behind one of these
    source = ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
              "    from launcher.config.rules import Context\n")
    assert _imports(source) == [("launcher.config.rules", 4, True)]


@pytest.mark.parametrize("package", ["launcher", "container", "entrypoints"])
def test_function_level_imports_say_why(package):
    unexplained = sorted(module for module, imports in _graph().items()
                         if module.startswith(package) and any(not at_top for _, _, at_top in imports)
                         and not REASON.search(MODULES[module].read_text()))
    assert unexplained == []


def _outside_the_contract(graph: dict[str, list[tuple[str, int, bool]]]) -> dict[str, str]:
    """Each module of the launcher outside the contract (launcher.wire) that the runtime's modules
    reach through any chain of imports, with the chain that reaches it first."""
    runtime = [m for m in graph if _layer(m) in ("container", "entrypoints")]
    chain = {m: m for m in runtime}
    queue = list(runtime)
    while queue:
        module = queue.pop(0)
        for target, _, _ in graph.get(module, []):
            if target not in chain:
                chain[target] = f"{chain[module]} -> {target}"
                queue.append(target)
    return {m: path for m, path in chain.items() if m.startswith("launcher") and _layer(m) != "wire"}


def test_the_runtime_reaches_of_the_launcher_only_the_contract():
    """container/ and entrypoints/ import launcher.wire only, and launcher.wire imports nothing else of
    smlaunch: no chain of imports brings a rank the client's job schema, rules, backends or sweeps."""
    assert _outside_the_contract(_graph()) == {}


def test_the_contract_check_follows_a_chain_to_the_job_schema():
    # the control: one import of the client's rules from the contract (as the compile rule's of
    # config.rules.is_moe was) brings the rules, the job schema and the backend table to every rank
    graph = dict(_graph())
    graph["launcher.wire.training.speed_rules"] = [*_graph()["launcher.wire.training.speed_rules"],
                                                   ("launcher.config.rules", 1, True)]
    outside = _outside_the_contract(graph)
    assert {"launcher.config.rules", "launcher.config.job", "launcher.config.backend_table"} <= set(outside)
    assert outside["launcher.config.job"].endswith(
        "launcher.wire.training.speed_rules -> launcher.config.rules -> launcher.config.job")


def _loaded_at_import(source: str) -> list[str]:
    """The modules of smlaunch's own code that importing `source` runs: imports at module level, in
    its `if` and `try` blocks too, but not those under `if TYPE_CHECKING:` nor inside functions."""
    found, blocks = [], list(ast.parse(source).body)
    while blocks:
        node = blocks.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            blocks += node.body + node.orelse
        elif isinstance(node, ast.Try):
            blocks += node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return [owner for name in found if name.split(".")[0] in ("launcher", "container", "entrypoints")
            and (owner := _owner(name))]


def _loaded_by(module: str) -> set[str]:
    """Every module of smlaunch that `import module` loads: what its imports run, and each one's packages."""
    loaded, queue = set(), [module]
    while queue:
        name = queue.pop()
        parts = name.split(".")
        for package in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if package in MODULES and package not in loaded:
                loaded.add(package)
                queue += _loaded_at_import(MODULES[package].read_text())
    return loaded


# What a training rank loads of the launcher: the packages launcher, launcher.wire, launcher.wire.training
# and the contract's modules the runtime uses. tests/integration/test_container_imports.py measures
# the same in a fresh interpreter.
RUNTIME_LAUNCHER_MODULES_MAX = 36  # 33 with LoRA, then Megatron-Core corpora: megatron_index, shard_error; shrink


def test_a_training_rank_loads_few_modules_of_the_launcher():
    loaded = sorted(m for m in _loaded_by("container.trainer") if m.split(".")[0] == "launcher")
    assert "launcher.wire.training.hyperparameters" in loaded  # it did follow the imports
    assert len(loaded) <= RUNTIME_LAUNCHER_MODULES_MAX, loaded


def test_the_loaded_modules_follow_packages_and_skip_type_checking_and_functions():
    # the control: an import under TYPE_CHECKING or inside a function loads nothing when the module
    # is imported; one at module level loads its module and its packages
    source = ("from typing import TYPE_CHECKING\nimport launcher.wire.masking\n"
              "if TYPE_CHECKING:\n    from launcher.config.job import JobConfig\n"
              "def f():\n    from launcher.backends import sagemaker\n")
    assert _loaded_at_import(source) == ["launcher.wire.masking"]
    assert {"launcher", "launcher.wire", "launcher.wire.masking"} <= _loaded_by("launcher.wire.masking")
