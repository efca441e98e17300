"""A hung rank ends the job within its step timeout, with every rank's stacks and the rank that hung
named (container/resilience/step_watch.py, docs/faults.md "Hangs"); the bootstrap's collector asks
live ranks for their stacks (container/toolkit/diagnostics.py).

The job runs as a user runs it: `smlaunch submit --local`, one host x 2 processes, a copy of smlaunch's
train.py that logs its secret HF_TOKEN, rank 1 hanging before step 3 (launcher.wire.faults' test-only
injection). What the ranks logged reaches their stacks files masked, as it reaches the job's log."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from container.toolkit.diagnostics import collect_stacks, summarize
from launcher.wire import diagnostics, masking
from launcher.wire.faults import EXIT_HUNG, FAULT_ENV, Fault, fault_spec
from launcher.wire.opt_ml import free_port
from tests.support.local_jobs import cli_env, processes_in, smlaunch, wait_for
from tests.support.masking_cases import secrets_in_files
from tests.support.train_runs import ROOT

COLLECTIVE_TIMEOUT_S = 120  # the hang must end the job long before a collective would time out
TOKEN = "hf_hangTokenValue73"
NCCL_KEY = "ncclPluginKey4096x"  # a secret-named NCCL setting: masked in the rank files too
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": 64, "max_steps": 5,
      "train_batch_size": 2, "checkpoint_freq": 2, "logging_freq": 1, "step_timeout": 5,
      "collective_timeout": COLLECTIVE_TIMEOUT_S}


def logs_its_token(tmp_path: Path) -> Path:
    """A copy of smlaunch's train.py that prints the job's HF_TOKEN to stderr first, as a script may."""
    text = (ROOT / "entrypoints" / "train.py").read_text()
    main = 'if __name__ == "__main__":\n'
    assert main in text
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(text.replace(
        main, main + '    print("token", os.environ["HF_TOKEN"], file=sys.stderr, flush=True)\n'))
    return tmp_path / "src"


def submit(tmp_path: Path, home: Path, environment: dict,
           source_dir: Path = ROOT / "entrypoints") -> tuple[subprocess.CompletedProcess, str, float]:
    job = {"entry_point": "train.py", "source_dir": str(source_dir), "instance_type": "local",
           "instance_count": 1, "processes_per_host": 2, "distribution": {"torch_distributed": {"enabled": True}},
           "base_job_name": "hang", "hyperparameters": HP, "environment": environment}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    started = time.monotonic()
    proc = smlaunch("submit", str(tmp_path / "job.yaml"), "--local", env=cli_env(home), timeout=600)
    elapsed = time.monotonic() - started
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    return proc, name, elapsed


def test_a_hung_rank_ends_the_job_with_every_ranks_stacks(tmp_path, home):
    traces = tmp_path / "fr"
    proc, name, elapsed = submit(tmp_path, home, {FAULT_ENV: fault_spec(Fault("hang", rank=1, step=3)),
                                                  "TORCH_FR_DUMP_TEMP_FILE": str(traces / "nccl_trace_rank_"),
                                                  "HF_TOKEN": TOKEN, "NCCL_DEBUG": "WARN",
                                                  "NCCL_PLUGIN_API_KEY": NCCL_KEY}, logs_its_token(tmp_path))
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 1, output
    assert "token ****" in proc.stdout + proc.stderr and TOKEN not in proc.stdout + proc.stderr  # logged, masked
    assert elapsed < COLLECTIVE_TIMEOUT_S, f"{elapsed:.0f} s:\n{output}"
    described = json.loads(smlaunch("status", name, "--json", env=cli_env(home)).stdout)
    assert ("rank 1 (host algo-1, local rank 1) hung: step 3 did not complete within 5 s (step_timeout 5 s, set by "
            "the job)") in described["FailureReason"]
    assert f"its step watchdog ended it (exit code {EXIT_HUNG})" in described["FailureReason"]
    assert processes_in(home / "jobs" / name) == []

    found = diagnostics.attempt_dirs(home / "jobs" / name / "hosts" / "algo-1" / "output" / "data")
    assert [d.name for d in found] == ["attempt-0"]
    hung, waiting = (diagnostics.read_rank_file(found[0] / f"rank-{r}.txt") for r in (1, 0))
    assert hung.fields["reason"].startswith("step 3 did not complete within 5 s (step_timeout 5 s, set by the job)")
    assert (hung.main[0].function, Path(hung.main[0].path).name) == ("at_step", "inject.py")  # the injection's sleep
    assert waiting.waiting and "torch/distributed/" in waiting.main[0].path
    # the Flight Recorder's trace of each rank, where the job asked for it
    entries = pickle.loads((traces / "nccl_trace_rank_1").read_bytes())["entries"]
    assert entries and all("profiling_name" in e for e in entries)
    # the hung rank's file and the summary name NCCL (none on CPU), its settings masked, and the dump
    # (the toolkit's environment adds its own: NCCL_SOCKET_IFNAME=lo, NCCL_PROTO=simple)
    for fields in (hung.fields, waiting.fields):
        assert fields["nccl settings"].startswith("NCCL_DEBUG=WARN, NCCL_PLUGIN_API_KEY=****, ")
        assert "NCCL_SOCKET_IFNAME=lo" in fields["nccl settings"]
    assert hung.fields["nccl"] == "none in this process (no CUDA device: gloo)"
    assert hung.fields["flight recorder"] == str(traces / "nccl_trace_rank_1")
    summary = (found[0] / "summary.txt").read_text()
    assert "  nccl settings: NCCL_DEBUG=WARN, NCCL_PLUGIN_API_KEY=****, " in summary
    assert f"  flight recorder: {traces / 'nccl_trace_rank_1'}\n" in summary

    shown = smlaunch("logs", name, "--diagnostics", env=cli_env(home))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1].startswith(
        "diagnosis: rank(s) 1 did not reach the collective that rank(s) 0 waited in: rank 1 (host algo-1) in at_step")
    # no file the job wrote holds the token: the stacks files with their stderr tails, the archives
    assert TOKEN not in shown.stdout and secrets_in_files(home / "jobs" / name, [TOKEN, NCCL_KEY]) == {}

    # control: the same job without the fault completes and leaves no diagnostics
    control = tmp_path / "control"
    control.mkdir()
    proc, name, _ = submit(control, home, {})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert diagnostics.attempt_dirs(home / "jobs" / name / "hosts" / "algo-1" / "output" / "data") == []
    shown = smlaunch("logs", name, "--diagnostics", env=cli_env(home))
    assert shown.returncode == 0 and f"job {name} has no diagnostics" in shown.stdout


# Rank 0 runs smlaunch's SIGUSR1 handler and waits in `waiting_here`; rank 1 has no handler (a user's
# own script): it must not be signalled, since SIGUSR1's default action would end it.
RANKS = """
import os, sys, time
from pathlib import Path

rank = int(os.environ["RANK"])
print(f"rank {rank} started with", os.environ["HF_TOKEN"], file=sys.stderr, flush=True)
if rank == 0:
    from container.resilience.step_watch import stacks_on_signal
    stacks_on_signal()


def waiting_here():
    Path(sys.argv[1], f"ready-{rank}").write_text(str(os.getpid()))
    time.sleep(600)


waiting_here()
"""


def test_the_bootstrap_collects_the_stacks_of_live_ranks(tmp_path):
    (tmp_path / "ranks.py").write_text(RANKS)
    log_dir, diag_dir = tmp_path / "logs", tmp_path / "diagnostics" / "attempt-0"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_TOKEN": TOKEN}
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), "--log-dir", str(log_dir), "--redirects", "3",
         str(tmp_path / "ranks.py"), str(tmp_path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    messages: list[str] = []
    installed = masking.installed()
    masking.install(masking.Masker.of({"HF_TOKEN": TOKEN}))  # as the bootstrap installs the job's
    try:
        wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, timeout=120)
        written = collect_stacks(torchrun.pid, log_dir, diag_dir, messages.append, host="algo-1")
        assert sorted(p.name for p in written) == ["rank-0.txt", "rank-1.txt"]
        asked = diagnostics.read_rank_file(diag_dir / "rank-0.txt")
        assert asked.fields["stacks"] == "SIGUSR1" and asked.main[0].function == "waiting_here"
        text = (diag_dir / "rank-0.txt").read_text()
        assert "--- py-spy: not found on PATH" in text  # not installed here: said, never silently skipped
        assert "rank 0 started with ****" in text.split("lines of its stderr")[1]  # the log's tail, masked
        unasked = (diag_dir / "rank-1.txt").read_text()
        assert "(not asked: it does not catch SIGUSR1" in unasked and "rank 1 started with ****" in unasked
        assert secrets_in_files(diag_dir, [TOKEN]) == {}
        pid = int((tmp_path / "ready-1").read_text())
        assert Path(f"/proc/{pid}").exists() and torchrun.poll() is None  # nobody was killed by the question
        assert summarize(diag_dir, messages.append).startswith("no rank waited in a collective: rank 0 (host algo-1) "
                                                               "in waiting_here")
        assert (diag_dir / "summary.txt").is_file() and messages[-1].startswith("hang diagnosis: ")
    finally:
        masking.install(installed)
        torchrun.send_signal(signal.SIGTERM)
        try:
            torchrun.wait(timeout=60)
        except subprocess.TimeoutExpired:
            torchrun.kill()
