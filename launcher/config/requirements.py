"""The requirements.txt a runtime job's code archive carries: what smlaunch's runtime needs.

The image's toolkit installs the code's requirements.txt with pip before training; smlaunch's
runtime imports a few distributions beyond the image's PyTorch, which are added to the user's
own lines (a distribution the user already names keeps the user's line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from launcher.wire.training.issues import SourceDirError

# What smlaunch's runtime imports beyond the image's PyTorch (distribution names). Their versions
# are smlaunch's own requirements (runtime_requirements); torch is the image's, checked in images.py.
RUNTIME_DISTRIBUTIONS = ("pydantic", "numpy", "safetensors", "huggingface_hub")
REQUIREMENTS = "requirements.txt"
# Beside the packages in a checkout (an editable install); a wheel install has none: its metadata.
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def with_requirements(text: str, lines: Sequence[str]) -> tuple[str, list[str]]:
    """`text` (a requirements.txt) with those of `lines` whose distribution it does not name yet."""
    named = {_distribution(line) for line in text.splitlines()}
    added = [line for line in lines if _distribution(line) not in named]
    if added:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "# smlaunch's runtime (added by smlaunch)\n" + "".join(f"{line}\n" for line in added)
    return text, added


def _distribution(requirement: str) -> str | None:
    """The normalised distribution name a requirements line names; None for options and comments."""
    match = _NAME.match(requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def runtime_requirements() -> list[str]:
    """RUNTIME_DISTRIBUTIONS with the versions smlaunch requires (its dependencies and `train` extra):
    from the pyproject.toml beside the packages that ship (a checkout), else from the installed
    distribution's metadata."""
    declared = {_distribution(r): r for r in _declared_requirements()}
    missing = [n for n in RUNTIME_DISTRIBUTIONS if _distribution(n) not in declared]
    if missing:
        raise SourceDirError(f"smlaunch's requirements do not name {', '.join(missing)}, which its runtime "
                             "imports: add them to pyproject.toml (dependencies or the train extra)")
    return [declared[_distribution(n)] for n in RUNTIME_DISTRIBUTIONS]


def runtime_constraints() -> list[str]:
    """What a local job's environment for its requirements.txt must keep for smlaunch's runtime to
    run in it (pip's constraints there, launcher.local.jobenv): the runtime's requirements and torch's."""
    declared = {_distribution(r): r for r in _declared_requirements()}
    torch = [declared["torch"]] if "torch" in declared else []
    return [_constraint(line) for line in [*runtime_requirements(), *torch]]


def _constraint(requirement: str) -> str:
    """A requirement as pip takes it as a constraint: without extras (`torch[x]>=2` -> `torch>=2`)."""
    return re.sub(r"\[[^\]]*\]", "", requirement.split(";", 1)[0]).strip()


def _declared_requirements() -> list[str]:
    pyproject = PYPROJECT
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the metadata says the same
        tomllib = None
    if tomllib is not None and pyproject.is_file():
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "smlaunch":
            return [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("train", [])]
    from importlib.metadata import PackageNotFoundError, requires

    try:
        found = requires("smlaunch") or []
    except PackageNotFoundError:
        raise SourceDirError("smlaunch is not installed, so its runtime's requirements are unknown: "
                             "pip install -e . (or pip install smlaunch)") from None
    out = []
    for line in found:
        requirement, _, marker = line.partition(";")
        if not marker.strip() or re.search(r"""extra\s*==\s*["']train["']""", marker):
            out.append(requirement.strip())
    return out
