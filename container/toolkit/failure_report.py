"""The failure file (`<base>/output/failure`), as the sagemaker-training toolkit writes it.

SageMaker shows its first 1,024 characters as the job's FailureReason. The toolkit's begins
`<error class>:\nExitCode N\nErrorMessage "..."\nCommand "..."` (its errors._CalledProcessError);
ours puts the most useful text first within that limit: the failing rank, host and exit code,
the exception, then the last frames of its traceback.
"""

from __future__ import annotations

import re
import signal

from launcher.wire import masking
from launcher.wire.faults import EXIT_HUNG, HUNG_EXCEPTION, RankFailure
from launcher.wire.opt_ml import FAILURE_LIMIT, process_ended

# torch's excepthook prefixes every traceback line with "[rankN]: " once the process group exists.
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.MULTILINE)
# Lines that are log records rather than the rest of an exception message: glog-style lines from
# torch's C++ side ("W1122 04:25:32...", "[W1122 ...]") and timestamped logging output.
_LOG_LINE = re.compile(r"^(\[?[IWEF]\d{4} |\d{4}-\d\d-\d\d)")

# libstdc++'s last words as torch destroys, at interpreter exit, a gloo process group still alive (its
# threads joinable): the rank aborts after its work (torch/gloo teardown; plain torchrun does the same).
TEARDOWN_ABORT = "terminate called without an active exception"
TEARDOWN_NOTE = (
    f"the signature of a known torch/gloo teardown abort ({TEARDOWN_ABORT!r} last, no exception before it): "
    "the rank aborted at exit, after its work, as Python destroyed process groups the script left alive. "
    "Fix: end the script with torch.distributed.barrier() and torch.distributed.destroy_process_group(); a "
    "script with a DeviceMesh (FSDP2, tensor parallelism), whose groups outlive destroy_process_group, then "
    "flushes its output and leaves with os._exit(0) (docs/own-scripts.md)")

# The header allows the longest class name and a 3-digit code.
_ERROR_HEAD = '{kind}:\nExitCode {code}\nErrorMessage "'
MESSAGE_LIMIT = FAILURE_LIMIT - len(_ERROR_HEAD.format(kind="InstallRequirementsError", code=255)) - 1


def toolkit_error(kind: str, code: int, message: str, cmd: list[str]) -> str:
    """A failure file as the toolkit writes it: our message (for a script: rank, host, exception,
    last frames) as the ErrorMessage, the command after it where room is left."""
    text = f'{_ERROR_HEAD.format(kind=kind, code=code)}{message[:MESSAGE_LIMIT]}"'
    command = f'\nCommand "{cmd}"'  # the toolkit formats the argument list with %s
    return text + command if len(text) + len(command) <= FAILURE_LIMIT else text

def rank_ended(returncode: int, record: RankFailure | None) -> str:
    """How a rank ended (its return code as Popen gives it): a rank whose step watchdog declared a
    hang, as its failure record says, hung, whatever the exit code's number; any other, by the code."""
    if returncode == EXIT_HUNG and record is not None and record.exception == HUNG_EXCEPTION:
        return f"hung: {record.message}; its step watchdog ended it (exit code {EXIT_HUNG})"
    return process_ended(returncode)


def known_cause(code: int, stderr: str) -> str | None:
    """What a failure's signature says of its cause where it is a known one, else None: a rank killed
    by SIGABRT (`code` as exit_code gives it) whose stderr ends with TEARDOWN_ABORT and holds no
    traceback aborted in torch's teardown; any other SIGABRT (an exception first, another message
    last, a crash mid-run) is not claimed."""
    lines = [ln.strip() for ln in _RANK_PREFIX.sub("", stderr).splitlines() if ln.strip()]
    if code != 128 + signal.SIGABRT or not lines or lines[-1] != TEARDOWN_ABORT or parse_traceback(stderr)[0]:
        return None
    return TEARDOWN_NOTE


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by N -> 128 + N, as a shell


def failure_text(header: str, stderr: str, limit: int = MESSAGE_LIMIT) -> str:
    """At most `limit` characters, most useful first: header, exception, then the last frames.

    Without a Python traceback in `stderr`, the last lines of `stderr` follow the header.
    """
    # Masked before anything is cut to fit: a cut secret would no longer be recognised.
    mask = masking.installed()
    header, stderr = mask(header), mask(stderr)
    exception, frames = parse_traceback(stderr)
    if not exception:
        lines = [ln for ln in _RANK_PREFIX.sub("", stderr).splitlines() if ln.strip()]
        return fit([header, "last lines of stderr:"], lines, limit)
    head = [header, "\n".join(exception)[: limit // 2], "Traceback (most recent call last):"]
    return fit(head, frames, limit)


def fit(head: list[str], tail: list[str], limit: int) -> str:
    """`head`, then as many of the *last* entries of `tail` as fit, after "  ..." if not all."""
    text = "\n".join(head)[:limit]
    room = limit - len(text) - len("\n  ...")
    kept: list[str] = []
    for entry in reversed(tail):
        if len(entry) + 1 > room:
            break
        kept.insert(0, entry)
        room -= len(entry) + 1
    skipped = ["  ..."] if len(kept) < len(tail) and room >= 0 else []
    return "\n".join([text, *skipped, *kept])


def parse_traceback(stderr: str) -> tuple[list[str], list[str]]:
    """(exception lines, frames) of the last Python traceback in `stderr`; ([], []) if none.

    Each frame is its `File ...` line with its source and caret lines. A chained exception's
    last traceback is the one that ended the program.
    """
    lines = _RANK_PREFIX.sub("", stderr).splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    if not starts:
        return [], []
    frames: list[str] = []
    body = lines[starts[-1] + 1:]
    i = 0
    while i < len(body) and body[i].startswith("  "):
        if body[i].startswith("  File ") or not frames:
            frames.append(body[i])
        else:
            frames[-1] += "\n" + body[i]
        i += 1
    exception: list[str] = []
    for line in body[i:]:
        if not line.strip() or _LOG_LINE.match(line) or len(exception) == 5:
            break  # the message has ended: what follows is other output
        exception.append(line)
    return exception, frames
