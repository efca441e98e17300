"""`python -m launcher.cli ARGS` as tests run it (tests/support/local_jobs.smlaunch), in a process forked
from the test process's fork server (tests/support/forkserver.py), which has imported the CLI and the
modules its commands import when they run: a command starts in milliseconds, where a fresh interpreter
spent ~0.3 CPU s importing them (~150 commands a suite).

The process is the command's own, as a fresh one would be: the test's environment, working directory
(first on sys.path, as `-m` puts it), standard output and error in files read back as `subprocess.run`'s
capture gives them, standard input /dev/null, its exit code (-N for a signal), a timeout that kills it
and raises subprocess.TimeoutExpired, and the exit handlers it registered itself run as it leaves. None of
the preloaded modules reads the environment, the directory or the arguments when imported (checked when
they were chosen), so what differs from a fresh interpreter is only the start. An environment that sets
a Python variable of its own (PYTHONPATH, ...) gets a fresh interpreter (`forkable`); so does a command a
test starts itself to signal it while it runs (a Popen: test_local_mode's Ctrl-C), and the CLI's start
is measured where it is the subject (bench/cli_startup.py; what it imports: tests/unit/test_architecture.py
reads it from the source)."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support import forkserver

COMMAND = [sys.executable, "-m", "launcher.cli"]
PROG_NAME = "python -m launcher.cli"  # what click calls the program run as COMMAND


def forkable(env: dict[str, str]) -> bool:
    """Whether a command in `env` can be forked: Python reads its own variables at start only."""
    python = {k: v for k, v in env.items() if k.startswith("PYTHON")}
    return python == {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """The command's exit code and captured output, as `subprocess.run(COMMAND + args, capture_output=True,
    text=True, timeout=timeout)` returns them."""
    context = multiprocessing.get_context(forkserver.start_method())
    with tempfile.TemporaryDirectory(prefix="smlaunch-cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        process = context.Process(target=_command, args=(args, env, str(cwd), str(out), str(err)))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([*COMMAND, *args], timeout, output=_text(out), stderr=_text(err))
        return subprocess.CompletedProcess([*COMMAND, *args], process.exitcode, _text(out), _text(err))


def _text(path: Path) -> str:
    # universal newlines, as subprocess's text mode reads them
    return path.read_text(errors="replace") if path.exists() else ""


def _command(args: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """In the forked process: become `python -m launcher.cli ARGS` in `env` and `cwd`, and leave as it would."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.argv = [PROG_NAME, *args]
    atexit._clear()  # the fork server's; those the command registers run as it leaves (below)
    from launcher.cli import main

    try:
        main.main(args=args, prog_name=PROG_NAME)
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
