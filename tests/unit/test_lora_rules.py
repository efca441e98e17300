"""LoRA as a job asks for it (launcher/wire/training/lora.py, issue 52 section 1): TRL's names typed
on the contract, what peft would refuse refused with the field, the value and the fix, what the
runtime's adapters do not compose with yet refused by name, and the trainable share validate prints,
counted as peft's print_trainable_parameters counts it."""

from __future__ import annotations

import hashlib

import pytest

from launcher.config import validate_job
from launcher.wire.training.hf_config import spec_from_hf_config
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.lora import describe, lora_settings, model_lora_issues, trainable_parameters
from launcher.wire.training.models import PRESETS
from tests.support.config_checks import MP, issues_of, only_issue, paths
from tests.support.hf_models import llama_config
from tests.support.peft_reference import lora_model
from tests.unit.test_config_rules import make_job

LORA = {"use_peft": 1}


def test_trl_names_are_typed_and_a_list_arrives_as_the_toolkit_writes_it():
    for text in ("q_proj,v_proj", '["q_proj", "v_proj"]', "['q_proj', 'v_proj']"):
        hp = TrainingHyperparameters.model_validate({"use_peft": "true", "lora_r": "8", "lora_target_modules": text})
        assert (hp.use_peft, hp.lora_r, hp.lora_target_modules) == (True, 8, ["q_proj", "v_proj"])
    assert TrainingHyperparameters.model_validate({"lora_target_modules": "all-linear"}).lora_target_modules == (
        "all-linear")


@pytest.mark.parametrize(("hp", "path", "words"), [
    ({"lora_r": 0}, "lora_r", "peft refuses r <= 0"),
    ({"lora_r": -4}, "lora_r", "peft refuses r <= 0"),
    ({"lora_alpha": 0}, "lora_alpha", "alpha must be above 0"),
    ({"lora_dropout": 1.0}, "lora_dropout", "from 0 to below 1"),
    ({"lora_dropout": -0.1}, "lora_dropout", "from 0 to below 1"),
    ({"lora_target_modules": "q_proj,qproj"}, "lora_target_modules", "no linear layer of this name"),
    ({"lora_target_modules": "lm_head"}, "lora_target_modules", "not yet"),
    ({"use_dora": 1}, "use_dora", "DoRA is not implemented"),
    ({"load_in_4bit": 1, "delayed_param": 1}, "delayed_param", "with load_in_4bit (QLoRA) not yet"),
    ({"compile": 1}, "lora_dropout", "inductor draws a compiled block's dropout masks"),  # peft's default 0.05
    ({"fp8": 1}, "fp8", "does not compose"),
    ({"lora_modules_to_save": "norm"}, "lora_modules_to_save", "not a module"),
])
def test_what_peft_or_the_runtime_would_refuse_is_refused_by_name(runtime_dir, hp, path, words):
    job = make_job(runtime_dir, hp={**LORA, **hp})
    issue = only_issue(job, f"hyperparameters.{path}")[0]
    assert words in issue.problem
    assert paths(make_job(runtime_dir, hp=LORA)) == []  # control: the same job with peft's defaults


def test_tensor_parallelism_takes_adapters_without_dropout_or_an_nf4_base(runtime_dir):
    params = {"tensor_parallel_degree": 8, "hybrid_shard_degree": 1}
    undropped = {**LORA, "lora_dropout": 0}
    assert paths(make_job(runtime_dir, hp=undropped, params=params)) == []
    for hp, value in ((LORA, 0.05), ({**LORA, "lora_dropout": 0.1}, 0.1)):  # peft's default 0.05 too
        [issue] = only_issue(make_job(runtime_dir, hp=hp, params=params), "hyperparameters.lora_dropout")
        assert (issue.value, issue.fix) == (value, "set lora_dropout: 0") and "own dropout masks" in issue.problem
    assert paths(make_job(runtime_dir, hp=LORA)) == []  # control: dropout without tensor parallelism
    qlora = make_job(runtime_dir, hp={**undropped, "load_in_4bit": 1}, params=params)
    assert "does not split the NF4 base" in only_issue(qlora, f"{MP}.tensor_parallel_degree")[0].problem
    assert f"{MP}.tensor_parallel_degree" not in paths(make_job(runtime_dir, hp={**undropped, "load_in_4bit": 1}))


def test_compile_takes_adapters_without_dropout(runtime_dir):
    assert paths(make_job(runtime_dir, hp={**LORA, "compile": 1, "lora_dropout": 0})) == []
    assert paths(make_job(runtime_dir, hp={**LORA, "compile": 1, "lora_dropout": 0, "load_in_4bit": 1})) == []
    [issue] = only_issue(make_job(runtime_dir, hp={**LORA, "compile": 1, "lora_dropout": 0.1}),
                         "hyperparameters.lora_dropout")
    assert issue.problem == ("dropout does not compose with hyperparameters.compile yet: inductor draws a compiled "
                             "block's dropout masks from its own generator, not eager torch's")
    assert issue.fix == "set lora_dropout: 0"
    tp = {"tensor_parallel_degree": 8, "hybrid_shard_degree": 1}
    both = make_job(runtime_dir, hp={**LORA, "compile": 1}, params=tp)
    [issue] = only_issue(both, "hyperparameters.lora_dropout")  # one issue for the field, both reasons in it
    assert "own dropout masks for the input the ranks share, nor with hyperparameters.compile yet" in issue.problem


def test_qlora_is_accepted_with_adapters_and_refused_without(runtime_dir):
    assert paths(make_job(runtime_dir, hp={**LORA, "load_in_4bit": 1, "merge_weights": 1})) == []
    issue = only_issue(make_job(runtime_dir, hp={"load_in_4bit": 1}), "hyperparameters.load_in_4bit")[0]
    assert "needs use_peft" in issue.problem and "use_peft: 1" in issue.fix


def test_qlora_refuses_a_model_whose_layers_torchao_cannot_quantize_whole():
    """llama3-tiny's q_proj is 64 x 64 = 4,096 weights: not whole blocks of 64 x 256; Llama 3.1 8B's are."""
    hp = TrainingHyperparameters(use_peft=True, load_in_4bit=True)
    [issue] = model_lora_issues(hp, PRESETS["llama3-tiny"])
    assert issue.path == "hyperparameters.load_in_4bit" and "q_proj 64x64" in issue.problem
    assert model_lora_issues(hp, PRESETS["llama3.1-8b"]) == []  # control
    assert model_lora_issues(TrainingHyperparameters(use_peft=True), PRESETS["llama3-tiny"]) == []


def test_qlora_refuses_fsdp_shards_that_would_split_a_block_of_scales(runtime_dir):
    """Llama 3.1 8B's k_proj, 1024 x 4096 = 256 blocks of 64 x 256: 512 ranks in one sharding group
    would cut it into half-blocks; 8 (hybrid_shard_degree) would not."""
    hp = {**LORA, "load_in_4bit": 1}
    job = make_job(runtime_dir, hp=hp, instance_count=64, params={"hybrid_shard_degree": 512})
    [issue] = only_issue(job, "hyperparameters.load_in_4bit")
    assert "k_proj 1024x4096, v_proj 1024x4096 weights cut into 512 FSDP shards" in issue.problem
    assert "hybrid_shard_degree" in issue.fix
    assert paths(make_job(runtime_dir, hp=hp, instance_count=64, params={"hybrid_shard_degree": 8})) == []


def test_validate_shows_the_nf4_base_beside_the_trainable_share():
    spec = PRESETS["llama3.1-8b"]
    lora = lora_settings(TrainingHyperparameters(use_peft=True, load_in_4bit=True, lora_target_modules="all-linear"),
                         spec)
    assert describe(spec, lora) == ("LoRA r 16, alpha 32 on 7 module kinds x 32 layers: 41.9M trainable of 8.07B, "
                                    "0.52%; base NF4, block 64 (scales int8, block 256)")


def test_qlora_without_torchao_exits_2_naming_the_extra(monkeypatch, caplog):
    from container.models import qlora
    from container.trainer import refuse_unimplemented

    def missing(name):
        raise ImportError(f"No module named {name!r}")

    hp = TrainingHyperparameters(use_peft=True, load_in_4bit=True)
    refuse_unimplemented(hp)  # the control: torchao is installed here
    monkeypatch.setattr(qlora, "torchao_module", missing)
    with pytest.raises(SystemExit) as exited:
        refuse_unimplemented(hp)
    assert exited.value.code == 2 and "pip install 'smlaunch[qlora]'" in caplog.text
    refuse_unimplemented(TrainingHyperparameters(use_peft=True))  # plain LoRA does not need it


def test_a_lora_setting_without_use_peft_is_said_to_do_nothing(runtime_dir):
    warning = only_issue(make_job(runtime_dir, hp={"lora_r": 8}), "hyperparameters.lora_r", level="warning")[0]
    assert "the whole model trains" in warning.problem and "use_peft: 1" in warning.fix
    assert issues_of(make_job(runtime_dir, hp={**LORA, "lora_r": 8}), level="warning") == []


def test_a_users_script_reads_its_own_lora_names(user_script_dir):
    job = make_job(user_script_dir, hp={**LORA, "lora_r": 0, "lora_target_modules": "anything"},
                   image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1")
    assert not [p for p in paths(job) if "lora" in p]


def test_validate_counts_llama_8b_all_linear_by_hand():
    """Llama 3.1 8B, r 16 on all seven kinds: per layer 16 x ((4096 + 4096) x 2 (q, o) + (4096 + 1024) x 2 (k, v)
    + (4096 + 14336) x 3 (gate, up, down)) = 1,310,720; x 32 layers = 41,943,040 of 8,030,261,248 + that."""
    spec = PRESETS["llama3.1-8b"]
    lora = lora_settings(TrainingHyperparameters(use_peft=True, lora_target_modules="all-linear"), spec)
    assert trainable_parameters(spec, lora) == (41_943_040, 8_030_261_248 + 41_943_040)
    assert describe(spec, lora) == "LoRA r 16, alpha 32 on 7 module kinds x 32 layers: 41.9M trainable of 8.07B, 0.52%"


@pytest.mark.parametrize("hp", [
    {"lora_target_modules": "all-linear", "lora_r": 8},
    {},  # peft's default targets for a Llama: q_proj, v_proj
    {"lora_target_modules": ["k_proj", "down_proj"], "lora_r": 4, "lora_modules_to_save": ["lm_head"]},
])
def test_the_trainable_share_is_peft_s(hp):
    from transformers import LlamaForCausalLM

    config = llama_config()
    spec = spec_from_hf_config(config.to_dict(), "tiny")
    lora = lora_settings(TrainingHyperparameters(use_peft=True, **hp), spec)
    reference = lora_model(LlamaForCausalLM(config), r=lora.r, lora_alpha=lora.alpha,
                           target_modules=hp.get("lora_target_modules"), modules_to_save=hp.get("lora_modules_to_save"))
    assert trainable_parameters(spec, lora) == reference.get_nb_trainable_parameters()


def test_a_resume_keeps_the_adapters_the_checkpoint_holds():
    from launcher.wire.training.resume import RunIdentity
    from launcher.wire.training.run_settings import run_settings

    spec = PRESETS["llama3-tiny"]
    settings = run_settings(TrainingHyperparameters(), None, 1)

    def identity(**hp):
        lora = lora_settings(TrainingHyperparameters(**hp), spec)
        return RunIdentity(settings, spec, 1, adapters=lora)

    saved = identity(use_peft=True, lora_r=8).record()
    assert saved["adapters"] == "r 8, alpha 32 on q_proj,v_proj"
    assert identity(use_peft=True, lora_r=8, lora_dropout=0.2, merge_weights=True).conflicts(saved) == []  # control
    for other in ({"use_peft": True, "lora_r": 16}, {}, {"use_peft": True, "lora_r": 8, "load_in_4bit": True}):
        [line] = identity(**other).conflicts(saved)
        assert line.startswith("LoRA adapters (use_peft, lora_r,") and "train the adapters the checkpoint" in line


def test_a_resume_keeps_the_base_the_adapters_were_trained_on(tmp_path):
    from container.checkpoint.pretrained import Located, Sources, base_identity
    from launcher.wire.training.model_source import parse_model_source
    from launcher.wire.training.resume import RunIdentity
    from launcher.wire.training.run_settings import run_settings

    spec = PRESETS["llama3-tiny"]
    settings = run_settings(TrainingHyperparameters(), None, 1)
    lora = lora_settings(TrainingHyperparameters(use_peft=True), spec)

    def identity(directory, load_weights=True):
        located = Located(parse_model_source(str(directory)), directory)
        base = base_identity(Sources(located, None, load_weights), rank=0, seed=7)
        return RunIdentity(settings, spec, 1, adapters=lora, base=base)

    for name in ("a", "moved", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"weights of b" if name == "b" else b"weights of a")
    saved = identity(tmp_path / "a").record()
    assert saved["base"]["weights_sha256"] == hashlib.sha256(
        b"model.safetensors" + hashlib.sha256(b"weights of a").digest()).hexdigest()
    assert identity(tmp_path / "moved").conflicts(saved) == []  # control: the same weights elsewhere
    for other in (identity(tmp_path / "b"), identity(tmp_path / "a", load_weights=False)):
        [line] = other.conflicts(saved)
        assert line.startswith(f"base model (hf_pretrained_model_name_or_dir and its weights) was directory "
                               f"{tmp_path / 'a'}, weights sha256 {saved['base']['weights_sha256'][:16]}...")
        assert "resume on the base the checkpoint was trained on" in line
    assert "random weights (seed 7)" in line
    assert RunIdentity(settings, spec, 1, adapters=lora).conflicts(saved) == []  # not recorded: not compared


def test_the_plan_says_what_it_models_of_a_lora_job(runtime_dir):
    from launcher.plan.workload import modeled_program

    said = modeled_program(validate_job(make_job(runtime_dir, hp=LORA)))
    assert "the frozen base without gradients or optimizer state" in said and "not modelled yet" in said
    assert "use_peft" not in modeled_program(validate_job(make_job(runtime_dir)))
    assert "load_in_4bit" not in said
    qlora = validate_job(make_job(runtime_dir, hp={**LORA, "load_in_4bit": 1}))
    assert "linear weights in NF4" in modeled_program(qlora)


def test_the_runtime_refuses_what_validation_refuses():
    from container.args import parse_args
    from container.trainer import adapters, refuse_unimplemented
    from launcher.wire.training.degrees import ModelParallelParameters

    hp = parse_args(["--use_peft", "1", "--lora_target_modules", "['q_proj', 'qproj']"])[0]  # as the toolkit passes
    refuse_unimplemented(hp)  # the control: its degrees are all 1
    refuse_unimplemented(hp, ModelParallelParameters(context_parallel_degree=2))  # cp takes adapters (and dropout)
    with pytest.raises(ValueError, match="pipeline_parallel_degree = 2: with use_peft"):
        refuse_unimplemented(hp, ModelParallelParameters(pipeline_parallel_degree=2))
    with pytest.raises(ValueError, match='lora_target_modules = "qproj": llama3-tiny has no linear layer'):
        adapters(hp, PRESETS["llama3-tiny"])


def test_a_sweep_tunes_lora_s_rank_and_alpha_and_every_trial_is_checked(runtime_dir):
    def sweep(r_range):
        return make_job(runtime_dir, hp=LORA, tuning={
            "objective": {"metric": "train:loss", "type": "Minimize"}, "strategy": "Random", "max_jobs": 4,
            "max_parallel_jobs": 2, "ranges": {"lora_r": {"kind": "integer", **r_range},
                                               "lora_alpha": {"kind": "categorical", "values": ["8", "64"]}}})

    assert paths(sweep({"min_value": 4, "max_value": 64})) == []
    assert "tuning.ranges.lora_r" in paths(sweep({"min_value": 0, "max_value": 64}))  # a trial of r 0


def test_a_mixture_of_experts_takes_adapters_on_its_attention_only():
    """Mixtral: peft's default (q_proj, v_proj) and any attention projections train; the router, the experts and
    all-linear (which means them too to peft) are refused by name, and so is an NF4 base."""
    spec = PRESETS["mixtral-8x7b"]
    for targets in (None, ["q_proj", "k_proj", "v_proj", "o_proj"]):  # the control
        hp = TrainingHyperparameters(use_peft=True, lora_target_modules=targets)
        assert model_lora_issues(hp, spec) == []
    assert lora_settings(TrainingHyperparameters(use_peft=True), spec).targets == ("q_proj", "v_proj")
    for name in ("all-linear", "gate", "w1", "experts"):
        targets = name if name == "all-linear" else ["q_proj", name]
        [issue] = model_lora_issues(TrainingHyperparameters(use_peft=True, lora_target_modules=targets), spec)
        assert (issue.path, issue.value) == ("hyperparameters.lora_target_modules", name)
        assert "mixture of experts" in issue.problem
        assert issue.fix == "name attention projections: q_proj,k_proj,v_proj,o_proj"
    [issue] = model_lora_issues(TrainingHyperparameters(use_peft=True, load_in_4bit=True), spec)
    assert issue.path == "hyperparameters.load_in_4bit" and "stacked parameters" in issue.problem
    [issue] = model_lora_issues(TrainingHyperparameters(use_peft=True, lora_target_modules=["gate_proj"]), spec)
    assert issue.problem == "mixtral-8x7b has no linear layer of this name"  # a dense model's MLP
