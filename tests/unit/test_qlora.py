"""QLoRA's NF4 base (container/models/qlora.py, issue 52 section 3): torchao's quantization against the
QLoRA paper's code book and a blockwise absmax quantization written here; a QLoRA model's logits, loss
and adapter gradients against peft's LoRA on a transformers model whose base holds the NF4 base's
dequantized weights (control: the original weights differ by more than the tolerance), and the merged
model made from the dequantized base, as peft's merge_and_unload makes it on a base of those values."""

from __future__ import annotations

import json

import pytest
import torch

from container.checkpoint import hf_export as hf
from container.checkpoint.peft_export import merged_state, peft_name
from container.models import qlora
from launcher.wire.training.hf_config import spec_from_hf_config
from launcher.wire.training.lora import NF4_BLOCK, NF4_SCALER_BLOCK, LoraSettings
from tests.support.close import assert_close, llama_terms, logits_terms
from tests.support.hf_models import SEQ, llama_config, save_llama
from tests.support.nf4_reference import PAPER_NF4, QLORA_SHAPES, TORCHAO_NF4, nf4_base, nf4_round_trip
from tests.support.peft_reference import lora_model, ours_with_adapters, torchao_off
from tests.unit.test_lora_exact import BATCH, _batch, _our_loss, _reference_grads, _same_adapters


@pytest.fixture(scope="module")
def qlora_base(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qlora-base")
    save_llama(directory, llama_config(**QLORA_SHAPES))
    return directory, spec_from_hf_config(json.loads((directory / "config.json").read_text()), "tiny-qlora")


def test_torchao_s_nf4_is_the_paper_s_code_book_and_blockwise_absmax_quantization():
    from torchao.dtypes.nf4tensor import to_nf4

    weight = torch.randn(128, 512, generator=torch.Generator().manual_seed(0)) * 0.02
    quantized = to_nf4(weight, NF4_BLOCK, NF4_SCALER_BLOCK)
    # torchao stores the paper's levels to 4 decimals
    assert quantized.nf4.tolist() == torch.tensor(TORCHAO_NF4).tolist()
    assert max(abs(ours - paper) for ours, paper in zip(TORCHAO_NF4, PAPER_NF4)) <= 5e-5
    dequantized = quantized.get_original_weight()
    assert_close(dequantized, nf4_round_trip(weight), terms=4, what="dequantized NF4")
    # control: NF4 loses precision, far more than the comparison's tolerance
    with pytest.raises(AssertionError, match="off by more than"):
        assert_close(dequantized, weight, terms=4, what="the original weights")


def _qlora_pair(base, lora: LoraSettings, dequantized_reference: bool = True):
    """Ours with its base in NF4, and peft's LoRA on transformers with the base's NF4 round trip written
    out (tests/support/nf4_reference.py; or, the control, the original weights), the same adapters in both."""
    from transformers import AutoModelForCausalLM

    directory, spec = base
    ours = ours_with_adapters(directory, spec, lora)
    qlora.quantize_base(ours)
    transformers_model = AutoModelForCausalLM.from_pretrained(directory)
    if dequantized_reference:
        nf4_base(transformers_model)
    reference = lora_model(transformers_model, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                           target_modules=list(lora.targets))
    _same_adapters(ours, reference, _family(spec))
    return ours, reference


def _family(spec) -> str:
    return "gpt_neox" if spec.is_gpt_neox else "llama"


def _compare(spec, ours, reference):
    tokens, labels = _batch(spec.vocab_size)
    with torch.no_grad():
        assert_close(ours(tokens), reference(tokens).logits, terms=logits_terms(spec, SEQ), what="logits")
    loss = _our_loss(ours, tokens, labels)
    expected = reference(input_ids=tokens, labels=tokens).loss
    terms = llama_terms(spec, SEQ, BATCH * SEQ)
    assert_close(loss, expected, terms=terms, what="loss")
    loss.backward()
    expected.backward()
    grads = _reference_grads(reference)
    trained = {name: p for name, p in ours.named_parameters() if p.requires_grad}
    assert len(trained) == len(grads) > 0
    for name, parameter in trained.items():
        assert_close(parameter.grad, grads[peft_name(name, _family(spec))], terms=terms, what=f"grad of {name}")


def test_a_qlora_model_equals_peft_on_the_dequantized_base(qlora_base):
    lora = LoraSettings(r=8, alpha=16, dropout=0.0, targets=("q_proj", "v_proj", "down_proj"), nf4=True)
    ours, reference = _qlora_pair(qlora_base, lora)
    quantized = [layer for _, layer in qlora.quantized_layers(ours)]
    assert len(quantized) == 7 * qlora_base[1].num_layers  # every linear layer of the blocks, adapted or not
    assert all(type(layer.weight).__name__ == "NF4Tensor" and not layer.weight.requires_grad for layer in quantized)
    assert ours.output.weight.dtype == torch.float32  # the head is not quantized
    _compare(qlora_base[1], ours, reference)
    # merge_weights: the dequantized base plus the adapters' update, as peft's merge_and_unload makes it on that base
    merged = merged_state(ours.state_dict(), lora)
    with torchao_off():
        expected = reference.merge_and_unload().state_dict()
    assert merged.keys() == {hf.from_hf_name(name) for name in expected}
    for name, tensor in merged.items():
        assert_close(tensor, expected[hf.to_hf_name(name)], terms=lora.r + 4, what=name)


def test_gpt_neox_s_nf4_base_equals_peft_s(tmp_path):
    """Pythia's block (biases, a fused query_key_value, a parallel residual) on an NF4 base."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=320, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=1024, max_position_embeddings=SEQ, rotary_pct=0.25, hidden_act="gelu",
                           use_parallel_residual=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    GPTNeoXForCausalLM(config).save_pretrained(tmp_path)
    spec = spec_from_hf_config(json.loads((tmp_path / "config.json").read_text()), "tiny-neox")
    lora = LoraSettings(r=8, alpha=16, dropout=0.0, targets=("query_key_value", "dense_4h_to_h"), nf4=True)
    ours, reference = _qlora_pair((tmp_path, spec), lora)
    assert len(qlora.quantized_layers(ours)) == 4 * spec.num_layers
    _compare(spec, ours, reference)


def test_control_the_original_base_differs_by_more_than_the_tolerance(qlora_base):
    lora = LoraSettings(r=8, alpha=16, dropout=0.0, targets=("q_proj", "v_proj"), nf4=True)
    ours, reference = _qlora_pair(qlora_base, lora, dequantized_reference=False)
    with pytest.raises(AssertionError, match="logits: off by more than"):
        _compare(qlora_base[1], ours, reference)


def test_a_layer_whose_fsdp_shards_would_split_a_block_of_scales_is_refused_by_name(qlora_base):
    """k_proj 128 x 256 = 32,768 weights: 2 blocks of 64 x 256, so 2 shards and no more."""
    from container.models.llama import build_model

    spec = qlora_base[1]
    qlora.quantize_base(build_model(spec, SEQ), shards=2)  # the control
    with pytest.raises(ValueError, match=r"layers.0.attention.wk \(\(128, 256\)\) cannot be cut into 4 FSDP shards"):
        qlora.quantize_base(build_model(spec, SEQ), shards=4)
