"""The job's code trees on this machine (source_dir, its dependency directories) checked at validate
as its code archive will walk them (launcher.config.code_tree), less what no archive of the job
ships: smlaunch's state and the job's own outputs (`job_state`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from launcher.config.code_tree import TreeError, a_credential, job_ignore, resolved, walk
from launcher.config.job_rules import resolve_path
from launcher.config.paths import smlaunch_home
from launcher.wire.checkpoints import DEFAULT_CHECKPOINT_PATH
from launcher.wire.training.issues import Issue


def job_state(cfg, base: Path) -> list[Path]:
    """Directories a job's trees never ship, wherever they lie: SMLAUNCH_HOME (earlier jobs' records,
    archives and their channels' links) and a local output_path or checkpoint_local_path (earlier
    models and checkpoints: each archive would embed the last)."""
    paths = [smlaunch_home()]
    checkpoints = None if cfg.checkpoint_local_path == DEFAULT_CHECKPOINT_PATH else cfg.checkpoint_local_path
    for value in (cfg.output_path, checkpoints):
        if value and not value.startswith("s3://"):
            paths.append(resolve_path(base, value))
    return paths


def check_code_trees(ctx) -> list[Issue]:
    """Each of the job's code trees on this machine walked as its archive will be (context.Context)."""
    job, base = ctx.job, ctx.base_dir
    trees = [("source_dir", job.source_dir, ctx.code_dir)] if job.source_dir and ctx.code_dir else []
    trees += [(f"dependencies[{i}]", dep, resolve_path(base, dep)) for i, dep in enumerate(job.dependencies)]
    never = {resolved(path) for path in job_state(job, base)}
    issues = []
    for field, value, root in trees:  # a file, or a missing directory, is job_rules' to judge
        if root.is_dir() and (refused := _refusal(root, job_ignore(job), never)) is not None:
            issues.append(Issue(field, value, refused.problem, refused.fix))
    return issues


def _refusal(root: Path, ignore: Sequence[str], never: set[Path]) -> TreeError | None:
    """The tree's first link its archive would refuse, walking as launcher.backends.sourcedir packs
    (credential files and the job's state left out, never followed)."""
    real_root = root.resolve()

    def keep(path: Path, real: Path, name: str) -> bool:
        return real not in never and not a_credential(real_root, path, real, name)

    try:
        for _ in walk(root, "", ignore, keep):
            pass
    except TreeError as exc:
        return exc
    return None
