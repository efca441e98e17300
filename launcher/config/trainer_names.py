"""The names Hugging Face's Trainer (`TrainingArguments`) and TRL's trainers (`SFTConfig`, ...) give
the settings smlaunch's train.py takes under its own (the seed's) names, so that a job or a sweep
written with theirs is told the name train.py reads, not the nearest spelling (`learning_rate` is
nearest to `sharding_strategy`).

smlaunch's train.py does nothing with a name it does not know: a job that sets `learning_rate`
trains at the default lr. So for smlaunch's runtime a name of this table, or one typo (a letter
added, dropped, changed, or two swapped) from a known name, is an error (`meant_as_known`:
launcher.config.job_rules; a tuned name train.py does not read is always one, tuning_rules); a name
merely like a known one (`nested` and `seed`) is a warning with the suggestion. A script of the
user's own reads its own names and gets them as written.
"""

from __future__ import annotations

from collections.abc import Iterable

from launcher.wire.training.issues import did_you_mean

# Trainer/TRL name -> (train.py's name, what differs, if anything)
TRAINER_NAMES: dict[str, tuple[str, str]] = {
    "learning_rate": ("lr", ""),
    "num_train_epochs": ("epochs", ""),
    "per_device_train_batch_size": ("train_batch_size", ""),
    "per_device_eval_batch_size": ("val_batch_size", ""),
    "warmup_ratio": ("warmup", "a fraction of lr_decay_iters"),
    "warmup_steps": ("warmup", "a fraction of lr_decay_iters, not a number of steps"),
    "lr_scheduler_type": ("lr_decay_style", ""),
    "max_grad_norm": ("grad_clip", ""),
    "adam_beta1": ("beta1", ""),
    "adam_beta2": ("beta2", ""),
    "optim": ("optimizer", ""),
    "logging_steps": ("logging_freq", ""),
    "eval_steps": ("validation_freq", ""),
    "save_steps": ("checkpoint_freq", ""),
    "save_total_limit": ("num_kept_checkpoints", ""),
    "gradient_checkpointing": ("activation_checkpointing", ""),
    "torch_compile": ("compile", ""),
    "max_seq_length": ("max_context_width", ""),  # TRL's SFTConfig before 0.20
    "max_length": ("max_context_width", ""),  # TRL's SFTConfig since 0.20
    "model_name_or_path": ("hf_pretrained_model_name_or_dir", ""),
}


def known_name_hint(name: str, known: Iterable[str]) -> str | None:
    """"did you mean 'lr'? ..." for a name train.py does not read: its own name for a Trainer/TRL
    name, else the known name it is a typo of; None when it is near none."""
    if name in TRAINER_NAMES:
        ours, differs = TRAINER_NAMES[name]
        return (f"did you mean {ours!r}? ({name} is Hugging Face's name, its Trainer's or TRL's; smlaunch's train.py "
                f"reads {ours}{', ' + differs if differs else ''})")
    hint = did_you_mean(name, known, n=1)
    return hint if hint.startswith("did you mean") else None


def meant_as_known(name: str, known: Iterable[str]) -> bool:
    """Whether `name` surely means a known name: a Trainer/TRL name, or one typo from a known one."""
    return name in TRAINER_NAMES or any(_one_typo(name, k) for k in known)


def _one_typo(a: str, b: str) -> bool:
    """a and b differ by one letter added, dropped or changed, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if len(a) == len(b):
        return a[i + 1:] == b[i + 1:] or (a[i:i + 2] == b[i:i + 2][::-1] and a[i + 2:] == b[i + 2:])
    shorter, longer = (a, b) if len(a) < len(b) else (b, a)
    return shorter[i:] == longer[i + 1:]
