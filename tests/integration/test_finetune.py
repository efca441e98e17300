"""The seed's job, end to end, as a user runs it: fine-tune a pretrained Hub model (from a real
huggingface_hub cache, offline) on text packed with its own tokenizer, in local mode over two
simulated hosts of two processes (each host downloads once, by its local rank 0; only the first
fetches weights); the first loss is transformers' loss on the same batch, and the artifact loads
back in transformers with its tokenizer and generates."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch
import yaml

from container.data.packing import write_jsonl
from tests.support.hf_models import CORPUS, hub_cache, llama_config, save_llama, save_tokenizer
from tests.support.local_jobs import cli_env, smlaunch
from tests.support.train_runs import ROOT, run_train

transformers = pytest.importorskip("transformers")
SEQ = 64
REPO = "org/tiny-llama"


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> tuple[Path, Path]:
    """(cache dir, snapshot dir) of a Hub cache holding a tiny Llama 3.1-style model and its tokenizer."""
    root = tmp_path_factory.mktemp("hub")
    files = root / "files"
    save_llama(files, llama_config(), config_style="v4")
    save_tokenizer(files)
    (files / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                              "temperature": 0.6}))
    return root / "cache", hub_cache(root / "cache", REPO, files)


@pytest.fixture(scope="module")
def data(hub, tmp_path_factory) -> Path:
    """Blocks of SEQ tokens of CORPUS, tokenized with the model's tokenizer."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(hub[1])
    ids = [t for text in CORPUS.split(". ") for t in tokenizer(text)["input_ids"]]
    blocks = [ids[i:i + SEQ] for i in range(0, len(ids) - SEQ + 1, SEQ)]
    root = tmp_path_factory.mktemp("data")
    write_jsonl(blocks, root / "train" / "train.jsonl")
    return root / "train"


def _offline(cache: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def _job(path: Path, cache: Path, train: Path, out: Path, **hyperparameters) -> Path:
    hp = {"hf_pretrained_model_name_or_dir": REPO, "dataset_type": "jsonl", "max_context_width": SEQ,
          "train_batch_size": 1, "max_steps": 2, "lr": 1e-3, "warmup": 0.0, "seed": 7, "logging_freq": 1,
          **hyperparameters}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 2, "processes_per_host": 2, "output_path": str(out), "inputs": {"train": str(train)},
           "environment": _offline(cache), "hyperparameters": hp,
           "distribution": {"torch_distributed": {"enabled": True}}}
    path.write_text(yaml.safe_dump(job))
    return path


def _reference_loss(snapshot: Path, train: Path, samples: int) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(snapshot).eval()
    records = [json.loads(line) for line in (train / "train.jsonl").read_text().splitlines()[:samples]]
    ids = torch.tensor([r["input_ids"] for r in records])
    with torch.no_grad():
        return model(ids, labels=ids).loss.item()


def test_local_job_from_a_hub_id_fine_tunes_and_exports_a_usable_model(tmp_path, hub, data):
    cache, snapshot = hub
    out = tmp_path / "out"
    spec = _job(tmp_path / "job.yaml", cache, data, out)
    proc = smlaunch("submit", str(spec), env=cli_env(tmp_path / "home", **_offline(cache)))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"weights of Hub model {REPO} (commit 0123456789abcdef" in proc.stdout  # the log names the source

    (archive,) = out.glob("*/output/output.tar.gz")
    with tarfile.open(archive) as tar:
        metrics = [json.loads(line) for line in tar.extractfile("metrics.jsonl").read().decode().splitlines()]
    # 2 hosts x 2 processes, train_batch_size 1 each: the first step sees records 0..3
    assert metrics[0]["loss"] == pytest.approx(_reference_loss(snapshot, data, 4), rel=1e-5)

    with tarfile.open(archive.parent / "model.tar.gz") as tar:
        tar.extractall(tmp_path / "model", filter="data")
    model_dir = tmp_path / "model"
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in model_dir.iterdir()}
    tuned = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    original = transformers.AutoTokenizer.from_pretrained(snapshot)
    assert tokenizer("The model learns")["input_ids"] == original("The model learns")["input_ids"]
    assert json.loads((model_dir / "generation_config.json").read_text())["temperature"] == 0.6
    assert tuned.config.rope_parameters["rope_type"] == "llama3" and tuned.config.rope_parameters["rope_theta"] == 5e5
    prompt = tokenizer("Long documents", return_tensors="pt")
    generated = tuned.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 5
    assert isinstance(tokenizer.decode(generated[0]), str)


def test_client_refuses_a_hub_id_it_cannot_find(tmp_path, hub, data):
    cache, _ = hub
    spec = _job(tmp_path / "job.yaml", cache, data, tmp_path / "out", hf_pretrained_model_name_or_dir="org/absent")
    proc = smlaunch("validate", str(spec), env=cli_env(tmp_path / "home", **_offline(cache)))
    assert proc.returncode == 2
    assert "hyperparameters.hf_pretrained_model_name_or_dir = \"org/absent\": Hugging Face model org/absent " \
           "is not in the Hugging Face cache" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_container_fails_before_training_naming_the_model(tmp_path, hub, monkeypatch):
    """A job built by hand (no client validation) fails in train.py before any step."""
    cache, _ = hub
    for key, value in _offline(cache).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(AssertionError) as err:
        run_train(tmp_path, 2, model_preset="", hf_pretrained_model_name_or_dir="org/absent")
    text = str(err.value)
    assert "PretrainedError: hyperparameters.hf_pretrained_model_name_or_dir = 'org/absent'" in text
    assert "not in the Hugging Face cache" in text and not (tmp_path / "out" / "metrics.jsonl").exists()


def test_seed_style_model_hyperparameters_validate_plan_and_train(tmp_path):
    """model_type llama_v3 with the seed's size keys: the client and the runtime build the same model."""
    sizes = {"model_type": "llama_v3", "hidden_width": 64, "num_layers": 2, "num_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 176, "vocab_size": 256}
    job = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "processes_per_host": 2, "hyperparameters": {**sizes, "dataset_type": "synthetic", "max_context_width": 64}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    env = cli_env(tmp_path / "home")
    validated = smlaunch("validate", str(path), "--json", env=env)
    assert validated.returncode == 0, validated.stderr
    assert json.loads(validated.stdout)["summary"]["model"] == "llama_v3 (2 layers x 64)"
    planned = smlaunch("plan", str(path), "--json", env=env)
    assert planned.returncode == 0 and json.loads(planned.stdout)[0]["valid"], planned.stdout + planned.stderr
    run_train(tmp_path / "run", 2, model_preset="", max_steps=2, **sizes)
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["num_key_value_heads"], config["intermediate_size"],
            config["rope_theta"], config["max_position_embeddings"]) == (64, 2, 176, 500000.0, 64)


@pytest.mark.parametrize("layout", ["tensor_parallel_degree=2", "context_parallel_degree=2"], ids=["tp2", "cp2"])
def test_pretrained_weights_reach_every_shard_of_a_parallel_layout(tmp_path, layout):
    """Rank 0 reads, every rank gets its tensor-parallel or context-parallel part: the first loss
    is still transformers' loss on the step's samples."""
    from container.data.loader import SyntheticSource

    reference = save_llama(tmp_path / "m", llama_config(), weights="bin", shards=2)
    records = run_train(tmp_path / "run", 2, model_preset="", hf_pretrained_model_name_or_dir=str(tmp_path / "m"),
                        max_steps=1, mp_parameters=layout)
    # run_train's seed and batch
    ids = SyntheticSource(SEQ, reference.config.vocab_size, seed=7).read(0, 4)["input_ids"]
    with torch.no_grad():
        expected = reference(ids, labels=ids).loss.item()
    assert records[0]["loss"] == pytest.approx(expected, rel=1e-5)
