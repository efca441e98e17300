"""A tiny chat model and a few conversations, made on this machine with no network, to try chat
fine-tuning (`dataset_type: chat`) on a laptop: `python -m container.data tiny-chat --output DIR`.

DIR/model is what `save_pretrained` writes for a chat model (config.json, safetensors weights,
tokenizer.json, tokenizer_config.json and the chat template), so a job takes it as any Hugging
Face model (`hf_pretrained_model_name_or_dir`); DIR/data/train/chat.jsonl holds the conversations.
The model is a randomly initialised 2-layer Llama 3.1 (RoPE base 500000, `llama3` scaling), the
tokenizer a byte-level BPE trained on the conversations, with Llama 3's chat template and header
tokens. README.md ("Try chat fine-tuning offline") runs configs/local/chat-tiny.yaml on it.

The walkthrough notebook and the tests make their tiny models and tokenizers with the same
functions (`bpe_tokenizer`, `chat_tokenizer`, `tiny_llama_config`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

# Llama 3's chat template's shape: `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>`
# per turn after the BOS, the assistant header as the generation prompt. The {% generation %}
# markers render nothing; they let transformers' return_assistant_tokens_mask say which tokens
# are the assistant's.
CHAT_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|eot_id|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
# Llama 3.1's RoPE scaling, with an original context small enough that short rows feel it.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
TINY_LLAMA = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 176, "max_position_embeddings": 512, "rms_norm_eps": 1e-5}
VOCAB = 312  # the BPE's 256 byte symbols, its special tokens and merges; the chat tokens come after

SYSTEM = {"role": "system", "content": "Answer in one word."}
FACTS = {"What colour is the sky?": "Blue.", "What colour is grass?": "Green.", "What is 2 + 2?": "Four.",
         "Who wrote Hamlet?": "Shakespeare.", "What is the capital of France?": "Paris.",
         "How many legs has a spider?": "Eight."}


def chat_examples() -> list[dict]:
    """A conversation per fact (system, user, assistant), and one prompt-completion example (TRL's shape)."""
    examples = [{"messages": [SYSTEM, {"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                for q, a in FACTS.items()]
    examples.append({"prompt": [{"role": "user", "content": "Say hello."}],
                     "completion": [{"role": "assistant", "content": "Hello."}]})
    return examples


def bpe_tokenizer(texts: Iterable[str], vocab_size: int, bos: str, eos: str, pad: str | None = None,
                  prepend_bos: bool = False):
    """A byte-level BPE fast tokenizer trained on `texts`, its special tokens first (pad, bos, eos:
    ids 0, 1, 2; without pad, bos and eos are 0 and 1); `prepend_bos` puts the BOS before every
    encoded text, as Llama's tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [token for token in (pad, bos, eos) if token is not None]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    if prepend_bos:
        bpe.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                           special_tokens=[(bos, bpe.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=bos, eos_token=eos, pad_token=pad)


def chat_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB, template: str | None = CHAT_TEMPLATE):
    """bpe_tokenizer with `<pad>`, `<s>` and `</s>` (ids 0-2), Llama 3's header and end-of-turn tokens
    (ids vocab_size to vocab_size + 2) and `template` as its chat template (None: none)."""
    tokenizer = bpe_tokenizer(texts, vocab_size, bos="<s>", eos="</s>", pad="<pad>", prepend_bos=True)
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHAT_TOKENS)})
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def tiny_llama_config(**fields):
    """A LlamaConfig of TINY_LLAMA's shapes with Llama 3.1's RoPE, `fields` over them (vocab_size and
    the token ids, at least)."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA, "rope_parameters": LLAMA3_ROPE, **fields})


def _texts(examples: list[dict]) -> list[str]:
    """What the tokenizer learns its merges from: every turn's words and role."""
    turns = [turn for e in examples for turn in e.get("messages", []) + e.get("prompt", []) + e.get("completion", [])]
    return [f"{turn['role']} {turn['content']}" for turn in turns]


def write_tiny_chat(output: Path, overwrite: bool = False, seed: int = 0) -> tuple[Path, Path]:
    """Write the model (with its chat tokenizer) to output/model and the conversations to
    output/data/train/chat.jsonl; returns (model directory, train channel). An `output` that
    exists is replaced with `overwrite`, else FileExistsError."""
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} exists; pass --overwrite to replace it")
    import torch
    from transformers import LlamaForCausalLM

    examples = chat_examples()
    tokenizer = chat_tokenizer(_texts(examples))
    # generate() stops at the end of a turn as at the end of a text, as Llama 3.1 Instruct's config says
    end_of_turn = tokenizer.convert_tokens_to_ids(CHAT_TOKENS[2])
    config = tiny_llama_config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                               eos_token_id=[tokenizer.eos_token_id, end_of_turn], pad_token_id=tokenizer.pad_token_id)
    output.parent.mkdir(parents=True, exist_ok=True)
    # made beside `output` and renamed once whole: an error or an interrupt leaves no half-made model
    work = output.parent / f".{output.name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(work / "model")  # makes work/ too
        tokenizer.save_pretrained(work / "model")
        channel = work / "data" / "train"
        channel.mkdir(parents=True)
        (channel / "chat.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
        if output.is_dir():
            shutil.rmtree(output)
        elif output.exists():
            output.unlink()
        work.rename(output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return output / "model", output / "data" / "train"


def main(argv: Sequence[str] | None = None, prog: str = "python -m container.data.tiny_chat") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, type=Path,
                        help="directory to create: OUTPUT/model and OUTPUT/data/train/chat.jsonl")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    args = parser.parse_args(argv)
    from transformers.utils import logging  # after the arguments: --help needs no transformers

    logging.disable_progress_bar()  # one file of half a megabyte: a progress bar says nothing
    try:
        model, channel = write_tiny_chat(args.output, overwrite=args.overwrite)
    except OSError as exc:  # it exists, or its parent cannot be written: nothing is left behind
        reason = exc if exc.errno is None else f"cannot write {args.output}: {exc.strerror}"
        print(f"{prog}: error: --output: {reason}", file=sys.stderr)
        return 2
    print(f"tiny chat model (Llama 3.1 shape, {TINY_LLAMA['num_hidden_layers']} layers, hidden "
          f"{TINY_LLAMA['hidden_size']}; tokenizer with Llama 3's chat template): {model}")
    print(f"{len(chat_examples())} chat examples: {channel / 'chat.jsonl'}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
