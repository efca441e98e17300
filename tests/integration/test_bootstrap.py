"""container.toolkit.bootstrap end to end: `python -m container train` on trees written by
launcher.wire.opt_ml, with torchrun on CPU (gloo, 127.0.0.1), simulated hosts sharing this machine.
Here the tests that start processes; the rest are tests/unit/test_bootstrap.py."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.wire.opt_ml import FAILURE_LIMIT, free_port, scratch_dir
from tests.support.bootstrap import REPO, bootstrap_env, distributed, host_tree, run, start, tarball

ALL_REDUCE = """
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
out = {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]), "sum": t.item(),
       "host": os.environ["SM_CURRENT_HOST"], "args": sys.argv[1:], "hp_lr": os.environ["SM_HP_LR"]}
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank{out['rank']}.json"), "w") as f:
    json.dump(out, f)
dist.barrier()  # gloo aborts a peer still in a collective when the group is torn down
dist.destroy_process_group()
"""

BOOM_ON_RANK_1 = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
def nested():
    raise ValueError("boom")
if dist.get_rank() == 1:
    nested()
time.sleep(30)  # rank 0 must be stopped by torchrun, not finish on its own
"""

# Each rank prints a metric line, then waits until the test has seen both on the console: output
# that reached the console only at the end would leave it waiting, and it then exits with code 7.
METRIC_THEN_BOOM = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"loss=1.0 rank={rank}")
print(f"stderr of rank {rank}", file=sys.stderr)
go, deadline = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "go"), time.monotonic() + 30
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit(7)
    time.sleep(0.05)
if rank == 1:
    raise ValueError("boom after the metric")
time.sleep(30)  # rank 0 must be stopped by torchrun
"""

WAIT_FOR_SIGTERM = """
import os, signal, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
out = os.environ["SM_OUTPUT_DATA_DIR"]
def on_term(signum, frame):
    with open(f"{out}/term{rank}", "w") as f:
        f.write(str(signum))
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, on_term)
with open(f"{out}/pid{rank}.tmp", "w") as f:
    f.write(f"{os.getpid()} {os.getppid()}")
os.rename(f"{out}/pid{rank}.tmp", f"{out}/pid{rank}")
time.sleep(120)
"""


def source_dir(tmp_path: Path, program: str, text: str, name: str = "src") -> Path:
    src = tmp_path / name
    src.mkdir(parents=True, exist_ok=True)
    (src / program).write_text(textwrap.dedent(text))
    return src


def failure(base: Path) -> str:
    return (base / "output" / "failure").read_text()


def test_two_hosts_two_processes_each(tmp_path: Path):
    src = source_dir(tmp_path, "train.py", ALL_REDUCE)
    hosts = ["algo-1", "algo-2"]
    hps = distributed("train.py", src, lr=0.1, sagemaker_job_name="job-1")
    bases = [host_tree(tmp_path, h, hosts, hps) for h in hosts]
    port = str(free_port())
    procs = [start(b, SMLAUNCH_MASTER_ADDR="127.0.0.1", SMLAUNCH_MASTER_PORT=port) for b in bases]
    outputs = [p.communicate(timeout=90)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for host_index, base in enumerate(bases):
        assert (base / "output" / "success").exists()
        assert not (base / "output" / "failure").exists()
        for local_rank in range(2):
            rank = 2 * host_index + local_rank
            result = json.loads((base / "output" / "data" / f"rank{rank}.json").read_text())
            assert result == {"rank": rank, "world": 4, "sum": 6.0, "host": hosts[host_index],
                              "args": ["--lr", "0.1"], "hp_lr": "0.1"}
    # the bootstrap logs the command it runs
    assert "--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1" in outputs[0]
    assert "--node_rank 1" in outputs[1]


def test_failing_rank_is_reported(tmp_path: Path):
    src = source_dir(tmp_path, "train.py", BOOM_ON_RANK_1)
    base = host_tree(tmp_path, "algo-1", ["algo-1"], distributed("train.py", src))
    code, out = run(base)
    assert code == 1, out
    text = failure(base)
    assert len(text) <= FAILURE_LIMIT
    lines = text.splitlines()
    assert lines[:3] == ["ExecuteUserScriptError:", "ExitCode 1",
                         'ErrorMessage "rank 1 (host algo-1, local rank 1) exited with code 1']
    assert lines[3] == "ValueError: boom"
    assert 'raise ValueError("boom")' in text and "in nested" in text
    assert "[rank1]" not in text  # torch's line prefix is stripped
    assert not (base / "output" / "success").exists()
    assert "ValueError: boom" in out  # the traceback also reached the console
    assert "[default" not in out  # without torchrun's --tee prefixes


def test_rank_output_is_live_and_unprefixed_and_a_failing_rank_keeps_its_traceback(tmp_path: Path):
    """MetricDefinitions regexes anchored with ^ must match what a rank prints (torchrun's --tee
    would prefix `[default0]:`), while it runs; the failure file still has the rank's traceback."""
    src = source_dir(tmp_path, "train.py", METRIC_THEN_BOOM)
    base = host_tree(tmp_path, "algo-1", ["algo-1"], distributed("train.py", src))
    proc = start(base, PYTHONUNBUFFERED="1")  # as the image and the local runner set it
    try:
        seen: list[str] = []
        for line in proc.stdout:
            seen.append(line)
            if sum(bool(re.match(r"^loss=1\.0 rank=\d$", ln)) for ln in seen) == 2:
                (base / "output" / "data" / "go").touch()
                break
        out = "".join(seen) + proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert sorted(re.findall(r"^loss=.*$", out, re.MULTILINE)) == ["loss=1.0 rank=0", "loss=1.0 rank=1"], out
    assert re.search(r"^stderr of rank 1$", out, re.MULTILINE) and "[default" not in out, out
    assert proc.returncode == 1, out
    lines = failure(base).splitlines()
    assert lines[2:4] == ['ErrorMessage "rank 1 (host algo-1, local rank 1) exited with code 1',
                          "ValueError: boom after the metric"], lines
    assert 'raise ValueError("boom after the metric")' in failure(base)


def test_single_process_exit_code_passes_through(tmp_path: Path):
    src = source_dir(tmp_path, "train.py", """
        import sys
        print("about to give up", file=sys.stderr)
        sys.exit(3)
    """)
    base = host_tree(tmp_path, "algo-1", ["algo-1"],
                     {"sagemaker_program": "train.py", "sagemaker_submit_directory": str(src)})
    code, out = run(base)
    assert code == 3, out
    assert failure(base).splitlines()[:5] == [
        "ExecuteUserScriptError:", "ExitCode 3", 'ErrorMessage "train.py exited with code 3', "last lines of stderr:",
        'about to give up"']


@pytest.mark.parametrize("code", [0, 3])
def test_an_attempt_leaves_no_temporary_directory_behind(tmp_path: Path, code: int):
    """The attempt's fault directory (SMLAUNCH_FAULT_DIR, in the host's scratch) is the script's while
    it runs and is gone once the job has ended, whether it succeeded or failed; nothing goes to TMPDIR
    (the test's directory here), where a host killed by SIGKILL would leave it."""
    src = source_dir(tmp_path, "train.py", f"""
        import os, sys
        assert os.path.isdir(os.environ["SMLAUNCH_FAULT_DIR"])
        print("fault dir", os.environ["SMLAUNCH_FAULT_DIR"])
        sys.exit({code})
    """)
    base = host_tree(tmp_path, "algo-1", ["algo-1"],
                     {"sagemaker_program": "train.py", "sagemaker_submit_directory": str(src)})
    returned, out = run(base)
    assert returned == code, out
    used = Path(re.search(r"fault dir (\S+)", out).group(1))
    assert used.is_relative_to(scratch_dir(base)) and not used.exists(), out
    assert not scratch_dir(base).exists() and list(base.parent.glob("smlaunch-*")) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_bootstrap_stops_every_rank(tmp_path: Path, signum: int):
    """SIGTERM is forwarded; on SIGKILL the bootstrap cannot act, and torchrun's parent-death
    signal (SIGTERM) stops the ranks instead."""
    src = source_dir(tmp_path, "train.py", WAIT_FOR_SIGTERM)
    base = host_tree(tmp_path, "algo-1", ["algo-1"], distributed("train.py", src))
    data = base / "output" / "data"
    proc = start(base)
    try:
        deadline = time.monotonic() + 45
        while not all((data / f"pid{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.2)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=40)
    finally:
        proc.kill()
    pids = [int(p) for r in range(2) for p in (data / f"pid{r}").read_text().split()]
    deadline = time.monotonic() + 20  # after SIGKILL torchrun stops the ranks on its own
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], out  # ranks and torchrun are gone
    for rank in range(2):
        assert (data / f"term{rank}").read_text() == str(int(signal.SIGTERM))
    if signum == signal.SIGTERM:  # a stop, not a failure: the exit code says which signal, no failure file
        assert proc.returncode == 128 + signal.SIGTERM, out
        assert "[smlaunch] stopped (exit code 143): received SIGTERM and forwarded it to every rank" in out
        assert "failed" not in out and not (base / "output" / "failure").exists()
        assert not scratch_dir(base).exists()
    else:  # what a killed bootstrap cannot remove stays in the host's tree, private, never in TMPDIR
        assert stat.S_IMODE(scratch_dir(base).stat().st_mode) == 0o700
    assert list(base.parent.glob("smlaunch-*")) == []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_code_from_a_local_tarball(tmp_path: Path):
    base = host_tree(tmp_path, "algo-1", ["algo-1"], {
        "sagemaker_program": "train.py", "sagemaker_submit_directory": str(tarball(tmp_path))})
    code, out = run(base)
    assert code == 0, out
    assert (base / "model" / "ok.txt").read_text() == f"from-tarball {base / 'code'}"
    assert (base / "output" / "success").exists()


def test_code_from_s3(tmp_path: Path, monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}
        for key, value in creds.items():
            monkeypatch.setenv(key, value)
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="jobs")
        s3.upload_file(str(tarball(tmp_path)), "jobs", "job-1/source/sourcedir.tar.gz")
        base = host_tree(tmp_path, "algo-1", ["algo-1"], {
            "sagemaker_program": "train.py",
            "sagemaker_submit_directory": "s3://jobs/job-1/source/sourcedir.tar.gz"})
        code, out = run(base, AWS_ENDPOINT_URL=endpoint, **creds)
    finally:
        server.stop()
    assert code == 0, out
    assert (base / "model" / "ok.txt").read_text().startswith("from-tarball ")


def test_missing_program_is_a_clear_failure(tmp_path: Path):
    src = source_dir(tmp_path, "main.py", "print('hi')\n")
    base = host_tree(tmp_path, "algo-1", ["algo-1"], distributed("train.py", src))
    code, _ = run(base)
    assert code == 2
    text = failure(base)
    assert "sagemaker_program 'train.py' not found" in text and "main.py" in text


def test_mpi_is_refused(tmp_path: Path):
    src = source_dir(tmp_path, "train.py", "print('hi')\n")
    base = host_tree(tmp_path, "algo-1", ["algo-1"], {
        "sagemaker_program": "train.py", "sagemaker_submit_directory": str(src),
        "sagemaker_mpi_enabled": True})
    code, _ = run(base)
    assert code == 2 and "torch_distributed" in failure(base) and "MPI" in failure(base)


def test_usage(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "container"], cwd=REPO, capture_output=True,
                          text=True, env=bootstrap_env(tmp_path), check=False)
    assert proc.returncode == 2 and "python -m container train" in proc.stderr


# --- units: the command and the environment, no processes ---------------------------------


def _wheel(directory: Path, name: str, source: str) -> Path:
    """A minimal pure-Python wheel of one module (what `pip wheel` would build)."""
    import zipfile

    path = directory / f"{name}-0.1-py3-none-any.whl"
    info = f"{name}-0.1.dist-info"
    files = {f"{name}.py": source, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as zf:
        for file, text in files.items():
            zf.writestr(file, text)
    return path


def test_requirements_txt_is_installed_before_the_script_runs(tmp_path: Path):
    """As the toolkit does: pip install -r requirements.txt in the code directory, then launch."""
    src = source_dir(tmp_path, "train.py", """
        import smlaunch_probe_dep
        print("dependency says", smlaunch_probe_dep.VALUE)
    """)
    wheel = _wheel(src, "smlaunch_probe_dep", "VALUE = 42\n")
    (src / "requirements.txt").write_text(f"./{wheel.name}\n")
    site = tmp_path / "site"  # pip's target here, so the test leaves this environment as it was
    base = host_tree(tmp_path, "algo-1", ["algo-1"], {"sagemaker_program": "train.py",
                                                      "sagemaker_submit_directory": str(src)})
    code, out = run(base, timeout=120, PIP_TARGET=str(site), PYTHONPATH=f"{REPO}{os.pathsep}{site}")
    assert code == 0, out
    assert "installing the code's requirements.txt" in out and "dependency says 42" in out


def test_requirements_that_fail_to_install_fail_the_job_as_the_toolkit_reports_it(tmp_path: Path):
    src = source_dir(tmp_path, "train.py", "print('never runs')\n")
    (src / "requirements.txt").write_text("./no-such-package-dir\n")
    base = host_tree(tmp_path, "algo-1", ["algo-1"], {"sagemaker_program": "train.py",
                                                      "sagemaker_submit_directory": str(src)})
    code, out = run(base, timeout=120)
    assert code != 0 and "never runs" not in out
    text = failure(base)
    assert text.startswith(f"InstallRequirementsError:\nExitCode {code}\nErrorMessage \"pip could not install")
    assert "no-such-package-dir" in text and len(text) <= FAILURE_LIMIT
