"""What the step watchdog's timeouts ask of the job (container/resilience/step_watch.py; docs/faults.md,
"Hangs"): a step timeout that the collectives' timeout does not pre-empt, and a watchdog to time
the steps, which only smlaunch's runtime has."""

from __future__ import annotations

from launcher.wire.training.hyperparameters import COLLECTIVE_TIMEOUT_DEFAULT_S
from launcher.wire.training.issues import Issue

HP = "hyperparameters"
WATCHED = ("init_timeout", "step_timeout")


def check_hang_timeouts(ctx) -> list[Issue]:
    hp = ctx.hp
    if not ctx.runtime:
        return [_unwatched(name, value) for name in WATCHED if (value := getattr(hp, name)) is not None]
    collective = hp.collective_timeout or COLLECTIVE_TIMEOUT_DEFAULT_S
    if not hp.step_timeout or hp.step_timeout < collective:
        return []
    said = "" if hp.collective_timeout else " by default"
    # The ranks that wait on a hung one wait in a collective: at collective_timeout they fail with
    # a collective's error, and the hung rank's watchdog, which names it with its stacks, comes too late.
    return [Issue(f"{HP}.step_timeout", hp.step_timeout, f"is not below collective_timeout ({collective} s{said}): "
                  "the ranks waiting on a hung rank fail at the collective timeout first, so the job fails as a "
                  "collective error, without the hung rank's stacks or its name",
                  f"set step_timeout below {collective}, or raise collective_timeout above it", "warning")]


def _unwatched(name: str, value: int) -> Issue:
    return Issue(f"{HP}.{name}", value, "sets the step watchdog of smlaunch's runtime, and a script of your own "
                 "has none: nothing ends a hung rank of it but its own collectives' timeouts or max_run (your "
                 f"script gets --{name} as an argument)",
                 "time your script's steps yourself (or leave it out), and bound the job with max_run", "warning")
