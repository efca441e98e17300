"""Tiny pretrained Llama and Mixtral models and tokenizers, made here with transformers and tokenizers (the
Hub cannot be reached), saved as users find them: transformers 5 or 4 config.json, safetensors or
PyTorch .bin, single or sharded, in a directory or in a real huggingface_hub cache. The Llama's
shapes, the tokenizers and the chat template are those of `python -m container.data tiny-chat`
(container.data.tiny_chat), which users try chat fine-tuning offline with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from container.data import tiny_chat

VOCAB = 320  # the tokenizer's 256 byte symbols, its merges and special tokens fit
SEQ = 128
# Llama 3.1's RoPE scaling, with an original context small enough that SEQ positions feel it (rope_theta apart).
LLAMA3_ROPE = {k: v for k, v in tiny_chat.LLAMA3_ROPE.items() if k != "rope_theta"}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CORPUS = ("Long documents are cut into blocks. The model learns from every token of every block. "
          "Context parallelism splits each sequence over ranks; the loss stays the same. ") * 8


def llama_config(rope: dict | None = LLAMA3_ROPE, tied: bool = False, **overrides):
    fields = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": tied}
    rope_parameters = {"rope_theta": 500000.0, **(rope or {"rope_type": "default"})}
    return tiny_chat.tiny_llama_config(**{**fields, **overrides, "rope_parameters": rope_parameters})


def mixtral_config(**overrides):
    """A tiny MixtralConfig (4 experts, 2 per token) with llama_config's attention shapes; an
    aux-loss weight other than MixtralConfig's default, so a dropped key shows."""
    from transformers import MixtralConfig

    fields = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 96, "vocab_size": VOCAB, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
              "num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
              "bos_token_id": 1, "eos_token_id": 2}
    return MixtralConfig(**{**fields, **overrides}, rope_parameters={"rope_theta": 1e6, "rope_type": "default"})


def save_mixtral(directory: Path, config, seed: int = 0):
    """Save a randomly initialised MixtralForCausalLM (the Hub's per-expert names, as transformers 5
    writes them); returns it (the reference, fp32, eval mode). The router and experts get a larger
    spread than initializer_range, so tokens really differ in their routing."""
    from transformers import MixtralForCausalLM

    torch.manual_seed(seed)
    model = MixtralForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(std=0.5)
    model.save_pretrained(directory)
    return model


def save_llama(directory: Path, config, *, weights: str = "safetensors", shards: int = 1,
               config_style: str = "v5", seed: int = 0):
    """Save a randomly initialised LlamaForCausalLM; returns it (the reference, fp32, eval mode)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    if weights == "safetensors":
        size = sum(p.numel() * 4 for p in model.parameters())
        model.save_pretrained(directory, max_shard_size=size // shards + 1 if shards > 1 else "50GB")
    else:  # transformers 5 writes safetensors only; a .bin is torch.save of the state dict (4.x's format)
        model.config.save_pretrained(directory)
        model.generation_config.save_pretrained(directory)
        _save_bin(model, directory, shards)
    if config_style == "v4":
        path = directory / "config.json"
        path.write_text(json.dumps(v4_config(json.loads(path.read_text())), indent=2))
    return model


# A Llama at its initialisation (std 0.02) attends almost uniformly and predicts ~log(vocab)
# whatever it sees: training across documents moved its loss by 8e-5 relative, too close to a 1e-5
# tolerance for a control. Attention and embeddings scaled by 16 make the loss depend on what is
# attended to (0.18%), so a mask that lets documents see each other fails the tests that use it.
SHARP_SCALE = 16


def save_sharp_llama(directory: Path, config):
    """save_llama, its attention projections and embeddings scaled by SHARP_SCALE; returns it."""
    model = save_llama(directory, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(part in name for part in ("q_proj", "k_proj", "v_proj", "o_proj", "embed_tokens")):
                parameter.mul_(SHARP_SCALE)
    model.save_pretrained(directory)
    return model


def _save_bin(model, directory: Path, shards: int) -> None:
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    if shards == 1:
        torch.save(state, directory / "pytorch_model.bin")
        return
    names = list(state)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[i::shards]}
        torch.save(part, directory / file)
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": sum(t.numel() * 4 for t in state.values())}, "weight_map": weight_map}
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))


def v4_config(config: dict) -> dict:
    """A transformers 5 config.json as transformers 4.x wrote it: rope_theta and rope_scaling at the
    top level (the scaling dict without rope_theta; null for default RoPE)."""
    config = dict(config)
    params = dict(config.pop("rope_parameters"))
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = None if params.get("rope_type", "default") == "default" else params
    config["transformers_version"] = "4.46.0"
    return config


def save_tokenizer(directory: Path):
    """A byte-level BPE fast tokenizer trained on CORPUS, with <pad> (0), <s> (1) and </s> (2); returns it."""
    fast = tiny_chat.bpe_tokenizer([CORPUS], VOCAB - 8, bos="<s>", eos="</s>", pad="<pad>", prepend_bos=True)
    fast.save_pretrained(directory)
    return fast


def hub_cache(cache: Path, repo_id: str, files: Path, commit: str = COMMIT) -> Path:
    """Put `files` into a huggingface_hub cache as the `main` snapshot of `repo_id`, laid out as
    huggingface_hub writes it (blobs, snapshot links, refs/main); returns the snapshot directory."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(files.iterdir()):
        blob = repo / "blobs" / f"{file.name}.blob"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("../..") / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def save_chat_tokenizer(directory: Path, template: str | None = tiny_chat.CHAT_TEMPLATE):
    """save_tokenizer's tokenizer with Llama 3's header and end-of-turn tokens (ids 312-314, inside
    llama_config's vocabulary) and `template` as its chat template (None: no template); returns it.
    The template's {% generation %} markers let transformers' return_assistant_tokens_mask say,
    independently of smlaunch, which tokens are the assistant's (the tests' reference)."""
    fast = tiny_chat.chat_tokenizer([CORPUS], VOCAB - 8, template)
    fast.save_pretrained(directory)
    return fast
