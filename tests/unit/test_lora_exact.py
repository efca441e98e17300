"""LoRA at world 1 against peft on transformers, the reference (issue 52, section 3): the same tiny
Llama's weights loaded into both as each loads them, the same adapters copied into both (B non-zero,
or A's gradients would be zero), then logits, loss and every adapter's gradient compared, and a few
AdamW steps against a hand loop of peft and torch's AdamW; tolerances from tests/support/close.py.
Controls: another rank or target set changes the result; without use_peft everything trains."""

from __future__ import annotations

import json
import math

import pytest
import torch

from container import optim
from container.checkpoint.hf_export import load_hf_weights
from container.checkpoint.peft_export import peft_name
from container.data.loader import shift_labels
from container.models.llama import build_model
from container.models.lora import LoRALinear, adapter_names, apply_lora
from container.trainer import adapters
from launcher.wire.training.hf_config import spec_from_hf_config
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.lora import LoraSettings, lora_settings, target_kinds, trainable_parameters
from tests.support.close import assert_close, llama_terms, logits_terms
from tests.support.hf_models import SEQ
from tests.support.peft_reference import ALL_LINEAR as ALL
from tests.support.peft_reference import lora_model, ours_with_adapters, random_tokens, torchao_off

BATCH = 2


def _reference(directory, lora: LoraSettings):
    from transformers import AutoModelForCausalLM

    return lora_model(AutoModelForCausalLM.from_pretrained(directory), r=lora.r, lora_alpha=lora.alpha,
                      lora_dropout=lora.dropout, target_modules=list(lora.targets), use_rslora=lora.rslora)


def _family(spec) -> str:
    return "gpt_neox" if spec.is_gpt_neox else "llama"


def _same_adapters(ours, reference, family: str, seed: int = 5) -> None:
    """Random adapters (A and B) into ours, and the same into peft's under the names its files use."""
    from peft import set_peft_model_state_dict

    generator = torch.Generator().manual_seed(seed)
    state = {}
    with torch.no_grad():
        for name, parameter in ours.named_parameters():
            if parameter.requires_grad:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
                state[peft_name(name, family)] = parameter.detach().clone()
    with torchao_off():
        result = set_peft_model_state_dict(reference, state)
    assert not result.unexpected_keys, result.unexpected_keys


def _batch(vocab: int, seed: int = 3):
    ids = random_tokens(vocab, BATCH, seed)
    return ids, shift_labels(ids)


def _our_loss(model, tokens, labels):
    summed, count = model(tokens, labels=labels)
    return summed / count


def _reference_grads(reference) -> dict[str, torch.Tensor]:
    """peft's adapter gradients under the names its files use (lora_A.default.weight -> lora_A.weight)."""
    return {name.replace(".default", ""): p.grad for name, p in reference.named_parameters() if p.requires_grad}


def _pair(lora_base, **settings):
    directory, spec = lora_base
    lora = LoraSettings(dropout=0.0, **settings)
    ours, reference = ours_with_adapters(directory, spec, lora), _reference(directory, lora)
    _same_adapters(ours, reference, _family(spec))
    return spec, ours, reference


@pytest.fixture(scope="module")
def neox_base(tmp_path_factory):
    """A tiny GPT-NeoX (Pythia's shape: RoPE on a quarter of each head, parallel residual, biases)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=SEQ, rotary_pct=0.25, hidden_act="gelu",
                           use_parallel_residual=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("neox")
    GPTNeoXForCausalLM(config).save_pretrained(directory)
    return directory, spec_from_hf_config(json.loads((directory / "config.json").read_text()), "tiny-neox")


@pytest.mark.parametrize("settings", [{"r": 8, "alpha": 16, "targets": ALL},
                                      {"r": 4, "alpha": 32, "targets": ("q_proj", "v_proj"), "rslora": True}])
def test_logits_loss_and_every_adapter_gradient_equal_peft(lora_base, settings):
    _check_against_peft(lora_base, settings)


def test_gpt_neox_s_adapters_equal_peft_s(neox_base):
    _check_against_peft(neox_base, {"r": 8, "alpha": 16, "targets": target_kinds(neox_base[1])})


def test_mistral_s_adapters_equal_peft_s(tmp_path):
    """Llama's block with a sliding window of 16 keys, shorter than the sequence."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=96, max_position_embeddings=SEQ,
                           sliding_window=16, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    spec = spec_from_hf_config(json.loads((tmp_path / "config.json").read_text()), "tiny-mistral")
    assert spec.sliding_window == 16
    _check_against_peft((tmp_path, spec), {"r": 8, "alpha": 16, "targets": ALL})


def test_mixtral_s_attention_adapters_equal_peft_s(tmp_path):
    """Mixtral's four attention projections (all a mixture of experts' adapters go on: launcher.wire.
    training.lora), the routing after them differentiable through the router, as transformers' is."""
    from tests.support.hf_models import mixtral_config, save_mixtral

    save_mixtral(tmp_path, mixtral_config())
    spec = spec_from_hf_config(json.loads((tmp_path / "config.json").read_text()), "tiny-mixtral")
    kinds = target_kinds(spec)
    assert spec.is_moe and kinds == ("q_proj", "k_proj", "v_proj", "o_proj")
    reference = _check_against_peft((tmp_path, spec), {"r": 8, "alpha": 16, "targets": kinds})
    lora = LoraSettings(r=8, alpha=16, targets=kinds)
    assert trainable_parameters(spec, lora) == reference.get_nb_trainable_parameters()


def _check_against_peft(base, settings):
    spec, ours, reference = _pair(base, **settings)
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
    assert len(trained) == len(grads) == 2 * len(settings["targets"]) * spec.num_layers
    for name, parameter in trained.items():
        assert_close(parameter.grad, grads[peft_name(name, _family(spec))], terms=terms, what=f"grad of {name}")
    # the base is frozen: no gradient anywhere else, in either
    assert all(p.grad is None for name, p in ours.named_parameters() if name not in trained)
    assert all(p.grad is None for p in reference.parameters() if not p.requires_grad)
    return reference


def test_dropout_is_on_the_adapters_input_as_peft_s(lora_base):
    """In training mode, from the same generator state: the same elements dropped, in the same order."""
    spec, ours, reference = _pair(lora_base, r=8, alpha=16, targets=ALL)
    ours.train()
    reference.train()
    for module in ours.modules():
        if isinstance(module, LoRALinear):
            module.lora_dropout = torch.nn.Dropout(0.3)
    for name, module in reference.named_modules():
        if name.endswith("lora_dropout"):
            module["default"] = torch.nn.Dropout(0.3)
    tokens, labels = _batch(spec.vocab_size)
    torch.manual_seed(11)
    loss = _our_loss(ours, tokens, labels)
    torch.manual_seed(11)
    expected = reference(input_ids=tokens, labels=tokens).loss
    assert_close(loss, expected, terms=llama_terms(spec, SEQ, BATCH * SEQ), what="loss with dropout")
    torch.manual_seed(12)  # control: other dropped elements, another loss
    with pytest.raises(AssertionError, match="off by more than"):
        assert_close(_our_loss(ours, tokens, labels), expected, terms=llama_terms(spec, SEQ, BATCH * SEQ))


def test_adamw_steps_equal_a_hand_loop_with_peft(lora_base):
    """In float64, held to float32's tolerance: Adam divides each gradient by its own magnitude, which
    magnifies rounding wherever a gradient nearly cancels; float64 keeps that far below the tolerance,
    and an update that differs (a missed weight decay, another lr or beta, a base weight stepped) shows."""
    spec, ours, reference = _pair(lora_base, r=8, alpha=16, targets=ALL)
    ours, reference = ours.double(), reference.double()
    lr, wd, betas, clip = 1e-2, 0.1, (0.9, 0.95), 0.5
    optimizer = optim.build_optimizer(ours, lr=lr, weight_decay=wd, betas=betas)
    trained = [p for p in reference.parameters() if p.requires_grad]
    hand = torch.optim.AdamW(trained, lr=lr, weight_decay=wd, betas=betas, eps=1e-8)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(trained)  # the adapters only
    steps = 3
    terms = steps * llama_terms(spec, SEQ, BATCH * SEQ)
    for step in range(steps):
        tokens, labels = _batch(spec.vocab_size, seed=step)
        loss = _our_loss(ours, tokens, labels)
        expected = reference(input_ids=tokens, labels=tokens).loss
        assert_close(loss, expected, terms=terms, dtype=torch.float32, what=f"loss of step {step + 1}")
        loss.backward()
        expected.backward()
        norm = optim.clip_grad_norm_(ours.parameters(), clip)
        assert_close(norm, torch.nn.utils.clip_grad_norm_(trained, clip), terms=terms, dtype=torch.float32,
                     what="gradient norm")
        optimizer.step()
        hand.step()
        optimizer.zero_grad(set_to_none=True)
        hand.zero_grad(set_to_none=True)
    expected = {name.replace(".default", ""): p for name, p in reference.named_parameters() if p.requires_grad}
    for name, parameter in ours.named_parameters():
        if parameter.requires_grad:  # Adam moves each by up to lr a step: the scale of what the steps made
            assert_close(parameter, expected[peft_name(name)], terms=terms, scale=steps * lr, dtype=torch.float32,
                         what=name)


def test_another_rank_or_target_set_changes_the_result(lora_base):
    """Controls: the comparison above tells adapters apart."""
    spec, ours, reference = _pair(lora_base, r=8, alpha=16, targets=ALL)
    tokens, _ = _batch(spec.vocab_size)
    with torch.no_grad():
        expected = reference(tokens).logits
        for other in ({"r": 4, "alpha": 16, "targets": ALL}, {"r": 8, "alpha": 16, "targets": ("q_proj",)}):
            _, changed, _ = _pair(lora_base, **other)
            with pytest.raises(AssertionError, match="off by more than"):
                assert_close(changed(tokens), expected, terms=logits_terms(spec, SEQ))


def test_adapters_start_as_peft_s_and_leave_the_first_loss_the_base_s(lora_base):
    directory, spec = lora_base
    lora = LoraSettings(r=8, alpha=16, targets=ALL)
    ours, plain = ours_with_adapters(directory, spec, lora), build_model(spec, SEQ)
    load_hf_weights(plain, directory)
    for module in ours.modules():
        if isinstance(module, LoRALinear):  # kaiming-uniform with a = sqrt(5): bound 1 / sqrt(fan_in)
            bound = 1 / math.sqrt(module.in_features)
            assert module.lora_A.weight.abs().max() <= bound and module.lora_A.weight.abs().max() > 0.9 * bound
            assert not module.lora_B.weight.any()
    tokens, labels = _batch(spec.vocab_size)
    with torch.no_grad():
        assert torch.equal(_our_loss(ours, tokens, labels), _our_loss(plain, tokens, labels))


def test_without_use_peft_every_parameter_trains(lora_base):
    _, spec = lora_base
    assert adapters(TrainingHyperparameters(), spec) is None
    hp = TrainingHyperparameters(use_peft=True)
    assert lora_settings(hp, spec).targets == ("q_proj", "v_proj")  # peft's default for a Llama
    model = build_model(spec, SEQ)
    assert all(p.requires_grad for p in model.parameters())
    apply_lora(model, adapters(hp, spec), seed=0)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(adapter_names(model))


def test_activation_checkpointing_recomputes_the_dropout_the_forward_drew(lora_base):
    """Its recomputation must drop what the forward dropped, or the gradients are of another function."""
    from container.distributed.parallelize import apply_activation_checkpointing

    directory, spec = lora_base
    lora = LoraSettings(r=8, alpha=16, dropout=0.3, targets=ALL)
    plain, checkpointed = (ours_with_adapters(directory, spec, lora) for _ in range(2))
    apply_activation_checkpointing(checkpointed)
    tokens, labels = _batch(spec.vocab_size)
    grads = []
    for model in (plain, checkpointed):
        with torch.no_grad():  # B non-zero, the same in both
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.fill_(0.01)
        torch.manual_seed(11)
        _our_loss(model, tokens, labels).backward()
        grads.append({n.replace("_checkpoint_wrapped_module.", ""): p.grad  # the wrapper's part of the name
                      for n, p in model.named_parameters() if p.requires_grad})
    assert grads[1].keys() == grads[0].keys()
    for name, grad in grads[0].items():
        assert_close(grads[1][name], grad, terms=llama_terms(spec, SEQ, BATCH * SEQ), what=name)
