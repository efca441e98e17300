"""What a user's script imports, read from its files (never run on the client): the entry point and
every module of source_dir it imports, directly or through its own modules.

An import inside a `try:` whose handlers catch ImportError (or ModuleNotFoundError, Exception,
BaseException, or everything) is optional: the script runs without it. Standard-library modules and
the script's own are left out; what remains is what the target must provide
(launcher.config.script_rules checks it against the target).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_FILES = 500  # a script's own modules a check reads at most
MAX_BYTES = 1 << 20  # a file bigger than this is not read (a script's imports are at its top)
_CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Import:
    module: str  # dotted, as the script names it: torch.sagemaker, transformers
    where: str  # file:line
    optional: bool  # inside a try that catches ImportError

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


def _optional_lines(tree: ast.AST) -> set[int]:
    """Line numbers of the statements inside `try:` blocks that catch ImportError."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in _CATCHES_IMPORT_ERROR
               or isinstance(n, ast.Attribute) and n.attr in _CATCHES_IMPORT_ERROR for n in names)


def _modules_of(node: ast.AST, package: list[str]) -> list[str]:
    """The modules an import statement names: `import a.b` -> a.b; `from a import b` -> a and a.b
    (b may be a submodule); relative imports resolved against `package` (the file's package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parent = package[:len(package) - node.level + 1] if node.level <= len(package) else []
        base = ".".join(filter(None, [*parent, base]))
    return [base, *(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")] if base else [
        alias.name for alias in node.names]


class _Reader:
    def __init__(self, root: Path):
        self.root, self.seen, self.found = root, set(), {}

    def local(self, module: str) -> Path | None:
        """The file of `module` when it is the script's own (a module or package under root)."""
        path = self.root.joinpath(*module.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def read(self, path: Path, package: list[str]) -> None:
        if path in self.seen or len(self.seen) >= MAX_FILES:
            return
        self.seen.add(path)
        try:
            if path.stat().st_size > MAX_BYTES:
                return
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
        except (OSError, SyntaxError, ValueError):
            return  # a file Python cannot parse fails where it runs, with Python's own message
        optional = _optional_lines(tree)
        name = path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else str(path)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for module in _modules_of(node, package):
                own = self.local(module)
                if own is not None:
                    parts = module.split(".")
                    self.read(own, parts if own.name == "__init__.py" else parts[:-1])
                    continue
                if module.split(".")[0] in sys.stdlib_module_names or any(
                        self.local(".".join(module.split(".")[:i])) for i in range(1, module.count(".") + 1)):
                    continue  # the standard library, or a name inside one of the script's own packages
                key = module
                previous = self.found.get(key)
                here = Import(module, f"{name}:{node.lineno}", node.lineno in optional)
                if previous is None or (previous.optional and not here.optional):
                    self.found[key] = here


def script_imports(entry: Path, source_dir: Path | None = None) -> list[Import]:
    """The third-party modules `entry` needs, directly and through source_dir's own modules, one
    Import each (its first required use, else its first use), sorted by module name."""
    root = source_dir if source_dir is not None else entry.parent
    reader = _Reader(root)
    reader.read(entry, [])
    return sorted(reader.found.values(), key=lambda i: i.module)
