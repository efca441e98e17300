"""DCP checkpoints: exact resume (plain and FSDP2 models), resharding, partial saves, SIGTERM.
Here the tests that start processes; the rest are tests/unit/test_checkpoint.py."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from container.checkpoint.checkpointer import Checkpointer
from container.checkpoint.sigterm import StopFlag, should_stop
from tests.support.checkpoints import assert_states_close, full_state, make_model, train_step
from tests.support.gloo import spawn


def _fsdp_load(root: str) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    reference = torch.load(Path(root) / "reference.pt")
    model, optimizer, scheduler = make_model(seed=1, mesh=mesh)
    checkpointer = Checkpointer(Path(root) / "ckpt", keep=2)
    assert checkpointer.load_latest(model, optimizer, scheduler)[0] == 3
    loaded = full_state(model)
    train_step(model, optimizer, scheduler, 3)
    after = full_state(model)
    if dist.get_rank() == 0:
        assert_states_close(loaded, reference["saved"], atol=0)
        assert_states_close(after, reference["after"], atol=1e-6)


def test_fsdp_checkpoint_reshards_to_four_ranks(two_rank_checkpoint):
    spawn(4, _fsdp_load, str(two_rank_checkpoint))


def _agree_on_stop(root: str) -> None:
    flag = StopFlag(requested=dist.get_rank() == 1)
    assert should_stop(flag)
    assert not should_stop(StopFlag())


def test_should_stop_agrees_across_ranks(tmp_path):
    spawn(2, _agree_on_stop, str(tmp_path))


def _one_rank_fails_in_the_background(root: str) -> None:
    """Rank 1 alone cannot write its manifest part of step 2 (its disk filled up); rank 0 could.
    Both must give the save up together, with the reason, rather than rank 0 marking it complete or
    waiting in a barrier for rank 1."""
    import errno

    import pytest

    from container.checkpoint import checkpointer as ckpt
    from container.checkpoint.background import CheckpointWriteError

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, optimizer, scheduler = make_model(seed=1, mesh=mesh)
    checkpointer = Checkpointer(Path(root), keep=2, async_mode="async")
    train_step(model, optimizer, scheduler, 0)
    checkpointer.save(1, model, optimizer, scheduler, {})
    train_step(model, optimizer, scheduler, 1)
    if dist.get_rank() == 1:
        real = ckpt.manifest.write_part

        def full(directory, rank, names):
            if "step-2" in str(directory):
                raise OSError(errno.ENOSPC, "No space left on device")
            real(directory, rank, names)

        ckpt.manifest.write_part = full
    checkpointer.save(2, model, optimizer, scheduler, {})  # staged; the write goes on in the background
    # the stop path: the ranks agree to stop, and wait for the save in flight before they leave
    assert not should_stop(StopFlag())
    with pytest.raises(CheckpointWriteError, match=r"step-2 .*rank 1: No space left on device \(ENOSPC\)"):
        checkpointer.close()
    dist.barrier()  # the host's first rank removes the failed .tmp
    left = sorted(p.name for p in Path(root).glob("step-*"))  # the root also holds the rendezvous file
    assert left == ["step-1"], left


def test_a_background_write_that_fails_on_one_rank_fails_on_every_rank(tmp_path):
    spawn(2, _one_rank_fails_in_the_background, str(tmp_path))


# How long the save's watchdog section lets the background agreement wait before it calls the save hung
SECTION_S = 60
JOB_TIMEOUT = timedelta(seconds=77)


def _one_rank_fails_outside_dcp_in_the_background(root: str) -> None:
    """Rank 1's background write fails before DCP's collectives (as its staging or storage setup
    would), which DCP hands to no other rank. Before, rank 1 waited in smlaunch's agreement while
    rank 0 waited in DCP's plan exchange, until the save's watchdog section (init_timeout) or gloo's
    30 minutes; now rank 1 raises its own error, as a synchronous save does, and leaves, so rank 0's
    DCP collective breaks at once. Each rank writes what its wait did."""
    import errno
    import os
    from concurrent.futures import Future

    from container.checkpoint import background
    from container.resilience.step_watch import Limits, StepWatch

    rank = dist.get_rank()
    outcome = Path(root) / f"outcome-{rank}"

    def leave(code: int) -> None:  # the section ran out: the rank would leave as hung
        outcome.write_text(f"hung ({code})")
        os._exit(0)

    model, optimizer, scheduler = make_model(seed=1, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    checkpointer = Checkpointer(Path(root) / "ckpt", keep=2, async_mode="async", timeout=JOB_TIMEOUT)
    group_timeout = checkpointer._background.group._get_backend(torch.device("cpu")).options._timeout
    watch = StepWatch(Limits(init_s=SECTION_S, step_s=None), Path(root) / "diag", rank, 2, "h", leave=leave,
                      grace_s=0).start()
    if rank == 1:
        def fails(*args, **kwargs) -> Future:
            write = Future()
            write.set_exception(OSError(errno.EIO, os.strerror(errno.EIO)))
            return write

        background.dcp.async_save = fails
    train_step(model, optimizer, scheduler, 0)
    checkpointer.save(1, model, optimizer, scheduler, {})
    try:
        with watch.section("checkpoint save"):
            checkpointer.wait()
        outcome.write_text(f"committed; group timeout {group_timeout}")
    except Exception as exc:  # noqa: BLE001 - what the wait raised is the outcome
        outcome.write_text(f"raised {type(exc).__name__}: {exc}; group timeout {group_timeout}")
    os._exit(0)  # as run_rank leaves after a failure: no further collective


def test_a_background_write_that_fails_outside_dcp_on_one_rank_is_that_ranks_error(tmp_path):
    spawn(2, _one_rank_fails_outside_dcp_in_the_background, str(tmp_path))
    outcome = {rank: (tmp_path / f"outcome-{rank}").read_text() for rank in (0, 1)}
    # not "hung": rank 1 raised its own error, and rank 0's DCP collective failed when rank 1 left (a
    # peer's failure); the background group times out after the job's collective_timeout, not gloo's 30 min
    assert outcome[1] == f"raised OSError: [Errno 5] Input/output error; group timeout {JOB_TIMEOUT}", outcome
    assert outcome[0].startswith("raised ") and outcome[0].endswith(f"; group timeout {JOB_TIMEOUT}"), outcome
    # the control, a failure in smlaunch's own steps that every rank agrees on, is the test above this one


def _one_rank_cannot_write_its_own_files(root: str) -> None:
    """Rank 1 cannot write its RNG state of step 2 (its disk filled up), before DCP's shards; rank 0
    could. Before, rank 1 raised torch's error alone while rank 0 waited for it in DCP's collective;
    now both give the save up with the same reason, naming the cause and the file."""
    import errno
    import os
    import re

    import pytest

    from container.checkpoint.background import CheckpointWriteError

    model, optimizer, scheduler = make_model(seed=1, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    checkpointer = Checkpointer(Path(root), keep=2)
    train_step(model, optimizer, scheduler, 0)
    checkpointer.save(1, model, optimizer, scheduler, {})  # the control: the same files with room for them
    if dist.get_rank() == 1:
        real = torch.save

        def full(value, f, *args, **kwargs):
            target = f if isinstance(f, (str, os.PathLike)) else f.name  # a path, or the file opened for it
            if str(target).endswith(os.path.join("step-2.tmp", "rng-1.pt")):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(value, f, *args, **kwargs)

        torch.save = full
    train_step(model, optimizer, scheduler, 1)
    rng_file = Path(root) / "step-2.tmp" / "rng-1.pt"
    cause = rf"rank 1: No space left on device \(ENOSPC\) writing {re.escape(str(rng_file))}\. "
    with pytest.raises(CheckpointWriteError, match=rf"step-2 .*: {cause}"):
        checkpointer.save(2, model, optimizer, scheduler, {})
    dist.barrier()  # the host's first rank removes the failed .tmp
    assert sorted(p.name for p in Path(root).glob("step-*")) == ["step-1"]


def test_a_rank_that_cannot_write_its_own_files_fails_every_rank_with_the_cause(tmp_path):
    spawn(2, _one_rank_cannot_write_its_own_files, str(tmp_path))
