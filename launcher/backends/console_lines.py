"""What a terminal shows of a job's log lines while `submit` and `logs --follow` follow it.

Rank 0's `[metrics]` line carries the whole training record (about 20 keys, 400 characters), and
the bootstrap's launch line the whole torchrun command (600 characters and more): the job's log
(logs/job.log, `smlaunch logs JOB`) and metrics.jsonl keep both whole. A terminal gets a training
record as one short aligned row (step, loss, lr, tokens/s, ETA), a validation record's in the same
columns, and a launch as torchrun's layout and the program; every other line (a restart's record
among them) as it is.
Off a terminal (a pipe, a file, a test) launcher.backends.live prints every line whole.
"""

from __future__ import annotations

import re
import shlex

from launcher.wire.metric_lines import PREFIX, clock, parse_metric_line

# The bootstrap's launch line: `[smlaunch] algo-1: <python> -m torch.distributed.run <options>
# <program> <arguments> (in <code dir>)` (container.toolkit.bootstrap).
_LAUNCH = re.compile(r"^(?P<head>.*?)\S+ -m torch\.distributed\.run (?P<command>.*?)(?: \(in [^()]*\))?$")
_LAYOUT = ("--nnodes", "--nproc_per_node", "--node_rank")  # the torchrun options a terminal shows
_FLAGS = frozenset({"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module"})


def shown(line: str, max_steps: int | None = None) -> str:
    """The line as a terminal shows it (see the module docstring); `max_steps`, the job's as its last
    training record said, aligns a validation record's step (its line has no max_steps)."""
    return _short_record(line, max_steps) or _short_launch(line) or line


def _short_record(line: str, max_steps: int | None) -> str | None:
    """'step  40/120  loss  2.6219  lr 2.45e-03     17,600 tokens/s  ETA 0:00:23' for a training
    record's line, 'step  40/120  val loss  3.2115' for a validation record's (whatever precedes
    `[metrics]` kept); None for any other line."""
    values = parse_metric_line(line)
    if values is None or not {"loss", "val_loss"} & set(values):
        return None
    total = values.get("max_steps", max_steps)
    if isinstance(total, int) and total > 0:
        step = f"step {values['step']:>{len(str(total))}}/{total}"
    else:
        step = f"step {values['step']}"
    if "loss" not in values:
        return line[:line.find(PREFIX)] + f"{step}  val loss {values['val_loss']:7.4f}"
    parts = [step, f"loss {values['loss']:7.4f}"]
    if "lr" in values:
        parts.append(f"lr {values['lr']:.2e}")
    if "tokens_per_s" in values:
        parts.append(f"{values['tokens_per_s']:>9,.0f} tokens/s")
    if values.get("nonfinite_steps"):
        parts.append(f"{values['nonfinite_steps']} non-finite")
    if "eta_s" in values:
        parts.append(f"ETA {clock(values['eta_s'])}")
    return line[:line.find(PREFIX)] + "  ".join(parts)


def _short_launch(line: str) -> str | None:
    """'[smlaunch] algo-1: torchrun --nnodes 2 --nproc_per_node 2 --node_rank 0 train.py + 36 arguments (the
    whole command is in the job's log)' for the bootstrap's launch line; None for any other line."""
    match = _LAUNCH.match(line)
    if match is None:
        return None
    try:
        words = shlex.split(match["command"])
    except ValueError:
        return None
    kept, i = [], 0
    while i < len(words) and words[i].startswith("-"):
        takes_value = "=" not in words[i] and words[i] not in _FLAGS
        if words[i].split("=", 1)[0] in _LAYOUT:
            kept += words[i:i + 1 + takes_value]
        i += 1 + takes_value
    if i >= len(words):
        return None
    program, arguments = words[i], len(words) - i - 1
    more = f" + {arguments} argument{'s' if arguments != 1 else ''}" if arguments else ""
    return f"{match['head']}torchrun {shlex.join([*kept, program])}{more} (the whole command is in the job's log)"
