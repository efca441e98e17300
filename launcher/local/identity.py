"""Which process a recorded pid is: a pid alone names no process for long.

After the process ends, the kernel hands its pid to the next process that starts (a PID wrap,
or any process after a reboot). So a local job records, with the supervisor's and the watchdog's
pid, the process's start time (field 22 of `/proc/<pid>/stat`, in clock ticks since boot) and
the boot's id (`/proc/sys/kernel/random/boot_id`): a process with that pid, that start time and
that boot id is the one that was recorded, and nothing else is. Signals go through a pidfd
opened before the check (`os.pidfd_open`, Linux 5.3+), so the process checked is the one
signalled even if it ends in between.

Without /proc (not Linux) no start time can be recorded: the identity is the pid alone and is
trusted as before; docs/faults.md says so.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from launcher.wire.proc_stat import PROC, stat_fields

BOOT_ID = PROC / "sys" / "kernel" / "random" / "boot_id"


def of(pid: int) -> dict[str, Any]:
    """The identity to record for a running process: its pid, and on Linux its start time and boot id."""
    identity: dict[str, Any] = {"Pid": pid}
    started = _start_ticks(pid)
    if started is not None:
        identity.update(StartTicks=started, BootId=BOOT_ID.read_text().strip())
    return identity


def _start_ticks(pid: int) -> int | None:
    """The start time of a live process (None once it is gone, a zombie, or without /proc)."""
    fields = stat_fields(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[19])


def recorded(record: dict, role: str) -> dict[str, Any] | None:
    """The identity a job record holds for `role` ("Supervisor" or "Watchdog"): `<role>Process`, or
    for a record of an older smlaunch its bare `<role>Pid`."""
    identity = record.get(f"{role}Process")
    if isinstance(identity, dict) and isinstance(identity.get("Pid"), int):
        return identity
    pid = record.get(f"{role}Pid")
    return {"Pid": pid} if isinstance(pid, int) and pid > 0 else None


def is_running(identity: dict[str, Any]) -> bool:
    """Whether the recorded process still runs: same pid, and (where recorded) same start and boot."""
    pid = identity["Pid"]
    if "StartTicks" not in identity:  # recorded without /proc: the pid is all there is
        return _pid_exists(pid)
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return False
    return boot == identity.get("BootId") and _start_ticks(pid) == identity["StartTicks"]


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def send(identity: dict[str, Any], signum: int) -> bool:
    """Signal the recorded process if it still runs; False (nothing sent) when it is gone."""
    if not hasattr(os, "pidfd_open"):  # not Linux: nothing to hold the process while it is checked
        if not is_running(identity):
            return False
        os.kill(identity["Pid"], signum)
        return True
    try:
        pidfd = os.pidfd_open(identity["Pid"])
    except ProcessLookupError:
        return False
    try:
        if not is_running(identity):  # the pid is someone else's now
            return False
        signal.pidfd_send_signal(pidfd, signum)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def gone_because(identity: dict[str, Any]) -> str:
    """Why a recorded process counts as gone, for a failure reason."""
    pid = identity["Pid"]
    if "StartTicks" in identity and _start_ticks(pid) is not None:
        return f"pid {pid} now belongs to another process (the machine restarted, or the pid was reused)"
    return f"pid {pid} is no longer running"


PID_MAX = 4_194_304  # PID_MAX_LIMIT on 64-bit Linux: no process has a larger pid


def problem(identity: Any) -> str | None:
    """What makes a recorded identity (read back from a file someone may have edited) name no process
    smlaunch may signal, or None. On Linux an identity holds the start time and boot id that prove the
    process is the one recorded: a pid alone proves nothing, and is not trusted."""
    if not isinstance(identity, dict):
        return f"is {type(identity).__name__} {str(identity)[:40]!r}, not a process identity"
    pid = identity.get("Pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= PID_MAX:
        return f"has Pid {str(pid)[:40]!r}, not a process id (1 to {PID_MAX})"
    ticks, boot = identity.get("StartTicks"), identity.get("BootId")
    if BOOT_ID.is_file() and not (isinstance(ticks, int) and not isinstance(ticks, bool) and ticks >= 0
                                        and isinstance(boot, str)):
        return "has a pid without the process's start time and boot id, which prove it is the one recorded"
    return None
