"""A real two-node Slurm cluster on 127.0.0.1 for the tests (Debian 12's slurm-wlm 22.05, munge).

`SlurmCluster(root)` starts munged, slurmctld and two slurmd (`-N n1`, `-N n2`, each on its own
port; `nodes=` names others) from a generated slurm.conf, all in the private directory `root`, and stops everything it
started: jobs, daemons, step daemons and job tasks. `slurm_cluster` is the session fixture; it
skips, saying why and with the daemons' log tails, where the cluster cannot start here.

Client commands find the cluster through `cluster.env` (SLURM_CONF; munge's socket is named in
slurm.conf's AuthInfo). Each node has 2 CPUs and the partition is OverSubscribe=FORCE:4: a job
runs up to 2 tasks on each of the 2 nodes (sbatch refuses more at once, EnforcePartLimits=ALL,
even with --overcommit) and up to 4 jobs share the nodes at the same time.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Container, Iterator
from pathlib import Path

import pytest

PARTITION = "debug"
NODES = ("n1", "n2")
CPUS_PER_NODE = 2
KILL_WAIT = 5  # seconds between a cancelled job's SIGTERM and SIGKILL: keeps cancel tests fast
START_TIMEOUT = 60
STOP_TIMEOUT = 20
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo",
            "squeue", "scancel")
# States after which a job does nothing more (COMPLETING is not one: its processes still run).
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
MAX_ROOT = 70  # a step daemon's socket, root/n1/n1_<job>.<step>, must fit AF_UNIX's 107 bytes
PR_SET_PDEATHSIG = 1


class ClusterUnavailable(RuntimeError):
    """The daemons cannot start on this machine; the message says why."""


class SlurmCluster:
    """munged + slurmctld + slurmd n1/n2 on 127.0.0.1, everything under `root`."""

    def __init__(self, root: Path, nodes: tuple[str, ...] = NODES):
        self.root = Path(root).resolve()
        if len(str(self.root)) > MAX_ROOT:
            raise ValueError(f"SlurmCluster root {self.root} is longer than {MAX_ROOT} characters: "
                             "Slurm's unix sockets under it would not fit; use a shorter directory")
        self.conf = self.root / "slurm.conf"
        self.shared_dir = self.root / "shared"
        self.partition = PARTITION
        self.nodes = nodes
        self.logs = self.root / "log"
        self.env = {"SLURM_CONF": str(self.conf), "PATH": os.environ.get("PATH", "")}
        self._daemons: dict[str, subprocess.Popen] = {}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start every daemon and wait until both nodes are idle; ClusterUnavailable if not."""
        check_can_run()
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            ports = _free_ports(1 + len(self.nodes))
            self.conf.write_text(slurm_conf(self.root, ports, socket.gethostname().split(".")[0], self.nodes))
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for node in self.nodes:
                (self.root / node).mkdir(exist_ok=True)
                self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-f", str(self.conf), "-N", node])
            self._wait_nodes_idle()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL), and kill what they left."""
        try:
            if self._daemons.get("slurmctld") and self._daemons["slurmctld"].poll() is None:
                self._cancel_all_jobs()
        finally:
            for name in reversed(list(self._daemons)):
                _terminate(self._daemons[name])
            self._daemons.clear()
            self._kill_leftovers()

    def run(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; a failure shows its stderr."""
        result = subprocess.run(args, env={**os.environ, **self.env}, capture_output=True,
                                text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def sbatch(self, script: Path, *options: str, env: dict[str, str] | None = None) -> str:
        """Submit `script` with sbatch `options` (extra `env` exported to the job); the job id."""
        result = subprocess.run(["sbatch", "--parsable", *options, str(script)],
                                env={**os.environ, **self.env, **(env or {})},
                                capture_output=True, text=True, timeout=30, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch {script} exited {result.returncode}: {result.stderr}")
        return result.stdout.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        """The job's state as squeue reports it (also after it ended: --states=all)."""
        return self.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()

    def wait_ended(self, job_id: str, timeout: float = 30) -> str:
        """Wait (bounded) until the job has ended; its final state."""
        return self.wait_state(job_id, ENDED, timeout)

    def wait_state(self, job_id: str, states: Container[str], timeout: float = 30) -> str:
        """Wait (bounded) until the job is in one of `states`; that state."""
        deadline = time.monotonic() + timeout
        while (state := self.state(job_id)) not in states:
            if time.monotonic() > deadline:
                job = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
                raise TimeoutError(f"job {job_id} still {state or '?'} after {timeout} s, "
                                   f"not in {sorted(states)}: {job}")
            time.sleep(0.2)
        return state

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for a reason why the cluster misbehaved."""
        return "\n".join(
            f"--- {path.name}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            for path in sorted(self.logs.glob("*")) if path.is_file())

    def _start_munge(self) -> None:
        key_dir = self.root / "munge"
        for directory in (key_dir, self.logs, self.shared_dir, self.root / "state"):
            directory.mkdir(parents=True, exist_ok=True)
        # munged refuses a key, pid or socket directory that others may write to, and warns when
        # its socket's directory cannot be searched by everyone.
        for directory in (self.root, key_dir):
            directory.chmod(0o755)
        key = key_dir / "munge.key"
        made = subprocess.run(["mungekey", "--create", f"--keyfile={key}"], timeout=30,
                              capture_output=True, text=True, check=False)
        if made.returncode != 0:
            raise ClusterUnavailable(f"mungekey could not create {key}: {made.stderr.strip()}")
        sock = key_dir / "munge.sock"
        # --force: munged refuses to run as root without it. In the foreground it logs to stderr.
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={sock}",
                               f"--key-file={key}", f"--pid-file={key_dir / 'munged.pid'}",
                               f"--seed-file={key_dir / 'munged.seed'}"])
        self._wait(sock.exists, 10, "munged did not create its socket")

    def _spawn(self, name: str, argv: list[str]) -> None:
        # The daemons run in root (so their step daemons do too, and _kill_leftovers finds them)
        # and die with this process should it be killed before stop(). preexec_fn is safe here:
        # pytest starts no thread of its own (pytest-timeout's default method is a signal).
        with open(self.logs / f"{name}.out", "ab") as log:
            self._daemons[name] = subprocess.Popen(
                argv, cwd=self.root, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)  # noqa: PLW1509

    def _wait_nodes_idle(self) -> None:
        def idle() -> bool:
            try:
                out = self.run("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t", timeout=5,
                               check=False)
            except subprocess.TimeoutExpired:
                return False  # slurmctld not answering yet
            states = dict(line.split() for line in out.stdout.splitlines())
            return out.returncode == 0 and states == {node: "idle" for node in self.nodes}

        self._wait(idle, START_TIMEOUT, f"nodes {', '.join(self.nodes)} did not become idle")

    def _wait(self, ready, timeout: float, failure: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, daemon in self._daemons.items():
                if daemon.poll() is not None:
                    raise ClusterUnavailable(f"{name} exited with {daemon.returncode} while "
                                             f"starting.\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"{failure} within {timeout} s (sinfo: {self._sinfo()})."
                                         f"\n{self.log_tails()}")
            time.sleep(0.2)

    def _sinfo(self) -> str:
        if not self.conf.exists():
            return "no slurm.conf yet"
        try:
            result = self.run("sinfo", "-N", "-l", timeout=5, check=False)
        except subprocess.TimeoutExpired:
            return "no answer within 5 s"
        return (result.stdout + result.stderr).strip()

    def _cancel_all_jobs(self) -> None:
        jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if not jobs:
            return
        self.run("scancel", *jobs, check=False)
        deadline = time.monotonic() + KILL_WAIT + STOP_TIMEOUT
        while self.run("squeue", "-h", "-o", "%i", check=False).stdout.split():
            if time.monotonic() > deadline:
                break  # the daemons' SIGTERM and _kill_leftovers end what is left
            time.sleep(0.2)

    def _kill_leftovers(self) -> None:
        """Step daemons and tasks outlive a stopped slurmd; none may outlive the cluster."""
        deadline = time.monotonic() + 5
        while (left := _processes_of(self.root)) and time.monotonic() < deadline:
            time.sleep(0.2)  # processes just signalled may still be exiting
        for pid in left:
            _signal(pid, signal.SIGKILL)
        if left:
            raise RuntimeError(f"processes of the Slurm cluster in {self.root} outlived its "
                               f"daemons and were killed: {left}")


def slurm_conf(root: Path, ports: list[int], hostname: str, nodes: tuple[str, ...] = NODES) -> str:
    """slurm.conf for controller and nodes on 127.0.0.1; `ports`: slurmctld's, then each node's."""
    lines = [
        "ClusterName=smlaunch",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.sock'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        # %n: slurmd's -N node name, so each node has its own spool, pid file and log.
        f"SlurmdSpoolDir={root / '%n'}",
        f"SlurmdPidFile={root / '%n' / 'slurmd.pid'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",  # the step daemons log here too
        "ProctrackType=proctrack/linuxproc",  # no cgroups in a container
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "SchedulerParameters=batch_sched_delay=0",  # start a batch job at once, not within 3 s
        "EnforcePartLimits=ALL",  # sbatch refuses a job that can never run, instead of queueing it
        "MpiDefault=none",
        "ReturnToService=2",
        "MinJobAge=3600",  # ended jobs stay visible to scontrol and squeue for an hour
        f"KillWait={KILL_WAIT}",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        # Nodes register with the CPUs written here whatever this machine has.
        "SlurmdParameters=config_overrides",
    ]
    lines += [f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={hostname} Port={port} "
              f"CPUs={CPUS_PER_NODE} State=UNKNOWN" for node, port in zip(nodes, ports[1:])]
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES "
                 "MaxTime=INFINITE State=UP OverSubscribe=FORCE:4")
    return "\n".join(lines) + "\n"


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A test's own directory short enough for a cluster's root (MAX_ROOT): pytest's tmp_path
    under xdist (.../popen-gw0/test_<name>0/) is too long for Slurm's sockets beneath it."""
    root = Path(tempfile.mkdtemp(prefix="slurm-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def running_cluster(directory: Path, **options) -> Iterator[SlurmCluster]:
    """A started cluster for a fixture to yield, stopped after; the test skips where it cannot start."""
    cluster = SlurmCluster(directory, **options)
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        pytest.skip(f"no local Slurm cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    """The session's Slurm cluster; the test skips where it cannot start here."""
    yield from running_cluster(tmp_path_factory.mktemp("slurm"))


def check_can_run() -> None:
    """ClusterUnavailable, saying why, where the daemons cannot run here."""
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        raise ClusterUnavailable(f"{', '.join(missing)} not found on PATH; "
                                 "scripts/install-slurm.sh installs slurm-wlm and munge (as root)")
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"slurmd launches jobs as their user and must run as root; "
                                 f"these tests run as uid {os.geteuid()}")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> None:
    # Fires when the thread that started the daemon ends: the fixture's, pytest's main thread.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _terminate(daemon: subprocess.Popen) -> None:
    if daemon.poll() is None:
        daemon.terminate()
        try:
            daemon.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(STOP_TIMEOUT)


def _processes_of(root: Path) -> list[int]:
    """Live processes running in `root` (the daemons and their step daemons: slurmd clears a step
    daemon's environment, but it keeps slurmd's directory) and all their descendants (job tasks)."""
    parents, found = {}, set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue  # gone, or a zombie
        parents[int(entry.name)] = int(ppid)
        if state != "Z" and (cwd == str(root) or cwd.startswith(f"{root}/")):
            found.add(int(entry.name))
    while children := {pid for pid, ppid in parents.items() if ppid in found} - found:
        found |= children
    found.discard(os.getpid())
    return sorted(found)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
