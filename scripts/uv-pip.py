#!/usr/bin/env python3
"""`uv pip ...` configured as pip is here, and pip without its "Location ... is ignored" walls.

    scripts/uv-pip.py install|compile|check ... [uv pip's arguments]
    scripts/uv-pip.py --pip install ...          [pip's arguments]
    scripts/uv-pip.py --check PROJECT [EXTRA ...]

uv reads no pip.conf, yet what installs from the lock must honour pip's configuration: the CPU
torch wheel lies in pip's find-links, a local index may be among its extra-index-urls, its
constraint file caps torch, its cert may be a private CA. So this runs uv (the `uv` package
installed in the Python running this script; it acts on that Python's environment unless
--python names another) with what `pip config list` reports, read afresh on each call
(environment variables first, then the [install] section, then [global]):

    index-url, extra-index-url, find-links  --index-url, --extra-index-url, --find-links
                                            (local ones that do not exist are left out, as pip
                                            ignores them, only without warning about them)
    no-index                                --no-index
    constraint                              --constraint (not with --require-hashes)
    trusted-host                            --allow-insecure-host
    cert, client-cert                       SSL_CERT_FILE, SSL_CLIENT_CERT (unless already set)
    timeout, default-timeout                UV_HTTP_TIMEOUT (unless already set)
    proxy                                   HTTPS_PROXY, HTTP_PROXY (unless already set)

and --index-strategy unsafe-best-match: like pip, the newest version on any index wins (uv's own
default takes a package only from the first index that has it). Without any pip configuration
this is plain uv on PyPI.

--pip runs `python -m pip` with the same Python, passing its output through except pip's
"WARNING: Location '...' is ignored: it is neither a file nor a directory." lines (one per
package and missing local index; the rule is launcher/wire/pip_output.py's, which a job's
environment uses too); its errors and other warnings are kept, its exit status too.

--check runs pip check and also checks PROJECT's requirements for the EXTRAs (pip check leaves
extras out), printing what is missing or of an unfitting version: after an install from a lock
with --no-deps, a lock that pyproject.toml has outgrown.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

# launcher.wire imports nothing, so the checkout's copy loads before anything is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launcher.wire.pip_output import is_noise  # noqa: E402

# The settings taken from pip, by name; the sections, strongest first, as pip install reads them.
SECTIONS = (":env:", "install", "global")


def pip_config(python: str) -> dict[str, str]:
    """pip's effective settings for `pip install`: {key: value}, from `pip config list`."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if out.returncode != 0:
        sys.exit(f"uv-pip.py: `pip config list` failed:\n{out.stderr}")
    found: dict[tuple[str, str], str] = {}
    for line in out.stdout.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not (sep and dot):
            continue
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            value = raw.strip("'\"")
        found[(section, key)] = str(value)
    settings: dict[str, str] = {}
    for section in reversed(SECTIONS):
        settings.update({key: value for (sec, key), value in found.items() if sec == section})
    return settings


def is_true(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def exists(location: str) -> bool:
    """A local path or file:// URL that is there, or any remote URL (uv will say if it is not)."""
    url = urlparse(location)
    if url.scheme == "file":
        return Path(unquote(url.path)).exists()
    if url.scheme in ("http", "https"):
        return True
    return Path(location).exists()


def uv_options(settings: dict[str, str], constraints: bool = True) -> tuple[list[str], dict[str, str]]:
    """uv's arguments and environment variables for pip's settings (without pip's constraints
    where CONSTRAINTS is false)."""
    args = ["--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    values = {key: value.split() for key, value in settings.items()}
    if is_true(settings.get("no-index", "")):
        args.append("--no-index")
    for key, flag in (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"),
                      ("find-links", "--find-links")):
        args += [part for location in values.get(key, []) if exists(location)
                 for part in (flag, location)]
    for path in values.get("constraint", []) if constraints else []:
        args += ["--constraint", path]
    for host in values.get("trusted-host", []):
        args += ["--allow-insecure-host", host]
    for key, var in (("cert", "SSL_CERT_FILE"), ("client-cert", "SSL_CLIENT_CERT"),
                     ("timeout", "UV_HTTP_TIMEOUT"), ("default-timeout", "UV_HTTP_TIMEOUT"),
                     ("proxy", "HTTPS_PROXY"), ("proxy", "HTTP_PROXY")):
        if settings.get(key) and var not in os.environ and var not in env:
            env[var] = settings[key]
    return args, env


def run_pip(args: list[str]) -> int:
    """python -m pip ARGS, without the "Location ... is ignored" warnings."""
    proc = subprocess.Popen([sys.executable, "-m", "pip", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        if not is_noise(line):
            sys.stdout.write(line)
            sys.stdout.flush()
    return proc.wait()


def check(project: str, extras: list[str]) -> int:
    """pip check, and whether PROJECT's requirements with EXTRAS are installed, at fitting versions
    (pip check leaves extras out): what an install from a lock that pyproject.toml has outgrown
    misses."""
    from importlib.metadata import PackageNotFoundError, requires, version
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    unmet = []
    for line in requires(project) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker and not any(marker.evaluate({"extra": extra}) for extra in ["", *extras]):
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            unmet.append(f"{project} requires {requirement}, which is not installed")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"{project} requires {requirement}, but {installed} is installed")
    pip = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True,
                         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if pip.returncode != 0:
        unmet += pip.stdout.splitlines()
    for line in unmet:
        print(line, file=sys.stderr)
    return 1 if unmet else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--pip":
        return run_pip(argv[1:])
    if argv[0] == "--check":
        if len(argv) < 2:
            sys.exit("usage: uv-pip.py --check PROJECT [EXTRA ...]")
        return check(argv[1], argv[2:])
    try:
        from uv import find_uv_bin
    except ImportError:
        sys.exit(f"uv-pip.py: the `uv` package is not installed in {sys.executable}")
    # uv pip's subcommand comes first, its options after it (uv takes them there).
    command, rest = argv[0], argv[1:]
    # With --require-hashes uv takes constraints only as exact pins with hashes; and a lock
    # installed by its hashes resolves nothing: pip's constraints applied when it was compiled.
    args, env = uv_options(pip_config(sys.executable), constraints="--require-hashes" not in rest)
    if command not in ("install", "compile", "sync"):
        args = []  # check, list, freeze, show, uninstall: no index is read
    if not any(arg in ("-p", "--python") or arg.startswith("--python=") for arg in rest):
        args += ["--python", sys.executable]  # the environment of the Python running this script
    cmd = [find_uv_bin(), "pip", command, *args, *rest]
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
