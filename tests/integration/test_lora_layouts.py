"""LoRA under tensor and context parallelism (issue 52, section 2): a LoRA job at tp 2, and one at cp 2, trains
the same losses and gradient norms as the same job in one process. Under tp the adapters follow their base's
split (container.distributed.tensor_parallel): column-parallel bases (q/k/v, gate, up) with A replicated and B
split by output features, row-parallel ones (o, down) with A split by input features and B replicated; under
cp each rank applies them to its tokens. Adapters on every linear layer, dropout 0 (validate refuses dropout
with tensor parallelism). Four tiny jobs of 4 steps (~17 s); the control, adapters on q_proj and v_proj only
(column-parallel bases), trains other losses, so the comparison sees the row-parallel ones. Without apply_tp
putting back each parameter's requires_grad the tp run trains the norms too (torch's SequenceParallel makes
them anew), and its losses part from step 2."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from container.checkpoint.peft_export import ADAPTER_WEIGHTS
from tests.support.train_runs import assert_same_training, run_train

LORA = {"use_peft": 1, "lora_target_modules": "all-linear", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0,
        "max_steps": 4}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora-ref")
    return run_train(path, 1, **LORA), path


@pytest.mark.parametrize("params", ["tensor_parallel_degree=2", "context_parallel_degree=2"], ids=["tp2", "cp2"])
def test_a_lora_job_trains_as_one_process(tmp_path, reference, params):
    records, path = reference
    assert_same_training(run_train(tmp_path, 2, mp_parameters=params, **LORA), records)
    ours, theirs = (load_file(p / "model" / ADAPTER_WEIGHTS) for p in (tmp_path, path))
    assert ours.keys() == theirs.keys() and all(ours[k].shape == theirs[k].shape for k in ours)


def test_the_comparison_sees_the_row_parallel_adapters(tmp_path, reference):
    control = run_train(tmp_path, 1, **{**LORA, "lora_target_modules": "q_proj,v_proj"})
    with pytest.raises(AssertionError, match="loss"):
        assert_same_training(control, reference[0])
