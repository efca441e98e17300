"""Pieces of local mode that need no run: the artifact merge, the status record, the stale
supervisor, and where /opt/ml arguments land when the tree moves.
Here the tests that run in one process; those that start processes are tests/integration/test_local_units.py."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import pytest

from container.args import directories
from launcher.local import store
from launcher.local.spec import LocalJobSpec
from launcher.local.supervise import Supervisor
from launcher.wire.archives import pack


def test_pack_merges_hosts_and_the_first_host_wins(tmp_path):
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    (a / "sub").mkdir(parents=True)
    (b / "sub").mkdir(parents=True)
    (a / "model.safetensors").write_text("rank 0")
    (b / "model.safetensors").write_text("rank 1")
    (a / "sub" / "x.txt").write_text("a")
    (b / "sub" / "y.txt").write_text("b")
    archive = pack([a, b, tmp_path / "missing"], tmp_path / "model.tar.gz")
    with tarfile.open(archive) as tar:
        got = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert got == {"model.safetensors": "rank 0", "sub/x.txt": "a", "sub/y.txt": "b"}


def test_status_record_transitions_and_listing(tmp_path):
    root = tmp_path / "jobs"
    for i, name in enumerate(["old", "new"]):
        store.write(root / name, {"TrainingJobName": name, "TrainingJobStatus": "InProgress",
                                  "SecondaryStatus": "Starting", "CreationTime": f"2026-11-22T00:00:0{i}"})
    record = store.update(root / "new", SecondaryStatus="Training", StatusMessage="go")
    record = store.update(root / "new", SecondaryStatus="Completed", TrainingJobStatus="Completed")
    assert [t["Status"] for t in record["SecondaryStatusTransitions"]] == ["Training", "Completed"]
    assert "EndTime" in record["SecondaryStatusTransitions"][0]
    assert [r["TrainingJobName"] for r in store.list_jobs(root)] == ["new", "old"]
    assert [r["TrainingJobName"] for r in store.list_jobs(root, status="Completed")] == ["new"]
    (root / "broken").mkdir()
    (root / "broken" / "job.json").write_text("{")
    assert len(store.list_jobs(root)) == 2  # a damaged record is skipped, not fatal
    with pytest.raises(LookupError, match="no local job named 'nope'"):
        store.read("nope", root)


def test_opt_ml_arguments_follow_the_moved_tree(tmp_path, monkeypatch):
    for name in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_CHANNEL_TRAIN", "SMLAUNCH_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "algo-1"))
    dirs = directories({"checkpoint_dir": "/opt/ml/checkpoints", "model_dir": "/opt/ml/model",
                        "output_data_dir": "/elsewhere/out"})
    assert dirs.checkpoints == tmp_path / "algo-1" / "checkpoints"
    assert dirs.model == tmp_path / "algo-1" / "model"
    assert dirs.output_data == Path("/elsewhere/out")  # not under /opt/ml: as given
    monkeypatch.setenv("SMLAUNCH_CHECKPOINT_DIR", str(tmp_path / "shared"))
    assert directories({"checkpoint_dir": "/opt/ml/checkpoints/run1"}).checkpoints == tmp_path / "shared" / "run1"
    assert directories({}).checkpoints == tmp_path / "shared"


def test_console_lines_are_host_prefixed_and_coloured_on_a_terminal(monkeypatch):
    import io

    from launcher.local import supervise

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.delenv("NO_COLOR", raising=False)
    supervise.console_printer("algo-2", "magenta", "step 1")
    assert out.getvalue() == "\x1b[35malgo-2 |\x1b[0m step 1\n"
    monkeypatch.setenv("NO_COLOR", "1")
    supervise.console_printer("algo-2", "magenta", "step 2")
    assert out.getvalue().endswith("algo-2 | step 2\n")


def _full_disk_after(nbytes: int, under: Path):
    """Writes of files under `under` fail with ENOSPC once `nbytes` are written, as on a full disk."""
    import errno
    import io

    real_open = io.open

    def fake_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "w" not in mode or not Path(file).is_relative_to(under):
            return handle
        written = [0]
        real_write = handle.write

        def write(data):
            written[0] += len(data)
            if written[0] > nbytes:
                real_write(data[: max(nbytes - written[0] + len(data), 0)])
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(data)

        handle.write = write
        return handle

    return fake_open


@pytest.mark.parametrize("full", ["staging", "output_path"])
def test_an_artifact_that_cannot_be_written_whole_is_removed_and_the_job_says_why(tmp_path, monkeypatch, full):
    import builtins
    import errno
    import io
    import os
    import shutil

    job_dir = tmp_path / "jobs" / "j"
    host = job_dir / "hosts" / "algo-1"
    (host / "model").mkdir(parents=True)
    (host / "output" / "data").mkdir(parents=True)
    (host / "model" / "weights.bin").write_bytes(os.urandom(1 << 20))  # incompressible: the disk fills
    (host / "output" / "success").write_text("")
    store.write(job_dir, {"TrainingJobName": "j", "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training"})
    out = tmp_path / "out"
    spec = LocalJobSpec(name="j", job_dir=job_dir, hosts=["algo-1"], instance_type="local", processes_per_host=1,
                        hyperparameters={}, channels={}, environment={}, checkpoint_dir=job_dir / "checkpoints",
                        max_run=60, output_path=str(out))
    supervisor = Supervisor(spec, runner=None, printer=None)
    supervisor._merged = io.BytesIO()
    fake_open = _full_disk_after(256 << 10, job_dir / "artifacts" if full == "staging" else out)
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(tarfile, "bltn_open", fake_open)  # tarfile's own reference to open
    monkeypatch.setattr(shutil, "_USE_CP_SENDFILE", False)  # copies through write(), which fails

    def other_file_system(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "rename", other_file_system)  # output_path elsewhere: shutil.move copies
    record = supervisor._finish(None, [("algo-1", 0)], 1.0)
    assert record["TrainingJobStatus"] == "Failed"
    assert "could not store the artifacts" in record["FailureReason"] and "No space left" in record["FailureReason"]
    left = [p.name for p in (*job_dir.rglob("*.tar.gz*"), *out.rglob("*"))]
    assert not [name for name in left if "model.tar.gz" in name], left  # nothing truncated left behind
