"""Which rank hung and where, from hand-written stacks (launcher.wire.diagnostics); the Flight
Recorder's variables and the SIGUSR1 check of the bootstrap's collector
(container/toolkit/diagnostics.py); `smlaunch logs --diagnostics`. Collecting the stacks of live
ranks is in tests/integration/test_hangs.py."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

import torch
from click.testing import CliRunner

from container.toolkit import diagnostics as collector
from launcher.cli.app import main
from launcher.local import store
from launcher.wire import diagnostics

SITE = "/opt/venv/lib/python3.11/site-packages"
WATCHDOG = """Current thread 0x00007f0000000002 (most recent call first):
  File "{site}/container/resilience/step_watch.py", line 212 in write_stacks
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

"""
IN_COLLECTIVE = """Thread 0x00007f0000000001 (most recent call first):
  File "{site}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{site}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/opt/ml/code/_smlaunch/container/trainer.py", line 168 in _all_sum
  File "/opt/ml/code/train.py", line 46 in <module>
"""
IN_DATA = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/socket.py", line 705 in readinto
  File "{site}/requests/models.py", line 820 in generate
  File "/opt/ml/code/my_loader.py", line 31 in fetch_shard
  File "{site}/container/trainer.py", line 377 in _train
  File "/opt/ml/code/train.py", line 46 in <module>
"""


def section(rank: int, main: str, world: int | None = 4, ident: str | None = "0x00007f0000000001") -> str:
    fields = {"reason": "step 9 did not complete within 60 s"} | ({"main_thread": ident} if ident else {})
    return (diagnostics.stacks_header(rank, world, f"algo-{rank // 2 + 1}", 100 + rank, **fields)
            + WATCHDOG.format(site=SITE) + main.format(site=SITE))


def write(directory, rank: int, text: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    diagnostics.rank_file(directory, rank).write_text(text)


def test_the_rank_outside_the_collective_is_named_with_its_own_code(tmp_path):
    for rank in (0, 1, 3):
        write(tmp_path, rank, section(rank, IN_COLLECTIVE))
    write(tmp_path, 2, section(2, IN_DATA))
    line = diagnostics.write_summary(tmp_path)
    assert line == ("rank(s) 2 did not reach the collective that rank(s) 0, 1, 3 waited in: rank 2 (host algo-2) in "
                    "fetch_shard (/opt/ml/code/my_loader.py:31), inside readinto (/usr/lib/python3.11/socket.py:705)")
    assert (tmp_path / "summary.txt").read_text().startswith(line + "\n")


def test_every_rank_waiting_names_the_ranks_without_stacks(tmp_path):
    for rank in (0, 1):  # the control: no rank here is outside a collective
        write(tmp_path / "algo-1", rank, section(rank, IN_COLLECTIVE))
    line = diagnostics.diagnose(diagnostics.read_ranks([tmp_path / "algo-1"]))
    assert line == ("every rank with stacks (0, 1) waited in a collective: the rank that did not join it left no "
                    "stacks here; no stacks from rank(s) 2, 3")
    write(tmp_path / "algo-2", 2, section(2, IN_DATA))  # another host's files complete the picture
    both = diagnostics.diagnose(diagnostics.read_ranks([tmp_path / "algo-1", tmp_path / "algo-2"]))
    assert both.startswith("rank(s) 2 did not reach the collective that rank(s) 0, 1 waited in") and both.endswith(
        "no stacks from rank(s) 3")


def test_no_rank_in_a_collective():
    ranks = [diagnostics.parse_section(section(0, IN_DATA, world=1))]
    assert diagnostics.diagnose(ranks).startswith("no rank waited in a collective: rank 0 (host algo-1) in fetch_shard")
    assert diagnostics.diagnose([]) == "no rank's stacks were recorded"


def test_a_rank_that_could_not_be_asked_is_no_suspect():
    unasked = diagnostics.parse_section(diagnostics.stacks_header(2, None, "algo-2", 7, stacks="none")
                                        + "(not asked: stopped (SIGSTOP?): it runs no handler)\n")
    waiting = [diagnostics.parse_section(section(r, IN_COLLECTIVE, world=3)) for r in (0, 1)]
    assert diagnostics.diagnose([*waiting, unasked]) == (
        "every rank with stacks (0, 1) waited in a collective: the rank that did not join it left no stacks here; "
        "no stacks from rank(s) 2")
    assert diagnostics.diagnose([unasked]) == "no rank's stacks were recorded (rank(s) 2 could not be asked)"


def test_the_main_thread_without_an_id_in_the_header():
    # a SIGUSR1 dump: no id; the thread whose stack starts at <module> is the main one
    text = section(1, IN_COLLECTIVE, ident=None)
    assert diagnostics.parse_section(text).main[0].function == "all_reduce"
    # the first section counts; py-spy's view and the log after `--- ` are no frames of it
    tail = '--- py-spy ---\nThread 0x00007f0000000009 (most recent call first):\n  File "x.py", line 1 in f\n'
    later = section(1, IN_DATA)
    path_text = text + tail + later
    parsed = diagnostics.parse_section(path_text.split("\n=== smlaunch stacks:")[0])
    assert parsed.waiting and len(parsed.main) == 4


def test_whose_code_a_frame_is():
    frame = diagnostics.Frame
    assert frame(f"{SITE}/container/trainer.py", 1, "f").ours  # smlaunch installed in the image
    assert frame("/opt/ml/code/_smlaunch/container/trainer.py", 1, "f").ours
    assert frame("/opt/ml/code/train.py", 1, "f").ours
    assert not frame(f"{SITE}/torch/nn/modules/module.py", 1, "f").ours
    assert not frame("/usr/lib/python3.11/threading.py", 1, "wait").ours
    assert not frame("<frozen importlib._bootstrap>", 1, "f").ours
    assert frame(f"{SITE}/torch/cuda/__init__.py", 1, "synchronize").waiting
    assert not frame(f"{SITE}/torch/cuda/__init__.py", 1, "current_device").waiting


def test_the_flight_recorder_variables_and_the_jobs_own_values(tmp_path):
    prefix = str(tmp_path / "attempt-0" / "flight_recorder" / "nccl_trace_rank_")
    # torch 2.8 renamed them and warns on every rank of a job that sets an old name: the new names only
    env = collector.flight_recorder_environment(tmp_path / "attempt-0", environ={}, torch=(2, 13))
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_FR_DUMP_TEMP_FILE": prefix}
    assert (tmp_path / "attempt-0" / "flight_recorder").is_dir()  # torch creates no directory
    # control: an image's torch before the rename reads the old names only
    assert collector.flight_recorder_environment(tmp_path / "attempt-0", environ={}, torch=(2, 7)) == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    assert collector.torch_version() == tuple(int(x) for x in torch.__version__.split(".")[:2])
    own = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/fsx/mine_",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}  # the job's own, under either name, wins
    assert collector.flight_recorder_environment(tmp_path / "attempt-1", environ=own, torch=(2, 13)) == {}
    assert not (tmp_path / "attempt-1").exists()


def test_a_ranks_nccl_lines_mask_its_secret_settings_and_say_where_the_dump_is(tmp_path):
    prefix = tmp_path / "flight_recorder" / "nccl_trace_rank_"
    environ = {"NCCL_DEBUG": "INFO", "NCCL_NET_PLUGIN_TOKEN": "tok-123456789", "NCCL_PROXY": "http://u:pw@proxy:3128",
               "TORCH_FR_DUMP_TEMP_FILE": str(prefix), "HOME": "/root"}
    rank = collector._Rank(pid=7, rank=3, local_rank=1, state="S", stderr=None, environ=environ)
    wheel = "2.27.3 (nvidia-nccl-cu12)"  # nccl_package_version's answer where torch loads NCCL's wheel
    lines = collector._nccl_lines(rank, wheel)
    assert lines["nccl"] == "2.27.3 (nvidia-nccl-cu12)"
    settings = lines["nccl_settings"]
    assert settings.startswith("NCCL_DEBUG=INFO, NCCL_NET_PLUGIN_TOKEN=****, NCCL_PROXY=http://u:")
    assert "tok-123456789" not in settings and "pw@" not in settings and "HOME" not in settings
    assert lines["flight_recorder"] == f"{prefix}3 (not written by the time of the stacks)"
    prefix.parent.mkdir()
    (tmp_path / "flight_recorder" / "nccl_trace_rank_3").write_bytes(b"trace")
    assert collector._nccl_lines(rank, wheel)["flight_recorder"] == f"{prefix}3"  # written: named as it is
    # the control: a rank with no NCCL setting, in a Python whose torch has no NCCL wheel
    bare = collector._nccl_lines(collector._Rank(pid=8, rank=0, local_rank=0, state="S", stderr=None), None)
    assert bare == {"nccl_settings": "none set (NCCL's defaults)",
                    "flight_recorder": "not recorded: the job set no Flight Recorder file variable"}


def test_the_summary_repeats_each_ranks_nccl_and_flight_recorder_lines(tmp_path):
    fields = diagnostics.nccl_fields({"NCCL_DEBUG": "WARN"}, "2.21.5")
    header = diagnostics.stacks_header(0, 2, "algo-1", 100, reason="step 9 did not complete",
                                       main_thread="0x00007f0000000001", flight_recorder="/x/fr_0", **fields)
    write(tmp_path, 0, header + WATCHDOG.format(site=SITE) + IN_COLLECTIVE.format(site=SITE))
    write(tmp_path, 1, section(1, IN_DATA, world=2))  # the control: a header without them
    diagnostics.write_summary(tmp_path)
    summary = (tmp_path / "summary.txt").read_text()
    detail = summary.split("\n\n", 1)[1]  # after the diagnosis's line: each rank's lines
    rank0 = detail[detail.index("rank 0 (host algo-1)"):detail.index("rank 1 (host algo-1)")]
    assert rank0.endswith("  nccl: 2.21.5\n  nccl settings: NCCL_DEBUG=WARN\n  flight recorder: /x/fr_0\n")
    assert summary.count("nccl settings") == 1  # rank 1's header has none


def test_only_a_process_that_catches_sigusr1_is_asked():
    assert not collector._catches(os.getpid(), signal.SIGUSR1)  # its default action would end the process
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        assert collector._catches(os.getpid(), signal.SIGUSR1)
    finally:
        faulthandler.unregister(signal.SIGUSR1)


def _local_job(home, name: str):
    job_dir = home / "jobs" / name
    (job_dir / "hosts" / "algo-1" / "output" / "data").mkdir(parents=True)
    (job_dir / "hosts" / "algo-2" / "output" / "data").mkdir(parents=True)
    store.write(job_dir, {"TrainingJobName": name, "TrainingJobStatus": "Failed", "Backend": "local",
                          "LocalJobDir": str(job_dir)})
    return job_dir / "hosts"


def test_logs_diagnostics_of_a_local_job(home):
    hosts = _local_job(home, "hung-1")
    result = CliRunner().invoke(main, ["logs", "local:hung-1", "--diagnostics"])
    assert result.exit_code == 0 and "job hung-1 has no diagnostics" in result.stdout
    first = hosts / "algo-1" / "output" / "data" / "diagnostics" / "attempt-0"
    second = hosts / "algo-2" / "output" / "data" / "diagnostics" / "attempt-0"
    for rank in (0, 1):
        write(first, rank, section(rank, IN_COLLECTIVE))
    write(second, 2, section(2, IN_DATA))
    write(second, 3, section(3, IN_COLLECTIVE))
    diagnostics.write_summary(second)  # algo-2's own summary sees only its ranks
    result = CliRunner().invoke(main, ["logs", "hung-1", "--diagnostics"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:2] == ["== hung-1, attempt 0 ==", "diagnosis: rank(s) 2 did not reach the collective that rank(s) "
                         "0, 1, 3 waited in: rank 2 (host algo-2) in fetch_shard (/opt/ml/code/my_loader.py:31), "
                         "inside readinto (/usr/lib/python3.11/socket.py:705)"]
    shown = [line for line in lines if line.startswith("-- ")]
    assert shown == [f"-- algo-1: {first / 'rank-0.txt'} --", f"-- algo-1: {first / 'rank-1.txt'} --",
                     f"-- algo-2: {second / 'summary.txt'} --", f"-- algo-2: {second / 'rank-2.txt'} --",
                     f"-- algo-2: {second / 'rank-3.txt'} --"]
    assert "  File \"/opt/ml/code/my_loader.py\", line 31 in fetch_shard" in lines


def test_logs_diagnostics_with_follow_is_refused():
    result = CliRunner().invoke(main, ["logs", "any-1", "--diagnostics", "--follow"])
    assert result.exit_code == 2 and "--diagnostics and --follow" in result.stderr


def test_logs_diagnostics_of_a_sagemaker_job_says_where_they_are(fake_credentials):
    from launcher.backends.sagemaker import SageMakerBackend
    from launcher.cli import diagnostics_view

    backend = SageMakerBackend(region="us-east-1")
    backend.artifacts = lambda job: {"output.tar.gz": f"s3://b/{job}/output/output.tar.gz"}
    said = []
    diagnostics_view.show("sm-1", backend, said.append)
    assert said == ["job sm-1 runs on SageMaker: its hosts' output data (diagnostics/ among it) is in "
                    "s3://b/sm-1/output/output.tar.gz (one directory per host's archive); download and extract it to "
                    "read it"]


def _kubernetes_job(home, name: str, storage: dict) -> None:
    store.write(home / "jobs" / name, {"TrainingJobName": name, "TrainingJobStatus": "Failed", "Backend": "kubernetes",
                                       "Kubernetes": {"namespace": "ml", "storage": storage}})


def test_logs_diagnostics_of_a_kubernetes_job_from_s3_and_from_a_claim(home, aws, tmp_path):
    """The pods' diagnostics are read where the job's storage is (S3 as the pods mirror them, a claim through
    client_path), every host's together; a claim this machine does not mount is said, with where they are."""
    from launcher.backends.kubernetes import KubernetesBackend
    from launcher.cli import diagnostics_view

    client = aws.client("s3")
    client.create_bucket(Bucket="bucket")
    for rank, main_thread in ((0, IN_COLLECTIVE), (1, IN_COLLECTIVE), (2, IN_DATA), (3, IN_COLLECTIVE)):
        key = f"jobs/k-1/hosts/algo-{rank // 2 + 1}/output/data/diagnostics/attempt-0/rank-{rank}.txt"
        client.put_object(Bucket="bucket", Key=key, Body=section(rank, main_thread).encode())
    _kubernetes_job(home, "k-1", {"s3": {"job": "s3://bucket/jobs/k-1", "checkpoints": "s3://bucket/jobs/k-1/c",
                                         "output": "s3://bucket/jobs/k-1/output", "region": None}})
    said: list[str] = []
    diagnostics_view.show("k-1", KubernetesBackend(root=home / "jobs"), said.append)
    assert said[:2] == ["== k-1, attempt 0 ==", "diagnosis: rank(s) 2 did not reach the collective that rank(s) 0, 1, "
                        "3 waited in: rank 2 (host algo-2) in fetch_shard (/opt/ml/code/my_loader.py:31), inside "
                        "readinto (/usr/lib/python3.11/socket.py:705)"]
    claim = {"pvc": "fsx", "mount_path": "/mnt/smlaunch", "client_path": str(tmp_path / "fsx"),
             "job_dir": "/mnt/smlaunch/jobs/k-2", "checkpoint_dir": "/mnt/smlaunch/jobs/k-2/checkpoints"}
    write(tmp_path / "fsx" / "jobs" / "k-2" / "hosts" / "algo-1" / "output" / "data" / "diagnostics" / "attempt-0", 0,
          section(0, IN_DATA, world=1))
    _kubernetes_job(home, "k-2", claim)
    said = []
    diagnostics_view.show("k-2", KubernetesBackend(root=home / "jobs"), said.append)
    assert said[1].startswith("diagnosis: no rank waited in a collective: rank 0 (host algo-1) in fetch_shard")
    _kubernetes_job(home, "k-3", {**claim, "client_path": None, "job_dir": "/mnt/smlaunch/jobs/k-3"})
    result = CliRunner().invoke(main, ["logs", "kubernetes:k-3", "--diagnostics"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert result.stdout.startswith("job k-3's output data is not readable here: the job's files are on the claim fsx")
    assert "/mnt/smlaunch/jobs/k-3/hosts/<host>/output/data on the claim (diagnostics/ among it)" in result.stdout
