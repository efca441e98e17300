"""A job that goes on with fewer hosts keeps its global batch (docs/faults.md, "Shrink and go on").

After a host is lost for good, the local or Slurm supervisor restarts the job on the hosts it still
has (min_instance_count) and tells the runtime the job's original world in SMLAUNCH_ORIGINAL_WORLD,
set only then. The runtime lays the same parameters out on both worlds and multiplies
gradient_accumulation_steps by dp(original) / dp(now): the lost ranks' share of each step is taken
by accumulation on the others, so the steps are the uninterrupted run's (the resume keeps the global
batch, launcher.wire.training.resume). Where that ratio is no whole number, or a degree does not fit
the smaller world, the job fails naming why, before training. No torch here: the container and
`validate` call the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.layout import LayoutProblem, ParallelLayout, layout_problems

ORIGINAL_WORLD_ENV = "SMLAUNCH_ORIGINAL_WORLD"


def original_world(environ: Mapping[str, str]) -> int | None:
    """The job's world before it shrank, as the supervisor set it; None for a job that did not shrink."""
    value = environ.get(ORIGINAL_WORLD_ENV)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{ORIGINAL_WORLD_ENV}={value!r}: a world size (ranks), set by smlaunch's supervisor only")
    return int(value)


def shrink_problems(params: ModelParallelParameters, original: int, world: int) -> list[LayoutProblem]:
    """Why a job laid out by `params` on `original` ranks cannot go on with `world` ranks at the same
    global batch (empty: it can)."""
    why = f"the job shrank from {original} to {world} ranks"
    problems = [LayoutProblem(p.key, p.value, f"{p.problem} ({why})", f"{p.fix}, or a min_instance_count whose "
                              "world it tiles") for p in layout_problems(params, world)]
    if problems:
        return problems
    was, now = _data_parallel(params, original), _data_parallel(params, world)
    if was % now:
        return [LayoutProblem("gradient_accumulation_steps", was, f"{why}: {now} data-parallel ranks cannot take "
                              f"the share of {was} by gradient accumulation ({was} / {now} is no whole number)",
                              "a min_instance_count whose data-parallel degree divides the original one")]
    return []


def kept_accumulation(grad_accum: int, params: ModelParallelParameters, original: int, world: int) -> int:
    """gradient_accumulation_steps at `world` ranks that keeps the global batch of `original` ranks
    (after shrink_problems found none)."""
    return grad_accum * (_data_parallel(params, original) // _data_parallel(params, world))


def _data_parallel(params: ModelParallelParameters, world: int) -> int:
    return ParallelLayout.from_parameters(params, world).data_parallel
