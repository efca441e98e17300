"""Backend local's part of a job: it has no section of its own (local_runner and the instance types local and
local_gpu say how it runs), only what runs a script of the user's own there (launcher.config.script_rules)."""

from __future__ import annotations


def target(job) -> tuple[str, str]:
    """(kind, label) of script_rules.Target: the local container image, smlaunch's image or this machine's Python."""
    if job.local_runner == "docker":
        if job.image_uri:
            return "image", f"the local container image {job.image_uri}"
        return "smlaunch-image", "smlaunch's training image (the local docker runner's default)"
    return "process", "this machine's Python (the local process runner)"
