"""scripts/lowest-priority.sh (what `make test` runs its BESIDE step with): the command runs at nice 19,
and so does its session's scheduling group, where the kernel groups processes by session
(autogroups); the control: `setsid nice -n 19` alone leaves the new session's group at nice 0, where
the step took a core's fair share from the suite. A few shells, milliseconds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ["sh", "-c", "cat /proc/self/autogroup; nice"]


def _run(*prefix: str) -> list[str]:
    return subprocess.run(["setsid", *prefix, *PROBE], capture_output=True, text=True, check=True,
                          timeout=30).stdout.split("\n")


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="this kernel has no autogroups")
def test_the_command_and_its_sessions_group_run_at_nice_19():
    group, nice, _ = _run(str(ROOT / "scripts" / "lowest-priority.sh"))
    assert group.endswith(" nice 19") and nice == "19"
    group, nice, _ = _run("nice", "-n", "19")  # the control
    assert group.endswith(" nice 0") and nice == "19"
