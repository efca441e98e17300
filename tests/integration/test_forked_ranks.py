"""Ranks forked from a preloaded agent (container.distributed.forked_ranks, docs/container.md):
the same losses as ranks torchrun starts as programs; the agent never forks with CUDA touched;
and how the bootstrap reads a forked rank's environment (launcher.wire.forked_ranks: torch elastic
sets its variables inside the process, where /proc/<pid>/environ does not show them)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container.distributed import zygote
from container.toolkit.agent_template import Template
from launcher.local.process import wait_listening
from launcher.wire.forked_ranks import RANKS_DIR_ENV, process_environ
from launcher.wire.opt_ml import free_port
from tests.support.bootstrap import distributed, host_tree, run
from tests.support.train_runs import TINY, TRAIN

REPO = Path(__file__).resolve().parents[2]

def test_forked_ranks_train_exactly_as_ranks_torchrun_starts_as_programs(tmp_path: Path):
    """smlaunch's train.py through the bootstrap, forked from the agent, against the same script as
    a user's (its container.trainer import spelled so the rule does not see it), which runs under
    plain torchrun: every step's loss and gradient norm bit for bit (the same threads, the same
    arithmetic; ~25 CPU s for two one-host, two-rank jobs of 3 steps)."""
    text = TRAIN.read_text()
    spelled = text.replace("    from container.trainer import train\n",
                           "    train = __import__('importlib').import_module('container.trainer').train\n")
    assert spelled != text
    records = {}
    for kind, script in (("forked", text), ("program", spelled)):
        src = tmp_path / kind / "src"
        src.mkdir(parents=True)
        (src / "train.py").write_text(script)
        hps = TINY | {"max_steps": 3}
        base = host_tree(tmp_path / kind, "algo-1", ["algo-1"], distributed("train.py", src, **hps))
        code, output = run(base, timeout=240)
        assert code == 0, output
        launcher = "container.distributed.forked_ranks" if kind == "forked" else "torch.distributed.run"
        assert f"-m {launcher} " in output  # control: the other kind ran the other way
        lines = (base / "output" / "data" / "metrics.jsonl").read_text().splitlines()
        records[kind] = [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, lines) if "loss" in r]
    assert len(records["forked"]) == 3 and records["forked"] == records["program"]


AGENT = """
import os, sys, time
from pathlib import Path
from launcher.wire.forked_ranks import RANKS_DIR_ENV, write_rank
if os.fork() == 0:
    os.environ.update(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", RANKS_OWN_SECRET="set-in-the-rank")
    if sys.argv[1] == "recorded":
        write_rank(Path(os.environ[RANKS_DIR_ENV]), os.getpid(), os.environ)
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


@pytest.fixture
def forked_rank(tmp_path: Path):
    started: list[subprocess.Popen] = []

    def start(mode: str) -> int:
        env = {**os.environ, "PYTHONPATH": str(REPO), RANKS_DIR_ENV: str(tmp_path / mode),
               "AGENTS_MARK": "from the agent", "AWS_SECRET_ACCESS_KEY": "never-in-a-file-" * 3}
        agent = subprocess.Popen([sys.executable, "-c", AGENT, mode], env=env, stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
        started.append(agent)
        return int(agent.stdout.readline())

    yield start
    for agent in started:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()


def test_a_forked_ranks_environment_is_its_agents_plus_the_variables_it_recorded(forked_rank, tmp_path):
    environ = process_environ(forked_rank("recorded"))
    assert (environ["RANK"], environ["LOCAL_RANK"], environ["WORLD_SIZE"]) == ("3", "1", "4")
    assert environ["AGENTS_MARK"] == "from the agent"  # NCCL_* and the Flight Recorder's variables come so
    written = next((tmp_path / "recorded").iterdir()).read_text()
    assert "RANK=3\0" in written
    # torch elastic's variables and the attempt's only
    assert "never-in-a-file" not in written and "RANKS_OWN_SECRET" not in written


def test_control_a_forked_process_that_recorded_nothing_is_no_rank(forked_rank):
    environ = process_environ(forked_rank("silent"))
    assert environ["AGENTS_MARK"] == "from the agent" and "RANK" not in environ


def test_a_process_gone_has_no_environment():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_environ(proc.pid) == {}


def test_each_attempts_agent_is_forked_from_the_hosts_one_template(tmp_path: Path):
    """container.toolkit.agent_template.Template, the bootstrap's side of container.distributed.zygote: agents
    one after the other, each forked from one template that imported the runtime once, each the
    template's child in a session of its own (a signal to its group ends it, its exit code as
    subprocess reports one), with its own environment and output; the template outlives a SIGTERM
    (a stop's: the agent's exit code is still to be handed over); the agent code is
    container.distributed.forked_ranks' (~4 CPU s: one import of the runtime)."""
    template = Template()
    agent = [sys.executable, *Template.AGENT]
    env = {**os.environ, "PYTHONPATH": str(REPO), RANKS_DIR_ENV: str(tmp_path / "forked")}
    waiting = [*agent, "--start-method", "fork", "--run-path", "--nnodes", "2", "--nproc_per_node", "1",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--node_rank", "0", str(TRAIN)]
    try:
        first = template.start(waiting, tmp_path, env)  # node 0 of 2: it waits for a node that never comes
        pid = template.pid
        assert _parent_of(first.pid) == pid != os.getpid() and os.getsid(first.pid) == first.pid
        os.kill(pid, signal.SIGTERM)  # as Slurm's scancel signals every process of a step: the template stays
        os.killpg(first.pid, signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
        second = template.start([*agent, "--help"], tmp_path, env)
        assert b"usage:" in second.stdout.read() and second.wait() == 0
        # the request's environment, not the template's (which had the ranks' directory): main refuses it
        third = template.start([*agent, "--start-method", "fork", "--run-path", "--master_port", "1", str(TRAIN)],
                               tmp_path, {k: v for k, v in env.items() if k != RANKS_DIR_ENV})
        assert f"{RANKS_DIR_ENV} is not set".encode() in third.stderr.read() and third.wait() == 1
        assert len({first.pid, second.pid, third.pid}) == 3 and template.pid == pid  # one template throughout
    finally:
        template.close()
    assert not Path(f"/proc/{pid}").exists()  # closed: the template has exited


def test_a_local_jobs_hosts_fork_their_agents_from_the_jobs_one_template(tmp_path: Path):
    """The process runner's template for a job's hosts (`zygote --listen`, launcher.local.process): one
    process imports the runtime, a handler forked from it for each host's bootstrap, each host's agent
    forked from its handler with the host's own PYTHONPATH on sys.path; a host whose bootstrap is gone
    (its socket closed) has its agent ended (SIGTERM) while the other's goes on being served; a process
    of another user is not served (~4 CPU s: one import of the runtime for both hosts)."""
    name = f"smlaunch-test-{os.getpid()}"
    server = subprocess.Popen([sys.executable, "-u", "-m", "container.distributed.zygote", "--listen", name],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    hosts = {h: Template(name) for h in ("algo-1", "algo-2")}
    agent = [sys.executable, *Template.AGENT]
    try:
        wait_listening(server, name)
        agents = {}
        for host, template in hosts.items():
            work, code = tmp_path / host, tmp_path / host / "code"
            code.mkdir(parents=True)
            (work / "show.py").write_text("import json, sys\nprint(json.dumps(sys.path))\n")
            env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{REPO}", RANKS_DIR_ENV: str(work / "forked")}
            shown = template.start([*agent, "--start-method", "fork", "--run-path", "--nnodes", "1",
                                    "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port",
                                    str(free_port()), "--log-dir", str(work / "logs"), "--redirects", "1",
                                    str(work / "show.py")], work, env)
            assert shown.wait() == 0, shown.stderr.read()
            paths = json.loads(next((work / "logs").rglob("stdout.log")).read_text().splitlines()[-1])
            other = str(code).replace(host, "algo-2" if host == "algo-1" else "algo-1")
            assert str(code) in paths and other not in paths, paths  # its own code directory, not the first host's
            waiting = [*agent, "--start-method", "fork", "--run-path", "--nnodes", "2", "--nproc_per_node", "1",
                       "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--node_rank", "0",
                       "--log-dir", str(work / "logs-waiting"), str(TRAIN)]  # without it: a /tmp dir torch keeps
            agents[host] = template.start(waiting, work, env)  # node 0 of 2: it waits for a node that never comes
        handlers = {host: _parent_of(a.pid) for host, a in agents.items()}
        assert len(set(handlers.values())) == 2 and {_parent_of(h) for h in handlers.values()} == {server.pid}
        hosts["algo-2"].close()  # its bootstrap gone: its handler leaves, and the agent gets SIGTERM
        _wait_gone(agents["algo-2"].pid)
        os.killpg(agents["algo-1"].pid, signal.SIGKILL)  # the other host's goes on being served
        assert agents["algo-1"].wait() == -signal.SIGKILL
        assert hosts["algo-1"].start([*agent, "--help"], tmp_path, dict(os.environ)).wait() == 0
        a, b = socket.socketpair()
        with a, b:  # SO_PEERCRED: this user's process is served, another user's is not (the control)
            assert zygote.same_user(a) and not zygote.same_user(a, os.getuid() + 1)
    finally:
        for template in hosts.values():
            template.close()
        server.kill()
        server.wait()


def _wait_gone(pid: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return  # ended, not yet collected by whoever reaps it now
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text(), f"{pid} still runs"


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


PRELOAD = """
import sys, torch
def probe(*args, **kwargs):
    raise AssertionError("the agent touched CUDA before forking")
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_name"):
    setattr(torch.cuda, name, probe)
if sys.argv[1] == "control":
    import torch.cuda
    torch.cuda.is_available()
from container.distributed import forked_ranks  # the agent's preload: torch, DTensor, dynamo, the runtime
try:  # a rank entered other than through torch elastic's worker wrapper fails at once, saying so
    forked_ranks.forked_rank("train.py")
except RuntimeError as exc:
    print(exc, file=sys.stderr)
torch.cuda.is_initialized = lambda: True  # as if it had: the agent refuses to fork
forked_ranks.main(["--start-method", "fork", "--run-path", "--master_port", "29999", "train.py"])
"""


@pytest.mark.parametrize("mode", ["preload", "control"])
def test_the_agent_forks_only_with_cuda_untouched(mode):
    """A rank forked after its parent initialized CUDA cannot use the GPU: the agent's preload calls
    none of torch.cuda's probes, and the agent refuses to fork once CUDA is initialized (~5 CPU s).
    And a rank not started by torch elastic's wrapper, whose queue it hands its result to, fails clearly."""
    proc = subprocess.run([sys.executable, "-c", PRELOAD, mode], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    if mode == "control":  # the probes are caught, so a preload that touched one would fail
        assert "the agent touched CUDA before forking" in proc.stderr
    else:
        assert "AssertionError" not in proc.stderr, proc.stderr
        assert "CUDA was initialized before the ranks were forked" in proc.stderr
        assert "_wrap, which starts a forked rank, is not as this agent knows it" in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_a_forked_rank_trains_on_the_gpu(tmp_path: Path):
    """On a GPU the ranks are forked from an agent that imported torch: each initializes CUDA
    itself (a rank per GPU; bench/gpu's `tests` part runs this). The CUDA allocator's snapshot of
    step 2 shows the rank computed on the GPU (without CUDA none is written)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(TRAIN.read_text())
    hps = TINY | {"max_steps": 3, "memory_snapshot_steps": "2"}
    base = host_tree(tmp_path, "algo-1", ["algo-1"], distributed("train.py", src, **hps))
    code, output = run(base, timeout=300)
    assert code == 0 and "-m container.distributed.forked_ranks " in output, output
    assert sorted(p.name for p in (base / "output" / "data" / "memory").iterdir())[0] == "rank-0-steps-2-2.pickle"
