"""The Slurm runner: inside the job's allocation, one `srun` step per node runs that node's bootstrap.

The supervisor (launcher.local.supervise, started by the batch script on the first node) calls
`start`, as it does for local jobs; each step is one task on one node (`--relative`), whose
`python -m container train` reads the node's /opt/ml tree in the shared job directory. The
rendezvous is the first node of the allocation, at the address Slurm gives for it (NodeAddr),
not an assumed name. srun passes the supervisor's SIGTERM on to the task, so a stop reaches the
ranks and they checkpoint.

A job whose code has a requirements.txt gets a Python environment of its own in the job's
directory (`env/`, on the file system every node sees), built once by the supervisor before any
step starts (launcher.local.jobenv); every node's bootstrap runs with its interpreter. With
`container_image` the bootstraps install it inside their containers, as on SageMaker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable

from launcher.backends.base import BackendError
from launcher.local import jobenv
from launcher.local.process import ProcessRunner
from launcher.local.spec import HostProcess, LocalJobSpec, RunnerError, refuse_gone_host, signal_process_groups
from launcher.slurm import commands
from launcher.wire.opt_ml import free_port, master_host

# NCCL's own choice when NCCL_SOCKET_IFNAME is unset: any interface but loopback and docker's.
DEFAULT_INTERFACE = "^lo,docker"


class SlurmRunner(ProcessRunner):
    name = "slurm"
    backend = "slurm"

    def __init__(self, settings: dict | None = None):
        self.settings = settings or {}
        self.network_interface_name = self.settings.get("network_interface") or DEFAULT_INTERFACE
        self.placement: dict[str, str] = {}  # host -> the node its step runs on
        self.lost_nodes: set[str] = set()  # nodes a host's processes were lost on: no host goes back there

    def check(self, spec: LocalJobSpec) -> None:
        python = self.settings.get("python") or sys.executable
        if self.settings.get("container_image"):
            return  # the image brings its own Python and smlaunch
        if python == sys.executable:
            super().check(spec)  # the nodes run this very Python
        elif not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise RunnerError(f"slurm.python {python!r} is not an executable file here; give the path of a "
                              "Python with smlaunch[train] that every node has")

    def setup(self, spec: LocalJobSpec, log: Callable[[str], None], should_stop: Callable[[], bool]) -> dict | None:
        """The job's own environment in its directory (none with container_image: the image's Python)."""
        if self.settings.get("container_image"):
            return None
        self.job_env = jobenv.job_environment(spec, python=self.settings.get("python") or sys.executable, log=log,
                                              should_stop=should_stop, place=lambda _key: spec.job_dir / "env")
        return self.job_env.record() if self.job_env else None

    def python(self) -> str:
        return str(self.job_env.python) if self.job_env else (self.settings.get("python") or sys.executable)

    def _place(self, spec: LocalJobSpec) -> dict[str, str]:
        """host -> node: the allocation's first nodes in Slurm's order; the others (slurm.spare_nodes)
        wait for a lost host (`host_lost`)."""
        if not self.placement:
            nodelist = os.environ.get("SLURM_JOB_NODELIST")
            if not nodelist:
                raise RunnerError("SLURM_JOB_NODELIST is not set: the Slurm runner runs inside a Slurm allocation "
                                  "(the job's batch script)")
            nodes = commands.hostnames(nodelist)
            if len(nodes) < len(spec.hosts):
                raise RunnerError(f"the allocation holds {len(nodes)} node(s) ({', '.join(nodes)}) for "
                                  f"{len(spec.hosts)} hosts (instance_count)")
            self.placement = dict(zip(spec.hosts, nodes))
        return self.placement

    def host_lost(self, spec: LocalJobSpec, label: str) -> str:
        """Where `label` runs once its processes were lost (its step's task killed): on a spare node
        of the allocation, one no host runs on and none was lost on; else on its own node, while the
        allocation still holds it. What is done, for the log; RunnerError where neither is left (the
        supervisor goes on with the nodes left where min_instance_count allows: docs/slurm.md, "Restarts")."""
        refuse_gone_host(spec, label)  # a test's host-gone fault injection: as a node gone for good
        node = self._place(spec)[label]
        self.lost_nodes.add(node)
        job_id = os.environ.get("SLURM_JOB_ID", "")
        held = commands.job_nodes(job_id) if job_id else list(self.placement.values())
        spares = [n for n in held if n not in self.placement.values() and n not in self.lost_nodes]
        if spares:
            self.placement[label] = spares[0]
            return f"{label} moves from node {node} to spare node {spares[0]}"
        if node in held:
            return f"no spare node is left (slurm.spare_nodes): {label} runs on node {node} again"
        gone = f"node {node} of {label} has left the allocation and no spare node is left (slurm.spare_nodes)"
        if spec.min_instance_count:  # the supervisor says whether the job goes on with the nodes left
            raise RunnerError(gone)
        raise RunnerError(f"{gone}: the job is not shrunk to fewer nodes (min_instance_count); submit it again "
                          "with spare nodes, or with a smaller instance_count, which resumes exactly from its "
                          "newest checkpoint at the new world size (docs/spot.md)")

    def exit_code(self, spec: LocalJobSpec, label: str, code: int) -> int:
        """`label`'s exit code as the supervisor should read it. srun of a step whose node failed
        may exit 0 after "Node failure on n2" although its task never finished: a step that ended
        0 without its bootstrap's success report, on a node the allocation no longer holds, ended
        as if killed (128 + SIGKILL), so the supervisor takes its host as lost."""
        node, job_id = self.placement.get(label), os.environ.get("SLURM_JOB_ID")
        if code != 0 or not node or not job_id or (spec.host_dir(label) / "output" / "success").exists():
            return code
        try:
            held = commands.job_nodes(job_id)
        except BackendError:
            return code  # slurmctld does not answer: the host's own report decides, as without Slurm
        return code if node in held else 128 + signal.SIGKILL

    def srun_command(self, spec: LocalJobSpec, host: str) -> list[str]:
        s = self.settings
        # --overlap: a node runs one step of the job at a time, and a restart's step must not wait
        # for the CPUs of the step it replaces, which Slurm may keep counted after the job lost a
        # node ("Requested nodes are busy", measured with Slurm 22.05 on the test cluster).
        command = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={self._place(spec)[host]}", "--overlap",
                   "--unbuffered", "--kill-on-bad-exit=1", f"--job-name={spec.name}-{host}",
                   f"--chdir={spec.host_dir(host)}"]
        cpus = os.environ.get("SLURM_CPUS_ON_NODE")
        if cpus:  # the whole node for torchrun and its ranks, not the step's default of one CPU
            command.append(f"--cpus-per-task={cpus}")
        if s.get("gpus_per_node"):
            command.append(f"--gpus-per-node={s['gpus_per_node']}")
        if s.get("container_image"):
            mounts = [str(spec.job_dir), str(spec.checkpoint_dir), *s.get("container_mounts", [])]
            command += [f"--container-image={s['container_image']}",
                        "--container-mounts=" + ",".join(dict.fromkeys(f"{m}:{m}" if ":" not in m else m
                                                                      for m in mounts)),
                        "--container-workdir=" + str(spec.host_dir(host)), "python"]
        else:
            command.append(self.python())
        return command + ["-m", "container", "train"]

    def environment(self, spec: LocalJobSpec, host: str, port: int) -> dict[str, str]:
        env = super().environment(spec, host, port)
        env["SMLAUNCH_MASTER_ADDR"] = self._master_addr
        return env

    def signal_hosts(self, hosts: list[HostProcess], signum: int) -> None:
        """SIGTERM through Slurm to the steps' tasks (the bootstraps), which pass it on to the
        ranks: srun itself would answer a SIGTERM by killing its tasks at once. SIGKILL ends srun."""
        job_id = os.environ.get("SLURM_JOB_ID")
        if signum == signal.SIGTERM and job_id:
            try:
                commands.run(["scancel", "--signal=TERM", job_id])  # neither --batch nor --full: the steps only
                return
            except BackendError as exc:
                print(f"smlaunch: {exc}; signalling srun instead", file=sys.stderr)
        signal_process_groups(hosts, signum)

    def start(self, spec: LocalJobSpec) -> list[HostProcess]:
        if shutil.which("srun") is None:
            raise RunnerError("srun is not on PATH on the job's first node")
        # The rendezvous listens on rank 0's host's node (the first host left after a shrink). The port is
        # free on this node, the allocation's first, which that host runs on unless it moved (host_lost).
        self._master_addr = commands.node_address(self._place(spec)[master_host(spec.hosts)])
        port = free_port()
        started = []
        for host in spec.hosts:
            proc = subprocess.Popen(self.srun_command(spec, host), env=self.environment(spec, host, port),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            started.append(HostProcess(host, proc))
        return started
