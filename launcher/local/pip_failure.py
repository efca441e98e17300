"""What a pip run that failed to build a job's environment says (launcher.local.jobenv): the toolkit's
failure text (`InstallRequirementsError`, as SageMaker's FailureReason shows it) naming the
requirements.txt line pip stopped at and, for smlaunch's runtime, the constraint it hit."""

from __future__ import annotations

import re
from collections.abc import Sequence

from launcher.wire.opt_ml import FAILURE_LIMIT

_ERROR_HEAD = 'InstallRequirementsError:\nExitCode {code}\nErrorMessage "'


def distribution_name(line: str) -> str | None:
    """The normalised distribution name a requirements line begins with."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def failing_requirement(output: Sequence[str], lines: Sequence[str]) -> str | None:
    """The requirements.txt line pip stopped at, as its ERROR lines (or the conflict it explains)
    name it; None when they name none."""
    errors = [ln for ln in output if ln.startswith("ERROR") or "requested" in ln or "requirement" in ln.lower()]
    text = "\n".join(errors)
    for line in lines:
        if line.startswith("-") and not line.startswith(("-e ", "--editable")):
            continue
        requirement = line.split(" #", 1)[0].strip().removeprefix("-e ").removeprefix("--editable ").strip()
        if requirement and requirement in text:
            return requirement
    normalised = re.sub(r"[-_.]+", "-", text.lower())
    for line in lines:
        name = distribution_name(line) if not line.startswith("-") else None
        if name and re.search(rf"(?<![a-z0-9-]){re.escape(name)}(?![a-z0-9])", normalised):
            return line.split(" #", 1)[0].strip()
    return None


def pip_failure(output: Sequence[str], lines: Sequence[str], constraints: Sequence[str] = ()) -> str:
    """The failure message: the requirement pip stopped at, why, and pip's last lines."""
    requirement = failing_requirement(output, lines)
    what = f"pip could not install {requirement!r} from requirements.txt" if requirement else (
        "pip could not install requirements.txt")
    conflict = [c for c in constraints
                if distribution_name(c) and requirement and distribution_name(c) == distribution_name(requirement)]
    if conflict or (constraints and any("constraint" in ln for ln in output)):
        needs = ", ".join(conflict or constraints)
        what += (f"; smlaunch's runtime (the job's entry point imports container.trainer) needs {needs}: "
                 "drop or loosen that line, or run a script of your own")
    errors = [ln for ln in output if ln.startswith("ERROR")]
    head = [what + ("; " + errors[0].removeprefix("ERROR: ") if errors else "")]
    limit = FAILURE_LIMIT - len(_ERROR_HEAD.format(code=255)) - 1
    text = "\n".join(head)[:limit]
    kept: list[str] = []
    room = limit - len(text) - len("\nlast lines of pip's output:")
    for line in reversed([ln for ln in output if ln not in errors[:1]]):
        if len(line) + 1 > room:
            break
        kept.insert(0, line)
        room -= len(line) + 1
    return "\n".join([text, "last lines of pip's output:", *kept]) if kept else text


def failure(code: int, message: str) -> str:
    """The toolkit's failure text for a requirements.txt pip could not install."""
    head = _ERROR_HEAD.format(code=code)
    return f'{head}{message[:FAILURE_LIMIT - len(head) - 1]}"'
