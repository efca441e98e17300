"""What `compile: 1` composes with (container.distributed.compile; docs/smp.md, "compile"). A
compiled block is one graph or nothing (fullgraph): what dynamo cannot trace, or traces into
wrong numbers, is refused here by name with the fix, never left to run eager. Validation runs
these for smlaunch's train.py (launcher.config.runtime_rules); the container runs them again
before anything is built."""

from __future__ import annotations

from launcher.wire.training.hyperparameters import FP8Config, TrainingHyperparameters
from launcher.wire.training.issues import Issue

HP = "hyperparameters"
# The container refuses it too, where the model's blocks are built (container.distributed.compile).
MOE_REFUSAL = ("compile=1 with a mixture-of-experts model is not supported: its routing gives each expert a "
               "data-dependent number of tokens (a split by counts.tolist()), which one graph cannot hold")
MOE_FIX = "set compile=0, or train a dense model"


def compile_issues(hp: TrainingHyperparameters) -> list[Issue]:
    """What the hyperparameters ask for that compile cannot compile. FSDP, tensor, context and
    pipeline parallelism compose (tensor parallelism with container.distributed.compile's three
    torch 2.13 workarounds); a mixture-of-experts model does not (runtime_rules.check_compile)."""
    fp8 = FP8Config.from_hyperparameters(hp)
    if not hp.compile or not (fp8.enabled and fp8.backend == "transformer_engine"):
        return []
    return [Issue(f"{HP}.fp8_backend", fp8.backend, "compile=1 with Transformer Engine's FP8 is not supported: "
                  "te.Linear and its FP8 autocast are not traceable by torch.compile (graph breaks)",
                  "set compile=0, or fp8_backend=torchao, whose float8 linears compile")]
