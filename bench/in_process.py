"""train.py's `main` in this process (a world of one, gloo), under a torch dispatch mode that
counts something, with a callback at the end of each step (the step watchdog's `step_done`): what
bench/step_syncs.py and bench/step_allocs.py count with. Their scripts put the repository and
entrypoints/ on sys.path before importing this."""

from __future__ import annotations

import tempfile
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

DEFAULTS = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_context_width": "64",
            "train_batch_size": "2", "max_steps": "8", "logging_freq": "4", "seed": "7"}


def settings(argv: list[str]) -> dict[str, str]:
    """DEFAULTS with `--key value` pairs from the command line over them."""
    pairs = dict(DEFAULTS)
    for key, value in zip(argv[::2], argv[1::2]):
        pairs[key.removeprefix("--")] = value
    return pairs


def run_train(pairs: dict[str, str], mode: TorchDispatchMode, step_end: Callable[[int], None]) -> None:
    """train.py's `main` with these hyperparameters under `mode`; `step_end(step)` after each step."""
    # here, not at the top: entrypoints/ is on sys.path only once the calling script has put it there
    import train

    from container.resilience import step_watch

    done = step_watch.step_done

    def step_done(step: int) -> None:
        done(step)
        step_end(step)

    step_watch.step_done = step_done
    try:
        with tempfile.TemporaryDirectory() as tmp:
            args = [a for k, v in pairs.items() for a in (f"--{k}", v)]
            args += ["--output_data_dir", f"{tmp}/out", "--model_dir", f"{tmp}/model",
                     "--checkpoint_dir", f"{tmp}/ck"]
            with mode:
                train.main(args)
    finally:
        step_watch.step_done = done
