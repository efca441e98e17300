"""The docker runner: one container per simulated host, described by a compose file.

Like SageMaker local mode, each host is a compose service named after the host (`algo-1`, ...)
on a network of its own, where the host name resolves, so the bootstrap in the image finds the
master at `algo-1:7777` exactly as on AWS. The mounts are those SageMaker gives a container:
the host's `input/config` and `output`, one `model` directory shared by every host (as local
mode does), the shared checkpoints, and the channels, each mounted read-only at its place under
`/opt/ml/input/data/`. The channels are mounted from their sources, not through the host's
tree, because that tree links big files to their host paths, which dangle inside a container.

`start` creates the containers with `compose up --no-start --force-recreate` (afresh: a restart
after a lost host starts them again with the next attempt's environment, which podman-compose would
not put into containers that exist already), then attaches to each one with
`<engine> start --attach`: one process per host, as the process runner gives the supervisor, so
per-host logs, exit codes and the stop-the-others-on-failure policy are the same for both
runners. (`compose up --abort-on-container-exit`, SageMaker's choice, stops every host as soon as
one exits, even successfully: a worker that leaves a moment before the master would cut the
master's last writes short.)

Engines: Docker with the compose v2 plugin or docker-compose, or podman with `podman compose`
or podman-compose. SMLAUNCH_CONTAINER_ENGINE=docker|podman picks one. Podman's OCI runtime is
left to the machine (`runtime = "runc"` under `[engine]` in containers.conf where crun fails,
as under cgroups v1): podman-compose ignores a compose file's `runtime:`, and podman already
uses runc where crun is not installed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from launcher.local.spec import (
    HostProcess,
    LocalJobSpec,
    RunnerError,
    attempt_environment,
    refuse_gone_host,
    signal_process_groups,
)
from launcher.wire.opt_ml import write_private

ENGINE_ENV = "SMLAUNCH_CONTAINER_ENGINE"
DEFAULT_IMAGE = "smlaunch:latest"  # what `make image` (scripts/build-image.sh) names
COMPOSE_FILE = "docker-compose.yaml"
OPT_ML = "/opt/ml"
SUBMIT_DIRECTORY = f"{OPT_ML}/sourcedir.tar.gz"  # where the job's code archive is mounted
STOP_GRACE_PERIOD = "120s"  # SageMaker's time between SIGTERM and SIGKILL
SHM_SIZE = "8gb"  # Docker's 64 MB /dev/shm breaks torch DataLoader workers and NCCL
# Podman needs explicit limits where its defaults exceed the host's hard limits
# (docs/local-docker.md, "Podman"); both are below any sane host's limit, and NPROC binds only
# rootless engines (root is exempt).
ULIMITS = {"nofile": {"soft": 20000, "hard": 20000}, "nproc": {"soft": 4096, "hard": 4096}}
ULIMIT_FLAGS = tuple(f"--ulimit={k}={v['soft']}:{v['hard']}" for k, v in ULIMITS.items())  # for `run`
PROBE_TIMEOUT_S = 15  # `docker info` against a socket that never answers
CREATE_TIMEOUT_S = 300
DOWN_TIMEOUT_S = 120
CHOWN_TIMEOUT_S = 600
# Where podman looks for CNI plugins; with the CNI backend, container names resolve on a network
# only through the dnsname plugin (netavark resolves them through aardvark-dns).
CNI_PLUGIN_DIRS = ("/usr/lib/cni", "/usr/libexec/cni", "/opt/cni/bin")

log = logging.getLogger(__name__)


def image_text(job) -> str:
    """What a local job's hosts run (validate's summary): the docker runner's image, or this machine's Python."""
    if job.config.local_runner == "docker":
        return f"{job.config.image_uri or DEFAULT_IMAGE} (local docker runner)"
    return "none: the local process runner uses this machine's Python"


@dataclass(frozen=True)
class Engine:
    """A container engine that answers, and the compose command that drives it."""

    name: str  # "docker" or "podman"
    cli: tuple[str, ...]  # ("docker",): `image inspect`, `start --attach`, `run`, `network rm`
    compose: tuple[str, ...]  # ("docker", "compose"), ("docker-compose",), ("podman-compose",), ...


# --- the compose file (pure) -------------------------------------------------------------------

def project_name(spec: LocalJobSpec) -> str:
    """The compose project, network and container-name prefix: the job name, as compose wants it."""
    name = re.sub(r"[^a-z0-9_-]+", "-", spec.name.lower()).strip("-_")
    if not name:
        raise RunnerError(f"job name {spec.name!r} gives no usable compose project name")
    return name


def container_name(spec: LocalJobSpec, host: str) -> str:
    return f"{project_name(spec)}-{host}"


def model_dir(spec: LocalJobSpec) -> Path:
    """The one /opt/ml/model every container writes to (what becomes model.tar.gz)."""
    return spec.job_dir / "model"


def compose_file(spec: LocalJobSpec, engine: str = "docker") -> dict:
    """The compose file of the job: one service per host (see the module docstring).

    `engine` only changes how GPUs are asked for: Docker takes a device reservation for the
    NVIDIA runtime, podman (which ignores reservations) takes CDI devices (`nvidia.com/gpu=N`,
    after `nvidia-ctk cdi generate`).
    """
    if spec.instance_type == "local_gpu" and len(spec.gpus_per_host) != len(spec.hosts):
        raise RunnerError(
            f"local_gpu needs one GPU list per host: {len(spec.hosts)} hosts, "
            f"gpus_per_host {spec.gpus_per_host}"
        )
    project = project_name(spec)
    environment = {k: str(v) for k, v in sorted({**spec.environment, **attempt_environment(spec)}.items())}
    environment["TRAINING_JOB_NAME"] = spec.name  # set by the SageMaker platform in every container
    services = {}
    for index, host in enumerate(spec.hosts):
        service: dict = {
            "image": spec.image or DEFAULT_IMAGE,
            "container_name": container_name(spec, host),
            "hostname": host,
            "command": "train",
            "environment": dict(environment),
            "volumes": _volumes(spec, host),
            # The service name (the host) is the container's name on the network for every
            # compose; the list form, because podman-compose 1.0 refuses per-network `aliases`.
            "networks": [project],
            "shm_size": SHM_SIZE,
            "stop_grace_period": STOP_GRACE_PERIOD,
            "ulimits": {k: dict(v) for k, v in ULIMITS.items()},
        }
        if spec.instance_type == "local_gpu":
            ids = [str(i) for i in spec.gpus_per_host[index]]
            if engine == "podman":
                service["devices"] = [f"nvidia.com/gpu={i}" for i in ids]
            else:
                service["deploy"] = {"resources": {"reservations": {"devices": [
                    {"driver": "nvidia", "device_ids": ids, "capabilities": ["gpu"]}
                ]}}}
        services[host] = service
    # No top-level `name:` (docker-compose 1.x refuses it): the project is given with `-p`.
    return _literal({"services": services, "networks": {project: {"name": project}}})


def _literal(value):
    """`value` with every string's `$` written `$$`: compose interpolates `$NAME` and `${NAME}` from
    the host's environment in every value, so a secret `pa$$word` would arrive as `pa$word`, `ab$cd`
    as `ab`, and `${AWS_SECRET_ACCESS_KEY}` as the host's key. `$$` is compose's literal `$`
    (Docker Compose and podman-compose alike), so the containers get exactly the job's values."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {key: _literal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_literal(item) for item in value]
    return value


def _volumes(spec: LocalJobSpec, host: str) -> list[str]:
    host_dir = spec.host_dir(host)
    mounts = [
        (host_dir / "input" / "config", f"{OPT_ML}/input/config", False),
        (host_dir / "output", f"{OPT_ML}/output", False),
        (model_dir(spec), f"{OPT_ML}/model", False),
        (spec.checkpoint_dir, f"{OPT_ML}/checkpoints", False),
        (spec.source_archive, SUBMIT_DIRECTORY, True),
    ]
    for channel, source in sorted(spec.channels_of(host).items()):
        source = Path(source)
        if not source.exists():
            raise RunnerError(f"channel {channel!r}: its source {source} does not exist")
        target = f"{OPT_ML}/input/data/{channel}"
        # write_opt_ml puts a file channel's file inside the channel directory.
        if source.is_file():
            target = f"{target}/{source.name}"
        mounts.append((source, target, True))
    volumes = []
    for source, target, read_only in mounts:
        source = os.path.abspath(source)
        if ":" in source or ":" in target:
            raise RunnerError(f"cannot mount {source} at {target}: compose volumes cannot hold ':'")
        volumes.append(f"{source}:{target}" + (":ro" if read_only else ""))
    return volumes


def write_compose_file(spec: LocalJobSpec, engine: str = "docker") -> Path:
    import yaml  # only the docker runner needs it

    path = spec.job_dir / COMPOSE_FILE
    # 0600: the services' environment holds the job's secrets in clear.
    write_private(path, yaml.safe_dump(compose_file(spec, engine), sort_keys=False))
    return path


# --- finding an engine -------------------------------------------------------------------------

def find_engine() -> Engine:
    """Docker whose daemon answers, else podman; each with a compose command that works.

    SMLAUNCH_CONTAINER_ENGINE=docker|podman tries only that engine. Raises RunnerError naming
    what was tried and how to get an engine.
    """
    wanted = os.environ.get(ENGINE_ENV, "").strip().lower()
    if wanted and wanted not in ("docker", "podman"):
        raise RunnerError(f"{ENGINE_ENV}={wanted!r}: use docker or podman")
    tried = []
    for name in (wanted,) if wanted else ("docker", "podman"):
        engine, problem = _probe(name)
        if engine is not None:
            return engine
        tried.append(f"  - {name}: {problem}")
    raise RunnerError(
        "the docker runner found no container engine. Tried:\n" + "\n".join(tried) + "\n"
        "To fix, do one of:\n"
        "  - start the Docker daemon (with the compose plugin: `docker compose version` must work)\n"
        "  - install podman and podman-compose (Debian/Ubuntu: apt-get install podman podman-compose)\n"
        "  - run the job without containers: --runner process\n"
        f"{ENGINE_ENV}=docker|podman picks one engine."
    )


def _probe(name: str) -> tuple[Engine | None, str]:
    """(the engine, "") or (None, why it cannot be used)."""
    path = shutil.which(name)
    if path is None:
        return None, "not installed (not on PATH)"
    ok, detail = _answers([name, "info"])
    if not ok:
        what = "its daemon does not answer" if name == "docker" else "it cannot run containers"
        return None, f"{path} is installed but {what} (`{name} info`: {detail})"
    candidates = (
        [(name, "compose"), ("docker-compose",)] if name == "docker"
        else [(name, "compose"), ("podman-compose",)]
    )
    for compose in candidates:
        if shutil.which(compose[0]) and _answers([*compose, "version"])[0]:
            return Engine(name, (name,), compose), ""
    tried = " or ".join(f"`{' '.join(c)} version`" for c in candidates)
    return None, f"{name} answers, but no compose command does ({tried})"


def _podman_dns_problem(engine: Engine) -> str | None:
    """Why the hosts could not find `algo-1` by name on a podman network, or None."""
    try:
        out = subprocess.run([*engine.cli, "info", "--format", "{{.Host.NetworkBackend}}"],
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None  # `podman info` answered during find_engine; its start will tell
    if out.stdout.strip() != "cni":
        return None
    if any(os.path.exists(os.path.join(d, "dnsname")) for d in CNI_PLUGIN_DIRS):
        return None
    return (
        "podman uses CNI networks without the dnsname plugin, so the hosts cannot find algo-1 "
        "by name and torchrun would wait for it until its timeout. Install the plugin (Debian/"
        "Ubuntu: apt-get install golang-github-containernetworking-plugin-dnsname), or run "
        "podman with the netavark network backend and aardvark-dns"
    )


def _answers(argv: list[str]) -> tuple[bool, str]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                             check=False)
    except subprocess.TimeoutExpired:
        return False, f"no answer within {PROBE_TIMEOUT_S} s"
    except OSError as exc:
        return False, str(exc)
    if out.returncode == 0:
        return True, ""
    # `docker info` prints its client half on stdout and the daemon error last on stderr.
    lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
    lines = lines or [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return False, (lines[-1] if lines else f"exit code {out.returncode}")[:300]


# --- the runner --------------------------------------------------------------------------------

class DockerRunner:
    """Runs a prepared job as one container per host (see the module docstring)."""

    name = "docker"
    backend = "local"  # the job record's Backend: local mode, whichever runner
    network_interface_name = "eth0"  # each container's interface on the job's network

    def __init__(self, engine: Engine | None = None):
        self._engine = engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = find_engine()
        return self._engine

    def submit_directory(self, spec: LocalJobSpec) -> str:
        return SUBMIT_DIRECTORY

    def check(self, spec: LocalJobSpec) -> None:
        engine = self.engine
        compose_file(spec, engine.name)  # the job must be expressible (GPU lists, mount paths)
        if engine.name == "podman" and len(spec.hosts) > 1:
            problem = _podman_dns_problem(engine)
            if problem:
                raise RunnerError(problem)
        image = spec.image or DEFAULT_IMAGE
        ok, detail = _answers([*engine.cli, "image", "inspect", image])
        if not ok:
            raise RunnerError(
                f"image {image!r} is not present in {engine.name} ({detail}); local mode pulls "
                "nothing. Build it from the repository root, from local material (no registry):\n"
                f"  make image IMAGE={image}\n"
                "or on a PyTorch image you have (an AWS Deep Learning Container, ...):\n"
                f"  make image IMAGE={image} BASE_IMAGE=<image>"
            )

    def setup(self, spec: LocalJobSpec, log, should_stop) -> None:
        """Nothing: each container's bootstrap installs requirements.txt into the image's Python, as the
        toolkit does on SageMaker."""
        return None

    # each host is an `attach` process, which passes the signal on to its container
    signal_hosts = staticmethod(signal_process_groups)
    host_lost = staticmethod(refuse_gone_host)

    def start(self, spec: LocalJobSpec) -> list[HostProcess]:
        engine = self.engine
        # Every bind source must exist: Docker would create a missing one, owned by root.
        for directory in (model_dir(spec), spec.checkpoint_dir,
                          *(spec.host_dir(h) / "output" for h in spec.hosts)):
            directory.mkdir(parents=True, exist_ok=True)
        path = write_compose_file(spec, engine.name)
        create = [*self._compose(spec, path), "up", "--no-start", "--force-recreate"]
        try:
            out = subprocess.run(create, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=CREATE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise RunnerError(f"{' '.join(create)} took over {CREATE_TIMEOUT_S} s") from None
        if out.returncode != 0:
            raise RunnerError(
                f"creating the containers failed ({' '.join(create)}, exit code "
                f"{out.returncode}):\n{out.stdout.strip()[-2000:]}"
            )
        # The master first: the others resolve `algo-1` once its container runs.
        return [
            HostProcess(host, subprocess.Popen(
                [*engine.cli, "start", "--attach", container_name(spec, host)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,
            ))
            for host in spec.hosts
        ]

    def hosts_ended(self, spec: LocalJobSpec) -> None:
        """Nothing runs beside the containers (each one's bootstrap keeps its own agent template)."""

    def cleanup(self, spec: LocalJobSpec) -> None:
        try:
            engine = self.engine
        except RunnerError as exc:  # the engine went away during the job: nothing to take down
            log.warning("cannot take the containers of %s down: %s", spec.name, exc)
            return
        path = spec.job_dir / COMPOSE_FILE
        if path.is_file():
            down = [*self._compose(spec, path), "down", "--timeout", "10"]
            if engine.name == "docker":
                down.append("--remove-orphans")  # podman-compose's `down` refuses the flag
            _quiet(down, DOWN_TIMEOUT_S)
            # podman-compose leaves the network behind; for Docker it is gone already.
            _quiet([*engine.cli, "network", "rm", project_name(spec)], DOWN_TIMEOUT_S)
        self._give_back_files(spec)

    def _compose(self, spec: LocalJobSpec, path: Path) -> list[str]:
        return [*self.engine.compose, "-f", str(path), "-p", project_name(spec)]

    def _give_back_files(self, spec: LocalJobSpec) -> None:
        """A rootful engine leaves root-owned files; chown them (from a container) to the user."""
        if not hasattr(os, "getuid"):
            return
        uid, gid = os.getuid(), os.getgid()
        roots = [spec.job_dir]
        if not _inside(spec.checkpoint_dir, spec.job_dir):
            roots.append(spec.checkpoint_dir)
        roots = [r for r in roots if r.exists() and _foreign_owner(r, uid)]
        if not roots:
            return
        mounts = [a for i, r in enumerate(roots) for a in ("-v", f"{os.path.abspath(r)}:/job{i}")]
        cmd = [
            *self.engine.cli, "run", "--rm", "--network", "none",
            *ULIMIT_FLAGS,
            *mounts, spec.image or DEFAULT_IMAGE,
            "chown", "-R", f"{uid}:{gid}", *(f"/job{i}" for i in range(len(roots))),
        ]
        ok, detail = _run_quiet(cmd, CHOWN_TIMEOUT_S)
        if not ok:
            log.warning(
                "files under %s belong to another user (the container's root) and could not be "
                "handed back (%s: %s); remove them with sudo",
                ", ".join(map(str, roots)), " ".join(cmd), detail,
            )


def _inside(path: Path, root: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
        return True
    except ValueError:
        return False


def _foreign_owner(root: Path, uid: int) -> bool:
    """Whether anything under root (root included, links not followed) belongs to another uid."""
    if root.lstat().st_uid != uid:
        return True
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            try:
                if os.lstat(os.path.join(directory, name)).st_uid != uid:
                    return True
            except FileNotFoundError:
                continue
    return False


def _run_quiet(argv: list[str], timeout: float) -> tuple[bool, str]:
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return out.returncode == 0, out.stdout.strip()[-500:]


def _quiet(argv: list[str], timeout: float) -> None:
    ok, detail = _run_quiet(argv, timeout)
    if not ok:
        log.debug("%s failed: %s", " ".join(argv), detail)
