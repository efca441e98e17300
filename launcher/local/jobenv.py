"""A job's own Python environment for its `requirements.txt`: never the Python that launched it.

On SageMaker the toolkit pip-installs the code's requirements.txt into the container's Python,
which the job has to itself. On this machine that Python is the user's (the one `smlaunch` runs
in), so the process runner and the Slurm runner install the requirements into a virtual
environment of the job's instead, once, before any host starts; the hosts' bootstraps, torchrun
and the ranks run with its interpreter, and the bootstrap skips its own pip install
(`REQUIREMENTS_INSTALLED_ENV` names the requirements.txt that is installed).

The environment is layered on the launching one: a venv made by the launching Python whose
site-packages hold only what the requirements add, and a `.pth` file that appends the launching
interpreter's site directories after them (`--system-site-packages` would append the *base*
interpreter's, which for a launching venv is not where torch is). So torch and smlaunch are seen,
not copied or downloaded, and what the requirements pin (an older pydantic) shadows the launching
copy for the job only; pip leaves the launching site directories alone ("outside environment").

Where it lives: the process runner keeps environments in `$SMLAUNCH_HOME/envs/<key>/`, the key
the sha256 of requirements.txt, of every local file it makes pip read (wheels, `--find-links`
directories, `-e ./pkg` projects, `-r`/`-c` files: launcher.config.requirement_paths, which also
refuses paths outside the code), of the launching interpreter (path, prefix, version, the listing of its site
directories) and of the runtime's constraints; the next job with the same key reuses it. The
Slurm runner builds one per job in the job's directory, on the file system every node sees.

An environment is used only once its marker file exists, which is written last. It is built in
place under a lock (`<key>.lock`), not in a temporary directory renamed at the end: pip writes
the environment's path into the scripts it installs, which a rename would leave pointing at the
temporary name. A build that died half-way (no marker) is removed by the next one. pip runs in a
copy of the code inside the environment (`code/`), so an editable install (`-e ./pkg`) points at
files that live as long as the environment; the marker is written, and an environment reused, only
while every path its installs point at exists.

A pip failure fails the job before any rank starts, with the toolkit's failure text
(`InstallRequirementsError`, launcher.local.pip_failure) naming the requirement pip stopped at. For a job that runs
smlaunch's runtime, pip also gets the runtime's requirements as constraints, so a requirements.txt
that pins, say, pydantic 1 fails with pip's own account of the conflict instead of a crash of
every rank at import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from launcher.config.requirement_paths import content_digest, local_paths
from launcher.local import leftovers
from launcher.local.pip_failure import failure, pip_failure
from launcher.wire import code_archive, pip_output
from launcher.wire.masking import Masker

REQUIREMENTS = "requirements.txt"
MARKER = ".smlaunch-env.json"  # written last: an environment without it is not used
FORMAT = "smlaunch-job-env-2"  # part of the key: a change of layout gives new environments
PTH_FILE = "_smlaunch_launching_env.pth"
CODE = "code"  # the environment's copy of the code pip ran in: what editable installs point at
KEY_CHARS = 24  # of the sha256 in an environment's directory name
TAIL_LINES = 60  # of pip's output kept for the failure text
POLL_S = 0.1
# Variables that would send pip's installs somewhere other than the job's environment.
_PIP_REDIRECTS = ("PIP_TARGET", "PIP_PREFIX", "PIP_USER", "PIP_ROOT", "PIP_EDITABLE_MODE")

# What the launching interpreter is: run in it, so that a Slurm node's Python answers for itself.
_PROBE = r"""
import hashlib, importlib.util, json, os, site, sys
dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
dirs = [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
listed = hashlib.sha256()
for d in dirs + [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and p not in dirs]:
    if os.path.isdir(d):
        listed.update(("\0".join([d, *sorted(os.listdir(d))]) + "\n").encode())
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix, "version": sys.version,
                  "site_dirs": dirs, "installed": listed.hexdigest(),
                  "pip": importlib.util.find_spec("pip") is not None}))
"""


@dataclass
class JobEnvironment:
    """The environment a job runs in."""

    path: Path
    python: Path
    reused: bool
    requirements_sha256: str
    seconds: float = 0.0

    def record(self) -> dict:
        """What job.json says about it."""
        return {"Path": str(self.path), "Python": str(self.python), "Reused": self.reused,
                "RequirementsSha256": self.requirements_sha256}


class RequirementsFailed(Exception):
    """The requirements could not be installed; str() is the failure text (the toolkit's shape)."""


class SetupStopped(Exception):
    """The job was asked to stop while its environment was being built."""


# --- the code's requirements -------------------------------------------------------------------

def archived_requirements(archive: Path) -> bytes | None:
    """The requirements.txt at the root of a code archive, or None (none, or only comments)."""
    with tarfile.open(archive) as tar:
        try:
            member = tar.getmember(REQUIREMENTS)
        except KeyError:
            return None
        data = tar.extractfile(member).read() if member.isfile() else None
    return data if data is not None and requirement_lines(data.decode("utf-8", "replace")) else None


def requirement_lines(text: str) -> list[str]:
    """The lines of a requirements file that say something: neither blank nor comments."""
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def extract_code(archive: Path, dest: Path) -> None:
    """The archive's files into `dest`, as the bootstrap extracts them (nothing outside dest); an
    archive that would write elsewhere fails the job before any host starts, as the bootstrap would."""
    try:
        code_archive.extract(archive, dest)
    except code_archive.UnsafeArchive as exc:
        raise RequirementsFailed(failure(1, str(exc))) from None


# --- the key -----------------------------------------------------------------------------------

def interpreter(python: str) -> dict:
    """The launching interpreter as the key and the `.pth` file need it."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RequirementsFailed(failure(1, f"could not run {python} to build the job's environment for "
                                            f"requirements.txt: {exc}")) from None
    if out.returncode != 0:
        raise RequirementsFailed(failure(out.returncode, f"{python} failed to describe itself for the job's "
                                                         f"environment: {out.stderr.strip()[-400:]}"))
    return json.loads(out.stdout)


def environment_key(requirements: bytes, code_dir: Path, base: dict, constraints: Sequence[str] = ()) -> str:
    """sha256 of what the environment's content depends on (see the module docstring)."""
    digest = hashlib.sha256()
    for part in (FORMAT, base["executable"], base["prefix"], base["version"], base["installed"],
                 *base["site_dirs"], "\n".join(constraints)):
        digest.update(part.encode() + b"\0")
    digest.update(requirements)
    for name, content in content_digest(local_paths(code_dir), code_dir):
        digest.update(b"\0" + name.encode() + b"\0" + content)
    return digest.hexdigest()


def check_local_paths(code_dir: Path) -> None:
    """Refuse a requirements.txt that names paths outside the code (validate refuses it first): they
    are in no job's code on SageMaker, and no environment's key could follow their content."""
    outside = [local for local in local_paths(code_dir) if not local.inside]
    if outside:
        raise RequirementsFailed(failure(1, "; ".join(f"{p.problem()}: {p.fix()}" for p in outside)))


# --- building it -------------------------------------------------------------------------------

def ensure_environment(env_dir: Path, *, key: str, requirements: bytes, code_dir: Path, base: dict,
                       constraints: Sequence[str] = (), environ: dict[str, str] | None = None,
                       log: Callable[[str], None] = print, masker: Masker | None = None,
                       should_stop: Callable[[], bool] = lambda: False) -> JobEnvironment:
    """The environment at `env_dir` for these requirements: reused when it was built for `key`,
    else built (under a lock, so that two jobs never build one environment at once)."""
    started = time.monotonic()
    sha = hashlib.sha256(requirements).hexdigest()
    found = _usable(env_dir, key)
    if found:
        return JobEnvironment(env_dir, found, True, sha)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with _locked(env_dir.with_name(env_dir.name + ".lock"), env_dir, log, should_stop):
        found = _usable(env_dir, key)  # built by the job we waited for
        if found:
            return JobEnvironment(env_dir, found, True, sha)
        gone = dangling_paths(env_dir) if (env_dir / MARKER).is_file() else []
        if gone:
            log(f"requirements.txt: the job environment {env_dir} points at {', '.join(gone)}, which no longer "
                "exist: building it again")
        shutil.rmtree(env_dir, ignore_errors=True)  # a build that died half-way, or one whose paths are gone
        try:
            python = _build(env_dir, requirements, code_dir, base, constraints, environ or dict(os.environ),
                            log, masker or Masker(), should_stop)
        except BaseException:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise
        seconds = time.monotonic() - started
        _write_marker(env_dir, {"key": key, "requirements_sha256": sha, "python": str(python),
                                "launching_python": base["executable"], "version": base["version"].split()[0],
                                "constraints": list(constraints), "seconds": round(seconds, 1),
                                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return JobEnvironment(env_dir, python, False, sha, seconds)


def _python_in(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _usable(env_dir: Path, key: str) -> Path | None:
    """The environment's Python, when it is complete, built for `key` and every path it points at is there."""
    try:
        marker = json.loads((env_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    python = _python_in(env_dir)
    return python if marker.get("key") == key and python.exists() and not dangling_paths(env_dir) else None


def dangling_paths(env_dir: Path) -> list[str]:
    """What the environment's installs point at outside their own files and is not there: the
    project of an editable install (its direct_url.json) and the directories .pth files add."""
    missing: set[str] = set()
    for site in env_dir.glob("lib/python*/site-packages"):
        for pth in site.glob("*.pth"):
            if pth.name == PTH_FILE:  # the launching interpreter's directories: its own business
                continue
            for line in pth.read_text(encoding="utf-8", errors="replace").splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "import ", "import\t")) and not (site / line).exists():
                    missing.add(str(site / line))
        for direct in site.glob("*.dist-info/direct_url.json"):
            try:
                url = json.loads(direct.read_text())
            except (OSError, ValueError):
                continue
            path = Path(unquote(urlparse(url.get("url", "")).path))
            if url.get("url", "").startswith("file:") and url.get("dir_info", {}).get("editable") and not path.exists():
                missing.add(str(path))
    return sorted(missing)


class _locked:
    """An exclusive lock on `path`, waited for while honouring a stop."""

    def __init__(self, path: Path, env_dir: Path, log: Callable[[str], None], should_stop: Callable[[], bool]):
        self.path, self.env_dir, self.log, self.should_stop = path, env_dir, log, should_stop

    def __enter__(self):
        import fcntl  # POSIX, as the runners that build environments: importing this module stays portable

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        said = False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if not said:
                    self.log(f"requirements.txt: another job is building {self.env_dir}; waiting for it")
                    said = True
                if self.should_stop():
                    os.close(self.fd)
                    raise SetupStopped from None
                time.sleep(POLL_S * 2)

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock


def _build(env_dir: Path, requirements: bytes, code_dir: Path, base: dict, constraints: Sequence[str],
           environ: dict[str, str], log: Callable[[str], None], masker: Masker,
           should_stop: Callable[[], bool]) -> Path:
    launching = base["executable"]
    log(f"requirements.txt: building the job's environment {env_dir}: a virtual environment of {launching} "
        "that sees its packages; pip installs into it, never into the launching Python")
    venv = [launching, "-m", "venv", *(["--without-pip"] if base["pip"] else []), str(env_dir)]
    # In a session of its own, as pip: a terminal's Ctrl-C reaches the supervisor, which stops the build.
    made = subprocess.run(venv, capture_output=True, text=True, timeout=600, check=False, start_new_session=True)
    if should_stop():
        raise SetupStopped
    if made.returncode != 0:
        raise RequirementsFailed(failure(made.returncode, (
            f"could not create the job's environment ({' '.join(venv)}): {made.stderr.strip()[-400:]}; "
            "install Python's venv module (Debian/Ubuntu: apt install python3-venv)")))
    python = _python_in(env_dir)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    # The launching interpreter's site directories after the environment's own (their .pth files
    # processed too, as for any site directory): seen, never written to.
    adds = "; ".join(f"site.addsitedir({d!r})" for d in base["site_dirs"])
    Path(purelib, PTH_FILE).write_text(f"import site; {adds}\n" if adds else "\n")
    # pip runs in a copy of the code that lives as long as the environment: an editable install
    # (`-e ./pkg`) points into it, and the job's own copy of the code is gone when the job ends.
    code = env_dir / CODE
    shutil.copytree(code_dir, code, symlinks=True)
    with tempfile.TemporaryDirectory(prefix="smlaunch-constraints-") as tmp:
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-r", REQUIREMENTS]
        if constraints:
            path = Path(tmp) / "smlaunch-runtime-constraints.txt"
            path.write_text("".join(f"{c}\n" for c in constraints))
            cmd += ["-c", str(path)]
        env = {k: v for k, v in environ.items() if k not in _PIP_REDIRECTS}
        env.pop("PYTHONHOME", None)
        status, tail = _run_pip(cmd, code, env, log, masker, should_stop)
    if status != 0:
        text = requirements.decode("utf-8", "replace")
        raise RequirementsFailed(masker(failure(status, pip_failure(tail, requirement_lines(text), constraints))))
    gone = dangling_paths(env_dir)
    if gone:  # never marked usable: a job would fail at import, and every later one with it
        raise RequirementsFailed(masker(failure(1, f"pip installed requirements.txt, but the environment points at "
                                                   f"{', '.join(gone)}, which do not exist")))
    return python


def _run_pip(cmd: list[str], cwd: Path, env: dict[str, str], log: Callable[[str], None], masker: Masker,
             should_stop: Callable[[], bool]) -> tuple[int, list[str]]:
    """Run pip with its output in the job's log (masked); (exit code, its last lines). A stop
    ends pip's process group and raises SetupStopped."""
    log(f"requirements.txt: {' '.join(cmd)} (in {cwd}, the environment's copy of the code)")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    tail: list[str] = []

    def pump():
        for raw in iter(proc.stdout.readline, b""):
            line = masker(raw.decode("utf-8", "replace").rstrip())
            if line.strip() and not pip_output.is_noise(line):
                tail.append(line)
                del tail[:-TAIL_LINES]
                log(f"pip | {line}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    while proc.poll() is None:
        if should_stop():
            for signum in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, signum)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            reader.join(timeout=5)
            raise SetupStopped
        time.sleep(POLL_S)
    reader.join(timeout=5)
    proc.stdout.close()
    return proc.returncode, tail


def _write_marker(env_dir: Path, fields: dict) -> None:
    partial = env_dir / f"{MARKER}.partial"
    partial.write_text(json.dumps(fields, indent=2) + "\n")
    os.replace(partial, env_dir / MARKER)


def pip_environment(job_dir: Path) -> dict[str, str]:
    """pip's environment: this one, with the job's mark (a stop or the watchdog ends it too)."""
    return {**os.environ, **leftovers.mark(job_dir), "PYTHONUNBUFFERED": "1"}



# --- for the runners ---------------------------------------------------------------------------

def job_environment(spec, *, python: str, place: Callable[[str], Path], log: Callable[[str], None],
                    should_stop: Callable[[], bool]) -> JobEnvironment | None:
    """The environment of a prepared job (`spec`, a LocalJobSpec) whose code has a requirements.txt,
    at `place(key)`; None when the code has none, and the hosts run `python` itself."""
    requirements = archived_requirements(spec.source_archive)
    if requirements is None:
        return None
    masker = Masker.of(spec.environment, spec.hyperparameters)
    with tempfile.TemporaryDirectory(dir=spec.job_dir, prefix=".requirements-") as tmp:
        code_dir = Path(tmp) / "code"
        extract_code(spec.source_archive, code_dir)
        check_local_paths(code_dir)
        base = interpreter(python)
        key = environment_key(requirements, code_dir, base, spec.runtime_constraints)
        env = ensure_environment(place(key), key=key, requirements=requirements, code_dir=code_dir, base=base,
                                 constraints=spec.runtime_constraints, environ=pip_environment(spec.job_dir),
                                 log=log, masker=masker, should_stop=should_stop)
    if env.reused:
        log(f"requirements.txt: reusing the job environment {env.path} (built for the same requirements.txt "
            f"and {base['executable']}); the hosts run {env.python}")
    else:
        log(f"requirements.txt: built the job environment {env.path} in {env.seconds:.1f} s; "
            f"the hosts run {env.python}")
    return env
