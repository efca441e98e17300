"""README's "Try chat fine-tuning offline", as a user runs it: `python -m container.data tiny-chat`
makes a chat model and conversations here (no network), `smlaunch validate` passes
configs/local/chat-tiny.yaml on them, and a short `smlaunch submit --local` of that job file
fine-tunes the model: its log counts the chat examples and the epochs, and the artifact keeps the
chat template. The functions that make the model are those the chat tests and the notebook use
(tests/support/hf_models.py, tests/integration/test_chat_finetune.py, tests/e2e/test_notebook.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest

from container.data.tiny_chat import CHAT_TEMPLATE, FACTS
from tests.support.local_jobs import cli_env, smlaunch
from tests.support.train_runs import ROOT

pytest.importorskip("transformers")
MAKE = ["-m", "container.data", "tiny-chat", "--output"]
JOB = "configs/local/chat-tiny.yaml"


def test_the_readme_commands_make_a_chat_model_that_fine_tunes_offline(tmp_path, home):
    readme = (ROOT / "README.md").read_text()
    assert "python -m container.data tiny-chat --output build/tiny-chat" in readme
    assert f"smlaunch validate {JOB}" in readme and f"smlaunch submit {JOB} --local" in readme
    output = tmp_path / "build" / "tiny-chat"
    made = subprocess.run([sys.executable, *MAKE, str(output)], cwd=ROOT, capture_output=True, text=True,
                          env=cli_env(home, HF_HUB_OFFLINE="1"), timeout=300, check=False)
    assert made.returncode == 0 and made.stderr == "", made.stderr
    assert made.stdout.splitlines() == [
        f"tiny chat model (Llama 3.1 shape, 2 layers, hidden 64; tokenizer with Llama 3's chat template): "
        f"{output / 'model'}", f"7 chat examples: {output / 'data' / 'train' / 'chat.jsonl'}"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (output / "model").iterdir()}
    lines = (output / "data" / "train" / "chat.jsonl").read_text().splitlines()
    assert len(lines) == 7 and "messages" in json.loads(lines[0]) and "completion" in json.loads(lines[-1])

    # made once: a second run names the fix and leaves the first one's files as they were (the control)
    weights = (output / "model" / "model.safetensors").read_bytes()
    again = subprocess.run([sys.executable, *MAKE, str(output)], cwd=ROOT, capture_output=True, text=True,
                           env=cli_env(home), timeout=300, check=False)
    assert again.returncode == 2 and f"--output: {output} exists; pass --overwrite" in again.stderr, again.stderr
    assert (output / "model" / "model.safetensors").read_bytes() == weights

    # the job file, its inputs and output moved under tmp_path; 4 steps of the 3 rows the 7 examples pack into
    sets = {"inputs.train": output / "data" / "train", "inputs.model": output / "model",
            "output_path": tmp_path / "artifacts", "hyperparameters.max_steps": 4,
            "hyperparameters.logging_freq": 1}
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    valid = smlaunch("validate", JOB, *args, env=cli_env(home))
    assert valid.returncode == 0, valid.stdout + valid.stderr
    run = smlaunch("submit", JOB, "--local", "--job-name", "tiny-chat-1", *args,
                   env=cli_env(home, HF_HUB_OFFLINE="1"))
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert ("data: chat examples of train, shuffled (seed 7): 7 examples in 1 file(s), tokenized with the "
            "tokenizer of input channel 'model'") in log
    assert "data: 4 step(s) of 3 rows read 12 rows: 4 epoch(s) of the 3 rows of chat examples of train" in log
    assert "tiny-chat-1 completed" in log
    artifact = tmp_path / "artifacts" / "tiny-chat-1" / "output" / "model.tar.gz"
    with tarfile.open(artifact) as tar:
        tar.extractall(tmp_path / "tuned", filter="data")
    from transformers import AutoTokenizer

    tuned = AutoTokenizer.from_pretrained(tmp_path / "tuned")
    assert tuned.chat_template == CHAT_TEMPLATE
    question = next(iter(FACTS))
    prompt = tuned.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                       tokenize=False)
    assert prompt == f"<s><|start_header_id|>user<|end_header_id|>\n\n{question}<|eot_id|>" \
                     "<|start_header_id|>assistant<|end_header_id|>\n\n"
