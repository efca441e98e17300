"""No switch on a backend's name outside the backend table and each backend's own files: what differs
by backend is a method of launcher.backends.base.Backend or a column of launcher.config.backend_table
(docs/architecture.md, "Where a new thing goes"), so a new backend is a row and its own files.

The sources are read as Python (ast), so a switch is found however it is spelled: a comparison or a
membership test against a backend's name or a handle's prefix (`== "slurm"`, `in ("local", "slurm")`,
`"kubernetes:" in`), a set of names taken from another, a dict keyed by names, a `match` case, a
`.startswith("kubernetes:")` or `.get("slurm")`, a subscript by a name, a tuple of names bound to a
variable (`BACKENDS = ("local", "slurm")`), `isinstance` against a backend's class, a backend's
section read (`job.slurm`, `getattr(job, "kubernetes")`), and a test for a record key named after a
backend (`"LocalJobDir" in record`). Each spelling is proven found by a control that adds it to a
source the check passes; what only looks alike (a local instance type, a record's `Backend` value)
is proven not found.
"""

from __future__ import annotations

import ast
import string
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.config import backend_table
from tests.support.train_runs import ROOT

SOURCES = ("launcher", "container", "entrypoints")
TABLE = Path("launcher/config/backend_table.py")
SET_CALLS = ("set", "frozenset", "tuple", "list")
KEYED_CALLS = ("startswith", "endswith", "removeprefix", "removesuffix", "get", "pop", "setdefault")
UPPER = tuple(string.ascii_uppercase)


def own_files(name: str) -> tuple[Path, ...]:
    """A backend's own files, where its name may be tested (docs/architecture.md)."""
    return (Path(f"launcher/backends/{name}.py"), Path(f"launcher/config/backends/{name}.py"), Path(f"launcher/{name}"))


@dataclass(frozen=True)
class Known:
    """What the table names, read once per module checked (a test may add a row)."""

    names: tuple[str, ...]
    sections: frozenset[str]
    classes: frozenset[str]

    @classmethod
    def now(cls) -> Known:
        return cls(backend_table.names(), frozenset(row.name for row in backend_table.with_sections()),
                   frozenset(row.engine.partition(":")[2] for row in backend_table.BACKENDS))

    def name(self, node: ast.AST) -> bool:
        """A text constant that is a backend's name, or a handle's prefix (`slurm:`)."""
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
            node.value in self.names or any(node.value.startswith(f"{name}:") for name in self.names))

    def record_key(self, node: ast.AST) -> bool:
        """A text constant named after a backend in CamelCase (`LocalJobDir`, `SlurmJobId`, `Kubernetes`)."""
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        return text[:1].isupper() and any(text.lower().startswith(name) and text[len(name):][:1] in ("", *UPPER)
                                          for name in self.names)

    def names_only(self, node: ast.AST) -> bool:
        """A tuple, list or set (or set(...) of one) whose texts are all backends' names."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SET_CALLS and node.args:
            node = node.args[0]
        texts = [e for e in getattr(node, "elts", ()) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(texts) and all(map(self.name, texts))


def _is_switch(node: ast.AST, known: Known) -> bool:
    if isinstance(node, ast.Compare):
        operands = (node.left, *node.comparators)
        membership = any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
        return any(known.name(o) or known.names_only(o) for o in operands) or (
            membership and known.record_key(node.left))
    if isinstance(node, ast.BinOp):  # set(backends) - {"sagemaker"}
        return known.names_only(node.left) or known.names_only(node.right)
    if isinstance(node, ast.Dict):
        keys = [k for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        return bool(keys) and all(map(known.name, keys))
    if isinstance(node, ast.MatchValue):
        return known.name(node.value)
    if isinstance(node, ast.Subscript):
        return known.name(node.slice)
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value is not None and known.names_only(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr in known.sections
    if isinstance(node, ast.Call):
        return _switching_call(node, known)
    return False


def _switching_call(node: ast.Call, known: Known) -> bool:
    func, args = node.func, node.args
    if isinstance(func, ast.Attribute) and func.attr in KEYED_CALLS:
        return bool(args) and (known.name(args[0]) or known.names_only(args[0]))
    if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") and len(args) > 1:
        return known.name(args[1])
    if isinstance(func, ast.Name) and func.id in ("isinstance", "issubclass") and len(args) == 2:
        named = args[1].elts if isinstance(args[1], ast.Tuple) else [args[1]]
        return any(getattr(n, "id", getattr(n, "attr", None)) in known.classes for n in named)
    return False


def switches(source: str) -> list[str]:
    """Each switch on a backend's name in a module's source, as `line: text`."""
    known = Known.now()
    return [f"{node.lineno}: {ast.get_source_segment(source, node)}"
            for node in ast.walk(ast.parse(source)) if _is_switch(node, known)]


def _allowed(path: Path) -> bool:
    own = [p for name in backend_table.names() for p in own_files(name)]
    return path == TABLE or any(path == p or p in path.parents for p in own)


def test_no_backend_is_named_in_a_switch_outside_the_table_and_its_own_files():
    found = [f"{path}:{where}" for root in SOURCES for path in sorted((ROOT / root).rglob("*.py"))
             if not _allowed(path.relative_to(ROOT)) for where in switches(path.read_text(encoding="utf-8"))]
    assert found == []


# A module the check passes, and what each spelling of a switch adds to it (the controls).
CLEAN = '''
def run(job, backend, record, handle, backends):
    return registry.for_job(job).submit(job)
'''
SPELLINGS = [
    'if backend.name == "local": pass',
    'if job.config.backend_name != "sagemaker": pass',
    'if backend.name in ("local", "slurm"): pass',
    'if kind not in [None, "sagemaker"]: pass',
    'if "kubernetes:" in handle: pass',
    'listed = set(backends) - {"sagemaker"}',
    'how = {"local": "here", "slurm": "there"}.get(backend.name)',
    'match backend.name:\n        case "slurm": pass',
    'if handle.startswith("kubernetes:"): pass',
    'text = TEXTS.get("slurm")',
    'text = TEXTS["kubernetes"]',
    'SWEEPS = ("local", "slurm")',
    'if isinstance(backend, SageMakerBackend): pass',
    'if isinstance(backend, (base.Backend, slurm.SlurmBackend)): pass',
    'gpus = job.slurm.gpus_per_node',
    'section = getattr(job, "kubernetes", None)',
    'if "LocalJobDir" in record: pass',
    'if "SlurmJobId" not in record: pass',
]


def test_the_clean_source_has_no_switch():
    assert switches(CLEAN) == []


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_each_spelling_of_a_switch_is_found(spelling):
    """The control: the check fails for a module with the switch added (in a function, as code has them)."""
    found = switches(CLEAN + "    " + spelling + "\n")
    assert found and all(int(line.split(":")[0]) > CLEAN.count("\n") for line in found), found


def test_a_switch_added_to_a_module_of_the_tree_is_found():
    path = ROOT / "launcher" / "cli" / "jobs.py"
    source = path.read_text(encoding="utf-8")
    assert switches(source) == []
    assert switches(source + '\n\nif __name__ == "slurm":\n    pass\n') == [f"{source.count(chr(10)) + 3}: "
                                                                          '__name__ == "slurm"']


@pytest.mark.parametrize("text", [
    'if job.instance_type in LOCAL_TYPES: pass',  # instance types, not backends
    'if cfg.instance_type in ("local", "local_gpu"): pass',  # a name among other texts: an instance type
    'record = {"Backend": "local", "LocalRunner": runner}',  # a record's values and keys, not a test
    'backend = registry.backend_named(row.name)',  # a backend asked for by the table's name
    'if self.local: pass',  # local mode, not a backend's section
    'if "local_gpu" in text or "localhost" in text: pass',  # words that start like a backend's name
])
def test_what_only_looks_like_a_switch_is_not_found(text):
    assert switches(CLEAN + "    " + text + "\n") == []


def test_a_new_backends_name_is_checked_too(monkeypatch):
    """The names come from the table: a switch on a fifth backend is found once its row is there."""
    text = CLEAN + '    if backend.name == "skypilot": pass\n'
    assert switches(text) == []
    row = backend_table.BackendRow("skypilot", "launcher.backends.skypilot:SkyPilotBackend", "any", restarts="")
    monkeypatch.setattr(backend_table, "BACKENDS", (*backend_table.BACKENDS, row))
    assert switches(text) == [f"{CLEAN.count(chr(10)) + 1}: " + 'backend.name == "skypilot"']
    assert _allowed(Path("launcher/backends/skypilot.py")) and _allowed(Path("launcher/skypilot/engine.py"))
