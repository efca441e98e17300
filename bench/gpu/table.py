"""The run table of bench/gpu/run.py: every run a part makes, as plain data.

A run's settings are train.py's hyperparameters (the runtime's own vocabulary): smlaunch's runtime
gets them as they are, and the peers (the Hugging Face loop, torchtitan) translate the ones that
have a counterpart there (`compile`, `activation_checkpointing`, the FP8 recipe). A setting the
runtime does not know yet (`compile` before it lands) is a plain entry here: the runner skips
that run with the reason (bench/gpu/trainpy.py), it does not crash.

Sizes (`full`): Llama 3.2 1B and 3B shapes at 8,192 tokens, one sequence a step (8,192 tokens per
step on every stack). On an H100 at ~45% MFU a 1B step is ~0.17 s (9.0 GFLOP a token x 8,192
tokens = 74 TFLOP) and a 3B step ~0.43 s (23.5 GFLOP a token). `dry` is the same table with the
tiny model at 128 tokens, a few steps, on the CPU: the plumbing end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PARTS = ("1b", "fp8", "lora", "3b", "tests")  # by value: the main 1B comparison first
STACKS = ("trainpy", "hf", "torchtitan")
# Where the time goes on an H100 (seconds, estimates: process start and model build ~10, a
# compile of one block and the loss ~30, the timed steps; the GPU tests compile FlexAttention for
# ~25 cases); run.py starts no part with less than half its limit left before its deadline, and
# `--only` reruns it.
PART_LIMITS_S = {"1b": 200, "fp8": 150, "lora": 60, "3b": 200, "tests": 200}
FP8_BASELINE = "1b-trainpy-compiled"  # bf16, as many steps as the FP8 runs
SEED = 1234  # the same random weights and data on every stack


@dataclass(frozen=True)
class Shape:
    model: str  # a preset of launcher/wire/training/models.py (PRESETS)
    seq_len: int
    steps: int  # speed runs: warm-up + timed
    warmup: int  # steps left out of the timing (allocator, first-step kernels)
    compile_warmup: int  # with compile=1: the first steps compile (and may recompile once)
    fp8_steps: int  # the FP8 loss comparison
    activation_checkpointing: int = 0  # every stack alike


# The 3B runs checkpoint activations (full) on every stack: without, the planner puts train.py at
# 71.7 GiB of an H100's 80, and the Hugging Face loop's fp32 weights, gradients and AdamW state
# (51 GB) with its whole fp32 logits and 28 blocks' activations do not fit at all.
FULL = {"1b": Shape("llama3.2-1b", 8192, 13, 3, 5, 200), "3b": Shape("llama3.2-3b", 8192, 10, 3, 5, 0, 1)}
DRY = {"1b": Shape("llama3-tiny", 128, 5, 2, 2, 6), "3b": Shape("llama3-tiny", 128, 4, 2, 2, 0, 1)}


@dataclass(frozen=True)
class Run:
    name: str
    part: str
    stack: str
    model: str
    seq_len: int
    steps: int
    warmup: int
    hyperparameters: dict = field(default_factory=dict)  # train.py's names; the peers translate them
    baseline: str | None = None  # the run this one's speed and losses are compared with

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * int(self.hyperparameters.get("train_batch_size", 1))


def common_hyperparameters(shape: Shape, steps: int, dry_run: bool) -> dict:
    """What every run of every stack shares: model, data, precision, batch, optimizer schedule."""
    hp = {"model_preset": shape.model, "dataset_type": "synthetic", "max_context_width": shape.seq_len,
          "train_batch_size": 1, "bf16": 1, "max_steps": steps, "logging_freq": 1, "seed": SEED,
          "lr": 1e-4, "lr_decay_style": "constant", "warmup": 0, "weight_decay": 0.1, "grad_clip": 1.0}
    if shape.activation_checkpointing:
        hp["activation_checkpointing"] = 1
    if dry_run:
        hp["fp8_emulate"] = 1  # FP8 runs are torchao's emulation on the CPU; no-op for bf16 runs
    return hp


def speed_runs(part: str, shape: Shape, dry_run: bool, long_compiled_trainpy: int = 0) -> list[Run]:
    """Each stack, compile off then on. `long_compiled_trainpy`: train.py's compiled run takes that
    many steps instead (the FP8 part's bf16 baseline: one run less to compile)."""
    runs = []
    for compiled in (0, 1):
        warmup = shape.compile_warmup if compiled else shape.warmup
        for stack in STACKS:
            steps = long_compiled_trainpy if (compiled and stack == "trainpy" and long_compiled_trainpy) else (
                shape.steps + warmup - shape.warmup)
            hp = common_hyperparameters(shape, steps, dry_run)
            if compiled:  # off is the default: an eager run runs on a runtime without the setting too
                hp["compile"] = 1
            mode = "compiled" if compiled else "eager"
            runs.append(Run(f"{part}-{stack}-{mode}", part, stack, shape.model, shape.seq_len, steps, warmup, hp,
                            baseline=None if stack == "trainpy" else f"{part}-trainpy-{mode}"))
    return runs


def fp8_runs(shape: Shape, dry_run: bool) -> list[Run]:
    """torchao float8, tensorwise and rowwise, against the bf16 run of the same length (compiled:
    float8's casts are fused only under compile, as torchtitan runs them)."""
    runs = []
    for recipe in ("tensorwise", "rowwise"):
        hp = {**common_hyperparameters(shape, shape.fp8_steps, dry_run), "compile": 1, "fp8": 1,
              "fp8_backend": "torchao", "fp8_recipe": recipe}
        runs.append(Run(f"fp8-trainpy-{recipe}", "fp8", "trainpy", shape.model, shape.seq_len, shape.fp8_steps,
                        shape.compile_warmup, hp, baseline=FP8_BASELINE))
    return runs


def lora_runs(shape: Shape, dry_run: bool) -> list[Run]:
    """train.py's LoRA (adapters of rank 16 on every linear layer, TRL's other defaults: docs/lora.md)
    against the full fine-tune of the same shape, eager: its speed and peak memory. The MFU of a LoRA
    run uses the full fine-tune's FLOP count (6·N a token), which it does not do (no weight gradients
    of the frozen base: ~4·N), so read its tokens/s against the baseline's, not its MFU."""
    hp = {**common_hyperparameters(shape, shape.steps, dry_run), "use_peft": 1, "lora_target_modules": "all-linear"}
    return [Run("lora-trainpy-eager", "lora", "trainpy", shape.model, shape.seq_len, shape.steps, shape.warmup, hp,
                baseline="1b-trainpy-eager")]


def table(dry_run: bool, stacks: tuple[str, ...] = STACKS) -> dict[str, list[Run]]:
    """part -> its runs, in the order they run (`tests` has none: bench/gpu/gputests.py)."""
    shapes = DRY if dry_run else FULL
    one = shapes["1b"]
    every = {
        "1b": speed_runs("1b", one, dry_run, long_compiled_trainpy=one.fp8_steps),
        "fp8": fp8_runs(one, dry_run),
        "lora": lora_runs(one, dry_run),
        "3b": speed_runs("3b", shapes["3b"], dry_run),
        "tests": [],
    }
    return {part: [r for r in runs if r.stack in stacks] for part, runs in every.items()}


def names() -> tuple[str, ...]:
    """Every run's name (the same in the full table and the dry run)."""
    return tuple(r.name for runs in table(dry_run=False).values() for r in runs)


def parse_list(text: str | None, choices: tuple[str, ...], option: str) -> tuple[str, ...]:
    """`--only 1b,fp8` -> ("1b", "fp8") in the table's order; an unknown name is an error naming it."""
    if not text:
        return choices
    asked = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in asked if p not in choices]
    if unknown or not asked:
        raise ValueError(f"{option} {text!r}: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(choices)}")
    return tuple(p for p in choices if p in asked)
