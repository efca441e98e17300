"""container.toolkit.bootstrap end to end: `python -m container train` on trees written by
launcher.wire.opt_ml, with torchrun on CPU (gloo, 127.0.0.1), simulated hosts sharing this machine.
Here the tests that run in one process; those that start processes are tests/integration/test_bootstrap.py."""

from __future__ import annotations

import io
import os
import re
import tarfile
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from container.toolkit import bootstrap
from container.toolkit.bootstrap import child_environment, launch_command, master_address
from container.toolkit.code import _extract, fetch_code
from container.toolkit.contract import ContractError, read_training_env
from container.toolkit.failure_report import TEARDOWN_ABORT, failure_text, known_cause, rank_ended, toolkit_error
from container.toolkit.restarts import Failure
from launcher.wire.faults import EXIT_HUNG, HUNG_EXCEPTION, RankFailure, Restart, append_restart
from launcher.wire.opt_ml import FAILURE_LIMIT
from launcher.wire.restart_policy import RestartPolicy
from tests.support.bootstrap import host_tree, tarball


def hostile_archive(tmp_path: Path, member: tarfile.TarInfo) -> Path:
    archive = tmp_path / "hostile.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(tarfile.TarInfo("ok.py"), io.BytesIO())
        tar.addfile(member, io.BytesIO())
    return archive


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


# Debian 12's Python 3.11.2 (the image scripts/build-image.sh makes) has no tar filters: the
# bootstrap refuses the same members by hand there.
@pytest.mark.parametrize("python", ["with data_filter", "without data_filter"])
@pytest.mark.parametrize("bad", [
    member("../escape.py"), member("/../escape.py"), member("sub/../../escape.py"),
    member("link", tarfile.SYMTYPE, "../../etc/passwd"), member("link", tarfile.SYMTYPE, "/etc/passwd"),
    member("hard", tarfile.LNKTYPE, "../outside"), member("dev", tarfile.CHRTYPE),
], ids=["dotdot", "absolute-dotdot", "nested-dotdot", "symlink-out", "symlink-absolute", "hardlink-out", "device"])
def test_a_code_archive_writing_outside_the_code_directory_is_refused(tmp_path, monkeypatch, python, bad):
    if python == "without data_filter":
        monkeypatch.delattr(tarfile, "data_filter")
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(ContractError, match=rf"member '/?{re.escape(bad.name.lstrip('/'))}' would be written outside"):
        _extract(hostile_archive(tmp_path, bad), dest)
    assert not (tmp_path / "escape.py").exists()


@pytest.mark.parametrize("python", ["with data_filter", "without data_filter"])
def test_links_inside_the_code_directory_are_extracted(tmp_path, monkeypatch, python):
    if python == "without data_filter":
        monkeypatch.delattr(tarfile, "data_filter")
    archive = tmp_path / "code.tar"
    with tarfile.open(archive, "w") as tar:
        text = b"VALUE = 1\n"
        info = tarfile.TarInfo("pkg/mod.py")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
        tar.addfile(member("pkg/alias.py", tarfile.SYMTYPE, "mod.py"))
        tar.addfile(member("copy.py", tarfile.LNKTYPE, "pkg/mod.py"))
        tar.addfile(member("/absolute.py"))  # lands inside, as the data filter puts it
    dest = tmp_path / "code"
    dest.mkdir()
    _extract(archive, dest)
    assert (dest / "pkg" / "alias.py").read_bytes() == (dest / "copy.py").read_bytes() == b"VALUE = 1\n"
    assert (dest / "absolute.py").is_file()


def test_code_already_in_place_is_kept_as_the_toolkit_keeps_it(tmp_path: Path):
    """files.download_and_extract fetches nothing into a code directory that holds files (code
    baked into the image, SageMaker local mode's mount); a file:// URI is read by neither."""
    base = host_tree(tmp_path, "algo-1", ["algo-1"], {
        "sagemaker_program": "train.py", "sagemaker_submit_directory": str(tarball(tmp_path))})
    (base / "code" / "train.py").write_text("baked = True\n")
    fetch_code(read_training_env(base, num_gpus=0))
    assert sorted(p.name for p in (base / "code").iterdir()) == ["train.py"]
    assert (base / "code" / "train.py").read_text() == "baked = True\n"

    uri = host_tree(tmp_path / "uri", "algo-1", ["algo-1"], {
        "sagemaker_program": "train.py", "sagemaker_submit_directory": f"file://{tarball(tmp_path)}"})
    with pytest.raises(ContractError, match="neither an s3:// URI nor an existing local path"):
        fetch_code(read_training_env(uri, num_gpus=0))


# --- units: the command and the environment, no processes ---------------------------------

def test_torchrun_command_on_a_multi_gpu_efa_host(tmp_path: Path, monkeypatch):
    for name in ("SMLAUNCH_MASTER_ADDR", "SMLAUNCH_MASTER_PORT", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA",
                 "RDMAV_FORK_SAFE", "NCCL_PROTO", "NCCL_SOCKET_IFNAME", "SAGEMAKER_PROGRAM"):
        monkeypatch.delenv(name, raising=False)
    hosts = ["algo-1", "algo-2", "algo-3"]
    hps = {"sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True,
           "sagemaker_smlaunch_processes_per_host": 3, "lr": 0.1}
    base = host_tree(tmp_path, "algo-2", hosts, hps, instance_type="ml.p4d.24xlarge")
    (base / "code" / "train.py").write_text("")
    env = read_training_env(base, num_gpus=8)
    cmd = launch_command(env, tmp_path / "logs")
    assert cmd[1:] == [
        "-m", "torch.distributed.run", "--nnodes", "3", "--nproc_per_node", "8",
        "--master_addr", "algo-1", "--master_port", "7777", "--node_rank", "1",
        "--log-dir", str(tmp_path / "logs"), "--redirects", "3", "--shutdown-timeout", "100",
        "train.py", "--lr", "0.1"]
    child = child_environment(env)
    assert (child["FI_PROVIDER"], child["FI_EFA_USE_DEVICE_RDMA"], child["RDMAV_FORK_SAFE"],
            child["NCCL_SOCKET_IFNAME"], child["NCCL_PROTO"]) == ("efa", "1", "1", "eth0", "simple")
    assert child["PYTHONPATH"].split(os.pathsep)[0] == str(base / "code")
    assert child["SM_HP_LR"] == "0.1" and child["CURRENT_HOST"] == "algo-2"

    monkeypatch.setenv("SMLAUNCH_MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("SMLAUNCH_MASTER_PORT", "29999")
    assert master_address(env) == ("127.0.0.1", 29999)


def test_smlaunchs_runtime_runs_under_torchruns_agent_that_forks_its_ranks(tmp_path: Path, monkeypatch):
    """An entry point importing container.trainer: torchrun's own options after the preloading agent
    (container.distributed.forked_ranks), which imports the shipped runtime (_smlaunch/ first on the
    path); control: a user's script of the same name runs under plain torchrun, the path untouched."""
    for name in ("SAGEMAKER_PROGRAM", "SMLAUNCH_MASTER_ADDR", "SMLAUNCH_MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    hps = {"sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True, "lr": 0.1}
    runtime = host_tree(tmp_path / "runtime", "algo-1", ["algo-1", "algo-2"], hps)
    (runtime / "code" / "train.py").write_text("import os\n\nfrom container.trainer import train\n")
    (runtime / "code" / "_smlaunch").mkdir()
    user = host_tree(tmp_path / "user", "algo-1", ["algo-1", "algo-2"], hps)
    (user / "code" / "train.py").write_text("# a loop of my own, no container.trainer\nimport torch\n")
    forked, plain = (launch_command(read_training_env(base), tmp_path / "logs") for base in (runtime, user))
    assert forked[1:7] == ["-u", "-m", "container.distributed.forked_ranks", "--start-method", "fork", "--run-path"]
    assert plain[1:3] == ["-m", "torch.distributed.run"]
    assert forked[7:] == plain[3:] and plain[-3:] == ["train.py", "--lr", "0.1"]  # the same torchrun options
    paths = [child_environment(read_training_env(base))["PYTHONPATH"].split(os.pathsep)[:2] for base in (runtime, user)]
    assert paths == [[str(runtime / "code" / "_smlaunch"), str(runtime / "code")], [str(user / "code"), paths[1][1]]]
    assert str(user / "code" / "_smlaunch") not in paths[1]


def test_torchrun_settings_override_the_jobs_and_a_plain_script_gets_none(tmp_path: Path, monkeypatch):
    """As the toolkit: NCCL_PROTO and NCCL_SOCKET_IFNAME for every torchrun job, over the job's own
    values; FI_PROVIDER only on its EFA list (g5.48xlarge: EFA without RDMA); nothing without torchrun."""
    monkeypatch.setenv("NCCL_PROTO", "LL128")  # the job's own environment
    for name in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "RDMAV_FORK_SAFE", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    hps = {"sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True}
    torchrun = child_environment(read_training_env(
        host_tree(tmp_path / "a", "algo-1", ["algo-1"], hps, instance_type="ml.g5.48xlarge"), num_gpus=8))
    assert (torchrun["NCCL_PROTO"], torchrun["NCCL_SOCKET_IFNAME"], torchrun["FI_PROVIDER"]) == (
        "simple", "eth0", "efa")
    assert "FI_EFA_USE_DEVICE_RDMA" not in torchrun and "RDMAV_FORK_SAFE" not in torchrun
    plain = child_environment(read_training_env(
        host_tree(tmp_path / "b", "algo-1", ["algo-1"], {"sagemaker_program": "train.py"},
                  instance_type="ml.p4d.24xlarge"), num_gpus=8))
    assert plain["NCCL_PROTO"] == "LL128"
    assert not {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "RDMAV_FORK_SAFE", "NCCL_SOCKET_IFNAME"} & set(plain)


def test_failure_text_keeps_the_exception_and_the_last_frames():
    frames = "".join(
        f'[rank3]:   File "/opt/ml/code/model/layer_{i}.py", line {i}, in forward_{i}\n'
        f"[rank3]:     return self.block_{i}(x) + some_rather_long_expression_{i}\n"
        for i in range(40))
    stderr = ("[rank3]: noise before\n[rank3]: Traceback (most recent call last):\n" + frames
              + "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB\n"
              + "W1122 some log line after the traceback\n")
    text = failure_text("rank 3 (host algo-1, local rank 3) exited with code 1", stderr)
    assert len(text) <= FAILURE_LIMIT
    lines = text.splitlines()
    assert lines[1] == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB"
    assert lines[2:4] == ["Traceback (most recent call last):", "  ..."]
    assert lines[-1].strip() == "return self.block_39(x) + some_rather_long_expression_39"
    assert "layer_0.py" not in text and "[rank3]" not in text and "log line" not in text


def test_failure_text_of_the_last_chained_exception():
    stderr = textwrap.dedent("""\
        Traceback (most recent call last):
          File "a.py", line 1, in <module>
        KeyError: 'x'

        During handling of the above exception, another exception occurred:

        Traceback (most recent call last):
          File "a.py", line 3, in <module>
            raise RuntimeError("wrapped")
        RuntimeError: wrapped
    """)
    assert failure_text("h", stderr).splitlines()[:2] == ["h", "RuntimeError: wrapped"]


def test_a_rank_whose_watchdog_declared_a_hang_is_said_to_have_hung():
    why = "step 40 did not complete within 5 s (step_timeout 5 s, set by the job); waited 5.0 s"
    hung = RankFailure(rank=0, exception=HUNG_EXCEPTION, message=why, step=39, start_step=0)
    assert rank_ended(EXIT_HUNG, hung) == f"hung: {why}; its step watchdog ended it (exit code {EXIT_HUNG})"
    # controls: the code alone, or another failure's record, is told as before (a script of your own
    # may exit 86 for its own reasons)
    error = RankFailure(rank=0, exception="ValueError", message="boom", step=3, start_step=0)
    assert rank_ended(EXIT_HUNG, None) == rank_ended(EXIT_HUNG, error) == f"exited with code {EXIT_HUNG}"
    assert rank_ended(1, hung) == "exited with code 1" and rank_ended(-9, None) == "was killed by SIGKILL"


SIGABRT = 134  # exit_code of a process killed by signal 6
WORK_DONE = "[rank1]: epoch 3 loss 0.12\n[rank1]: done\n"


def test_the_teardown_abort_after_the_work_is_known_and_no_other_sigabrt():
    for stderr in (f"{WORK_DONE}{TEARDOWN_ABORT}\n", f"{WORK_DONE}[rank1]: {TEARDOWN_ABORT}\n\n"):
        cause = known_cause(SIGABRT, stderr)
        assert cause.startswith("the signature of a known torch/gloo teardown abort"), cause
        assert "destroy_process_group()" in cause
    traceback = 'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nValueError: bad\n'
    for code, stderr in ((SIGABRT, f"{traceback}{TEARDOWN_ABORT}\n"),  # an exception ended the work first
                         (SIGABRT, f"{WORK_DONE}double free or corruption (out)\n"),  # another abort
                         (SIGABRT, f"{TEARDOWN_ABORT}\nFatal Python error: Aborted\n  File train.py, line 7\n"),
                         (SIGABRT, ""), (1, f"{WORK_DONE}{TEARDOWN_ABORT}\n"),  # not SIGABRT
                         (128 + 9, f"{WORK_DONE}{TEARDOWN_ABORT}\n")):
        assert known_cause(code, stderr) is None, (code, stderr)


def test_the_failure_reason_of_a_teardown_abort_names_it_and_its_fix(tmp_path, monkeypatch):
    base = host_tree(tmp_path, "algo-1", ["algo-1"], {"sagemaker_program": "train.py"})
    env = read_training_env(base, num_gpus=0)
    monkeypatch.delenv("SMLAUNCH_ATTEMPT", raising=False)

    def ends(stderr: str) -> str:
        failure = Failure("rank 1 (host algo-1, local rank 1) was killed by SIGABRT", SIGABRT, signal=True, rank=1,
                          stderr_tail=stderr)
        monkeypatch.setattr(bootstrap, "_attempt", lambda *args: (failure, ["torchrun"], tmp_path / "faults", 1.0))
        (env.output_data_dir / "restarts.jsonl").unlink(missing_ok=True)  # each a job of its own
        assert bootstrap.run_attempts(env, base / "output", RestartPolicy()) == SIGABRT
        return (base / "output" / "failure").read_text()

    reason = ends(f"{WORK_DONE}{TEARDOWN_ABORT}\n")
    header = "rank 1 (host algo-1, local rank 1) was killed by SIGABRT"
    assert f'ErrorMessage "{header}\nthe signature of a known torch/gloo teardown abort' in reason
    assert "torch.distributed.destroy_process_group()" in reason and "docs/own-scripts.md" in reason
    assert f'last lines of stderr:\nepoch 3 loss 0.12\ndone\n{TEARDOWN_ABORT}"' in reason  # what told it
    # the control: another SIGABRT keeps the report it had
    other = ends(f"{WORK_DONE}double free or corruption (out)\n")
    assert "teardown" not in other and "was killed by SIGABRT\nlast lines of stderr:" in other


@pytest.mark.parametrize("message", ["short", "x" * 5000])
def test_failure_file_is_the_toolkits_within_the_limit(message):
    """The toolkit's ExecuteUserScriptError text is the reference; ours only keeps to 1024."""
    from sagemaker_training import errors

    cmd = ["/usr/bin/python3", "train.py", "--lr", "0.1"]
    ours = toolkit_error("ExecuteUserScriptError", 1, message, cmd)
    theirs = str(errors.ExecuteUserScriptError(cmd, return_code=1, output=message))
    assert len(ours) <= FAILURE_LIMIT
    if len(theirs) <= FAILURE_LIMIT:
        assert ours == theirs
    else:  # the message is cut to fit, the command left out; the beginning is the toolkit's
        assert ours == theirs[:len(ours) - 1] + '"' and ours.endswith('x"')




def _chained_archive(tmp_path: Path, last: list[tarfile.TarInfo]) -> Path:
    """Links that each stay inside the code directory, lexically, but leave it chained: `d -> .`,
    then `b -> d/..` (the parent of the code directory), then what goes through them."""
    archive = tmp_path / "chained.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(member("d", tarfile.SYMTYPE, "."))
        tar.addfile(member("b", tarfile.SYMTYPE, "d/.."))
        for info in last:
            data = b"OVERWRITTEN\n" if info.isfile() else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


@pytest.mark.parametrize("python", ["with data_filter", "without data_filter"])
@pytest.mark.parametrize("through", ["file", "hard link"])
def test_chained_links_leaving_the_code_directory_are_refused(tmp_path, monkeypatch, python, through):
    if python == "without data_filter":
        monkeypatch.delattr(tarfile, "data_filter")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    last = ([member("b/x")] if through == "file"
            else [member("h", tarfile.LNKTYPE, "b/victim.txt"), member("h")])
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(ContractError, match="would be written outside"):
        _extract(_chained_archive(tmp_path, last), dest)
    assert not (tmp_path / "x").exists() and victim.read_text() == "mine\n"


@pytest.mark.parametrize("python", ["with data_filter", "without data_filter"])
def test_a_member_never_replaces_a_link_extracted_before_it(tmp_path, monkeypatch, python):
    """`d -> sub/deep` makes `up -> d/..` land on `sub`; replacing d by `d -> .` would make `up`
    the parent of the code directory."""
    if python == "without data_filter":
        monkeypatch.delattr(tarfile, "data_filter")
    archive = tmp_path / "replace.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(member("sub/deep", tarfile.DIRTYPE))
        tar.addfile(member("d", tarfile.SYMTYPE, "sub/deep"))
        tar.addfile(member("up", tarfile.SYMTYPE, "d/.."))
        tar.addfile(member("d", tarfile.SYMTYPE, "."))
        tar.addfile(member("up/escape.py"))
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(ContractError, match="would be written outside"):
        _extract(archive, dest)
    assert not (tmp_path / "escape.py").exists()


def test_a_host_started_again_goes_on_from_the_jobs_records_and_does_not_rerun_an_ended_job(tmp_path, monkeypatch):
    """A pod a controller recreated (SMLAUNCH_ATTEMPT 0 again) continues the job's attempt count, so
    max_restarts bounds it; one whose job already ended runs nothing."""
    base = host_tree(tmp_path, "algo-1", ["algo-1"], {"sagemaker_program": "train.py"})
    env = read_training_env(base, num_gpus=0)
    monkeypatch.delenv("SMLAUNCH_ATTEMPT", raising=False)
    started = []
    monkeypatch.setattr(bootstrap, "_attempt", lambda env, out, number, policy, template: started.append(number) or 0)
    assert bootstrap.run_attempts(env, base / "output", RestartPolicy(2)) == 0
    assert started == [0]  # the control: a first start is attempt 0
    restarted = Restart(attempt=1, at="2026-11-29T12:00:00+00:00", failure_class="fault", reason="rank 0 was killed",
                        host="algo-1", restarted=True)
    append_restart(env.output_data_dir, restarted)
    assert bootstrap.run_attempts(env, base / "output", RestartPolicy(2)) == 0
    assert started == [0, 2]  # attempt 1 failed and was restarted: this is attempt 2
    append_restart(env.output_data_dir, replace(restarted, attempt=2, restarted=False))
    assert bootstrap.run_attempts(env, base / "output", RestartPolicy(2)) == 1
    assert started == [0, 2]  # nothing run
    assert "the job has ended: attempt 2 failed (fault, not restarted)" in (base / "output" / "failure").read_text()
