"""Write the `/opt/ml` tree as SageMaker writes it before it starts a training container.

The local runners and the tests use this to give `container.toolkit.bootstrap` exactly what it finds on
AWS (docs/sagemaker-contract.md, "The /opt/ml tree"):
`input/config/{hyperparameters,resourceconfig,inputdataconfig}.json`, the channels under
`input/data/<channel>/`, and the empty `model/`, `output/data/`, `checkpoints/` and `code/`
directories. Pure stdlib: no torch, no boto3.

`hyperparameters.json` holds the job's secrets in clear, as on SageMaker (a token the script
needs), so `input/config/` is 0700 and its files 0600 (`write_private`), from their creation.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import stat
import tempfile
from pathlib import Path

from launcher.wire.datafiles import not_data
from launcher.wire.faults import MAX_RESTARTS

# SageMaker's name for the single instance group of a job that declares no instance groups.
HOMOGENEOUS_GROUP = "homogeneousCluster"

FAILURE_LIMIT = 1024  # SageMaker's FailureReason shows this many characters of output/failure
# Set by smlaunch's process and Slurm runners to the sha256 of the code's requirements.txt once they
# have installed it into the job's environment (launcher.local.jobenv): the bootstrap does not run
# pip again for a requirements.txt of that digest.
REQUIREMENTS_INSTALLED_ENV = "SMLAUNCH_REQUIREMENTS_INSTALLED"
# A job's TensorBoardOutputConfig, as the container finds it in input/config (SageMaker Debugger's
# DEFAULT_SAGEMAKER_TENSORBOARD_PATH), and the API's default LocalPath.
TENSORBOARD_CONFIG = "tensorboardoutputconfig.json"
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
# The bootstrap's scratch in a host's tree: each attempt's raw rank output (torchrun's --log-dir,
# which holds what the script printed, secrets in clear) and the ranks' failure records. It lies
# outside everything that is uploaded or packed (output/data, model, checkpoints), is private
# (0700), and goes when the attempt ends, when the host's next bootstrap starts, and, on local and
# Slurm jobs, when the supervisor has seen every host end: so a host killed by SIGKILL, which runs
# no cleanup, leaves nothing behind either (docs/secrets.md).
SCRATCH_DIR = "smlaunch-scratch"


def scratch_dir(base_dir: Path) -> Path:
    return Path(base_dir) / SCRATCH_DIR


def host_name(index: int) -> str:
    """The host of `index` (from 0) as SageMaker names it: algo-1 for 0."""
    return f"algo-{index + 1}"


def host_names(count: int) -> list[str]:
    """A job's hosts as SageMaker names them: algo-1 ... algo-N."""
    return [host_name(i) for i in range(count)]


def master_host(hosts: list[str]) -> str:
    """Rank 0's host: the first of resourceconfig.json's `hosts`, which write_opt_ml sorts as SageMaker does,
    as strings (the bootstrap's master, container.toolkit.contract). Once a job has gone on without algo-1
    (launcher.local.shrink), that is the first host left in that order: algo-10 before algo-2."""
    return sorted(hosts)[0]


def failure_headline(reason: str) -> str:
    """The first line of a failure report or FailureReason (`AlgorithmError: algo-2:
    ExecuteUserScriptError`), for a line that points at the whole report instead of repeating it."""
    return reason.strip().splitlines()[0].rstrip(":") if reason.strip() else ""


def process_ended(returncode: int) -> str:
    """How a process ended, from its return code as Popen gives it (-N: killed by signal N)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a real-time signal has no name
        return f"was killed by signal {-returncode}"

# Channel files up to this size are copied into `input/data/<channel>/`, bigger ones are
# symlinked. Copies keep the tree self-contained (it can be mounted into a container, or the
# source edited, without surprises); links keep a multi-GB data set from being duplicated per
# simulated host. A docker runner must mount the link targets as well.
COPY_LIMIT_BYTES = 16 * 1024 * 1024


def write_opt_ml(
    base_dir: Path,
    *,
    hyperparameters: dict[str, str],
    current_host: str,
    hosts: list[str],
    instance_type: str,
    channels: dict[str, Path],
    input_mode: str = "File",
    network_interface_name: str = "eth0",
    distributions: dict[str, str] | None = None,
    tensorboard: dict[str, str] | None = None,
) -> None:
    """Write the tree SageMaker gives one host of a training job under `base_dir`.

    `hyperparameters` are wire values, already JSON-encoded as the SDK sends them
    (`launcher.wire.hyperparameters.encode`). `channels` maps a channel name to a file or a directory whose
    files become the channel's content (see COPY_LIMIT_BYTES for copy versus symlink);
    `distributions` gives a channel's S3DistributionType (default FullyReplicated).
    `tensorboard` is the request's TensorBoardOutputConfig; SageMaker hands it to the container
    as tensorboardoutputconfig.json (container.tensorboard reads it).
    """
    not_strings = sorted(k for k, v in hyperparameters.items() if not isinstance(v, str))
    if not_strings:
        raise TypeError(f"hyperparameter values must be JSON-encoded strings: {not_strings}")
    if current_host not in hosts:
        raise ValueError(f"current_host {current_host!r} is not one of hosts {hosts}")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"hosts must be distinct: {hosts}")

    base_dir = Path(base_dir)
    config_dir = base_dir / "input" / "config"
    for sub in (base_dir / "input", base_dir / "model", base_dir / "output" / "data",
                base_dir / "checkpoints", base_dir / "code"):
        sub.mkdir(parents=True, exist_ok=True)
    private_dir(config_dir)

    sorted_hosts = sorted(hosts)
    resource_config = {
        "current_host": current_host,
        "current_instance_type": instance_type,
        "current_group_name": HOMOGENEOUS_GROUP,
        "hosts": sorted_hosts,
        "instance_groups": [
            {
                "instance_group_name": HOMOGENEOUS_GROUP,
                "instance_type": instance_type,
                "hosts": sorted_hosts,
            }
        ],
        "network_interface_name": network_interface_name,
    }
    input_data_config = {
        name: {
            "TrainingInputMode": input_mode,
            "S3DistributionType": (distributions or {}).get(name, "FullyReplicated"),
            "RecordWrapperType": "None",
        }
        for name in sorted(channels)
    }
    _write_json(config_dir / "hyperparameters.json", dict(hyperparameters))
    _write_json(config_dir / "resourceconfig.json", resource_config)
    _write_json(config_dir / "inputdataconfig.json", input_data_config)
    if tensorboard is not None:
        _write_json(config_dir / TENSORBOARD_CONFIG, dict(tensorboard))

    for name, source in channels.items():
        _fill_channel(base_dir / "input" / "data" / name, Path(source))


def rewrite_hosts(base_dir: Path, hosts: list[str]) -> None:
    """The host's resourceconfig.json with `hosts` (sorted as write_opt_ml sorts them), all else as it was:
    a job that goes on with fewer hosts (launcher.local.shrink)."""
    path = Path(base_dir) / "input" / "config" / "resourceconfig.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["hosts"] = sorted(hosts)
    for group in config.get("instance_groups", []):
        group["hosts"] = sorted(hosts)
    _write_json(path, config)


def _write_json(path: Path, obj: object) -> None:
    write_private(path, json.dumps(obj, indent=2) + "\n")


def private_dir(path: Path) -> None:
    """`path` as a directory only its owner can open (0700), created so if it is missing."""
    path.mkdir(mode=0o700, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != 0o700:  # there already, e.g. a tree written again
        path.chmod(0o700)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` as a file only its owner can read: 0600 from its creation (mkstemp),
    so no other user can open it in between, and atomically (readers see the old or new file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fill_channel(dest: Path, source: Path) -> None:
    if not source.exists():
        raise FileNotFoundError(f"channel source {source} does not exist")
    if problem := not_data(source):  # validation refused it; the disk may have changed since
        raise ValueError(f"channel source {problem}: a channel holds regular files and directories only")
    dest.mkdir(parents=True, exist_ok=True)
    if source.is_file():
        _place(source, dest / source.name)
        return
    for root, _dirs, files in os.walk(source):
        for name in files:
            src = Path(root) / name
            _place(src, dest / src.relative_to(source))


def _place(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    if src.stat().st_size <= COPY_LIMIT_BYTES:
        shutil.copy2(src, dst)
    else:
        dst.symlink_to(src.resolve())


# Rendezvous ports are drawn below the kernel's ephemeral range (ip_local_port_range): a port in
# it can be taken, between the check here and the rendezvous's listen seconds later (its agent's
# start), as the source port of any connection on the machine, a rendezvous client's own included
# (a connect to a local port nobody listens on yet can connect to itself). A job's restart attempts
# meet at the port + their number (up to faults.MAX_RESTARTS), so a drawn port leaves room.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_RENDEZVOUS_PORT = 10_000
_ATTEMPT_ROOM = MAX_RESTARTS + 1
_DRAWS = 64


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a rendezvous of processes on this machine: below the
    ephemeral range where the kernel says what it is, else one the kernel picks."""
    low = ephemeral_low()
    if low is not None and low - _ATTEMPT_ROOM > LOWEST_RENDEZVOUS_PORT:
        draw = random.SystemRandom()
        for _ in range(_DRAWS):
            port = draw.randrange(LOWEST_RENDEZVOUS_PORT, low - _ATTEMPT_ROOM)
            if _bindable(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range; None where it is not readable (not Linux)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
