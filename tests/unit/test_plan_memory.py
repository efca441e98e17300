"""The planner's memory model: the seed's runs, terms derived by hand, and monotone properties.

Expectations come from arithmetic on the model's shapes, not from running the planner.
Here the tests that run in one process; those that start processes are tests/integration/test_plan_memory.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.config import ConfigError, validate_job
from launcher.config.jobfile import validate_job_file
from launcher.plan import estimate_memory, explain_oom
from launcher.plan.memory import GIB, SAFETY_MARGIN, estimate_workload
from launcher.plan.workload import PlanError, workload_of
from launcher.wire.training.layout import ParallelLayout
from launcher.wire.training.models import PRESETS
from tests.support.plan_memory import ROOT, SEED, WHOLE_LOGITS, seed, workload

SPEC_8B = PRESETS["llama3.1-8b"]


def params_8b() -> int:
    s = SPEC_8B
    h, d = s.hidden_size, s.head_dim
    block = 2 * h * s.num_heads * d + 2 * h * s.num_kv_heads * d + 3 * h * s.intermediate_size + 2 * h
    return s.num_layers * block + 2 * s.vocab_size * h + h  # untied embedding and head, final norm


def test_seed_p4d_without_cp_is_predicted_oom_by_its_logits():
    est = estimate_memory(seed("p4d-no-cp", WHOLE_LOGITS))
    assert est.fits is False and est.oom
    assert est.capacity_gib == 40  # A100 40GB
    assert est.peak_gib > est.capacity_gib * (1 - SAFETY_MARGIN)
    # "Tried to allocate 7.83 GiB": one sequence's fp32 logits
    assert "logits" in est.largest_allocation.name
    assert est.largest_allocation.gib == pytest.approx(16384 * 128256 * 4 / 2**30, abs=0.01)
    assert round(est.largest_allocation.gib, 2) == 7.83
    assert est.dominant.key == "logits"
    assert est.peak_phase == "loss"


def test_seed_p4d_without_cp_fits_with_the_chunked_loss():
    """One 2,048-token chunk's fp32 logits and gradients, and the bf16 gradient of the whole
    sequence's hidden states, instead of the whole sequence's logits."""
    est = estimate_memory(seed("p4d-no-cp"))
    assert est.fits is True and not est.advice
    assert est.gib("logits") == pytest.approx((12 * 2048 * 128256 + 2 * 16384 * 4096) / GIB, rel=1e-9)
    assert est.largest_allocation.name != "fp32 logits"  # 4 x 2048 x 128256 B = 0.98 GiB is not the largest
    assert estimate_memory(seed("p4d-no-cp", WHOLE_LOGITS)).gib("logits") == pytest.approx(
        12 * 16384 * 128256 / GIB, rel=1e-9)


def test_a_micro_batch_within_one_chunk_is_not_chunked():
    w = workload_of(seed("p4d-no-cp"))
    assert estimate_workload(replace(w, loss_chunk_tokens=16384)).gib("logits") == pytest.approx(
        12 * 16384 * 128256 / GIB, rel=1e-9)
    assert estimate_workload(replace(w, loss_chunk_tokens=4096)).gib("logits") == pytest.approx(
        (12 * 4096 * 128256 + 2 * 16384 * 4096) / GIB, rel=1e-9)


def test_seed_p4d_advice_names_context_parallelism_and_it_fits():
    job = seed("p4d-no-cp", WHOLE_LOGITS)
    est = estimate_memory(job)
    assert est.advice, "an OOM comes with advice"
    cp_fixes = [f for f in est.advice if f.overrides[0].startswith("context_parallel_degree=")]
    assert cp_fixes and cp_fixes[0].fits
    # the advised setting, applied the way `--set` applies it, really does fit
    fixed = validate_job_file(SEED / "p4d-no-cp.yaml", [WHOLE_LOGITS, *cp_fixes[0].overrides])
    assert estimate_memory(fixed).fits
    text = explain_oom(est)
    assert "context_parallel_degree=" in text and "7.83 GiB" in text and "logits" in text


@pytest.mark.parametrize("name", ["p4d-cp8", "p5-cp8-bf16", "p5-cp8-fp8"])
def test_seed_runs_that_completed_are_predicted_to_fit(name):
    est = estimate_memory(seed(name))
    assert est.fits is True and not est.advice
    assert est.peak_gib <= est.capacity_gib * (1 - SAFETY_MARGIN)


def test_state_terms_by_hand():
    """fp32 parameters, fp32 gradients and AdamW's two fp32 moments, over 8 shards."""
    est = estimate_memory(seed("p4d-no-cp"))
    n = params_8b()
    assert est.gib("parameters") == pytest.approx(4 * n / 8 / GIB, rel=1e-9)
    assert est.gib("gradients") == pytest.approx(4 * n / 8 / GIB, rel=1e-9)
    assert est.gib("optimizer") == pytest.approx(8 * n / 8 / GIB, rel=1e-9)


def test_logits_and_checkpointed_activations_by_hand():
    """12 B per token per vocabulary entry (kept log-probs, their gradient, the logits' gradient)
    for the tokens of one 2,048-token loss chunk, plus the 2 B hidden-state gradient of every token
    when chunked; full checkpointing keeps one bf16 hidden state per token per layer."""
    for name, tokens in (("p4d-no-cp", 16384), ("p4d-cp8", 16384 // 8), ("p5-cp8-bf16", 4 * 16384 // 8)):
        est = estimate_memory(seed(name))
        chunked = 12 * 2048 * 128256 + 2 * tokens * 4096 if tokens > 2048 else 12 * tokens * 128256
        assert est.gib("logits") == pytest.approx(chunked / GIB, rel=1e-9)
        assert estimate_memory(seed(name, WHOLE_LOGITS)).gib("logits") == pytest.approx(
            12 * tokens * 128256 / GIB, rel=1e-9)
        assert est.gib("activations") == pytest.approx(32 * tokens * 2 * 4096 / GIB, rel=1e-9)


def test_anyprecision_optimizer_keeps_six_bytes_per_parameter():
    job = validate_job_file(SEED / "p4d-cp8.yaml", ["hyperparameters.optimizer=anyprecision"])
    assert estimate_memory(job).gib("optimizer") == pytest.approx(6 * params_8b() / 8 / GIB, rel=1e-9)


def test_eager_init_builds_the_whole_fp32_model():
    w = workload_of(seed("p4d-cp8"))
    assert estimate_workload(w).term("init_model") is None  # the seed uses delayed init
    eager = estimate_workload(replace(w, delayed_init=False))
    assert eager.gib("init_model") == pytest.approx(4 * params_8b() / GIB, rel=1e-9)
    assert eager.phases["init"] > estimate_workload(w).phases["init"]


def test_tensor_parallelism_splits_the_vocabulary():
    """Each rank holds V/2 of the logits, but torch's loss_parallel backward holds five fp32
    tensors of them at its peak (20 B per local logit, tests/integration/test_plan_memory_trace.py), where
    the plain cross-entropy holds three (12 B)."""
    w = workload_of(seed("p4d-no-cp", WHOLE_LOGITS))
    tp2 = replace(w, layout=ParallelLayout(world=8, dp_replicate=1, dp_shard=4, cp=1, tp=2))
    assert estimate_workload(w).gib("logits") == pytest.approx(12 * 16384 * 128256 / GIB, rel=1e-9)
    assert estimate_workload(tp2).gib("logits") == pytest.approx(20 * 16384 * 128256 / 2 / GIB, rel=1e-9)
    assert estimate_workload(tp2).largest_allocation.gib == pytest.approx(16384 * 128256 * 4 / 2 / GIB)
    # chunked: each rank's chunk logits are split; the gathered hidden states' gradient is not
    chunked = replace(tp2, loss_chunk_tokens=2048)
    assert estimate_workload(chunked).gib("logits") == pytest.approx(
        (20 * 2048 * 128256 / 2 + 2 * 16384 * 4096) / GIB, rel=1e-9)


def test_a_vocabulary_tensor_parallelism_pads_is_planned_with_its_padded_rows():
    """smlaunch's runtime pads a vocabulary tp does not split to lcm(128, tp) rows (50,257 -> 50,304
    at tp 2: launcher.wire.training.models.vocab_rows): its job plans exactly as one that declares 50,304;
    at tp 1 nothing is padded, and 50,257 plans as itself (the control)."""
    shape = ["hyperparameters.hf_pretrained_model_name_or_dir=null", "hyperparameters.model_type=llama_v3",
             "hyperparameters.hidden_width=2048", "hyperparameters.num_layers=4", "hyperparameters.num_heads=16",
             "hyperparameters.num_heads_kv=8", "hyperparameters.intermediate_size=8192"]

    def planned(vocab: int, tp: int):
        w = workload_of(seed("p4d-no-cp", *shape, f"hyperparameters.vocab_size={vocab}",
                             f"tensor_parallel_degree={tp}", f"hybrid_shard_degree={8 // tp}"))
        return w.spec.vocab_size, estimate_workload(w).to_dict()

    assert planned(50257, 2) == planned(50304, 2) and planned(50257, 2)[0] == 50304
    assert planned(50257, 1)[0] == 50257 and planned(50257, 1)[1] != planned(50304, 1)[1]


def test_offload_keeps_only_the_loading_horizon_on_the_gpu():
    w = workload_of(seed("p4d-no-cp"))
    offloaded = replace(w, offload=True, offload_horizon=2)
    per_layer = 16384 * 2 * 4096 / GIB
    assert estimate_workload(offloaded).gib("activations") == pytest.approx(3 * per_layer)
    assert estimate_workload(w).gib("activations") == pytest.approx(32 * per_layer)


def test_capacity_unknown_for_local_jobs():
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "hyperparameters": {"model_preset": "llama3-tiny", "max_context_width": 256}})
    est = estimate_memory(job)
    assert est.capacity_gib is None and est.fits is None and not est.oom and est.peak_gib > 0


def test_unknown_model_is_invalid_for_smlaunchs_train_py():
    with pytest.raises(ConfigError, match="hyperparameters.model_preset = null: smlaunch's train.py cannot tell"):
        validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                      "instance_type": "ml.p5.48xlarge", "hyperparameters": {"bf16": 1}})


def test_unknown_model_of_an_own_script_cannot_be_planned(tmp_path):
    (tmp_path / "train.py").write_text("print('my own loop')\n")
    job = validate_job({"entry_point": "train.py", "source_dir": str(tmp_path),
                        "instance_type": "ml.p5.48xlarge", "hyperparameters": {"bf16": 1},
                        "framework_version": "2.8.0", "py_version": "py312"})  # a user script names its image
    # not an error of the job (the script may build any model): it says how to describe the model
    with pytest.raises(PlanError, match="this script does not say its model.*model_type.*hidden_width"):
        estimate_memory(job)


def test_to_dict_has_the_json_fields():
    d = estimate_memory(seed("p4d-no-cp", WHOLE_LOGITS)).to_dict()
    assert d["fits"] is False and d["capacity_gib"] == 40
    assert d["largest_allocation"]["gib"] == pytest.approx(7.828, abs=1e-3)
    assert {t["key"] for t in d["terms"]} >= {"parameters", "gradients", "optimizer", "activations", "logits"}
    assert any(a["set"][0].startswith("context_parallel_degree=") for a in d["advice"])


# --- properties -----------------------------------------------------------------------------

ACTIVATION_TERMS = ("activations", "logits", "final", "block_forward", "block_backward", "mlp_grads")
STATE_TERMS = ("parameters", "gradients", "optimizer")
presets = st.sampled_from(["llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b"])
ac_modes = st.sampled_from([None, "selective", "full"])


@settings(max_examples=60, deadline=None)
@given(presets, st.integers(1, 16), st.integers(1, 4), st.sampled_from([1, 2, 4]), ac_modes)
def test_more_context_parallelism_means_less_activation_memory(preset, k, batch, cp, ac):
    seq = 1024 * k * 2  # divisible by 2·cp for every cp here
    fewer = estimate_workload(workload(preset, seq, batch, cp, 8, ac))
    more = estimate_workload(workload(preset, seq, batch, 2 * cp, 8, ac))
    assert more.gib("activations") < fewer.gib("activations")
    for key in ACTIVATION_TERMS:
        assert more.gib(key) <= fewer.gib(key), key
    assert more.peak_gib <= fewer.peak_gib


@settings(max_examples=60, deadline=None)
@given(presets, st.sampled_from([1, 2, 4]), ac_modes)
def test_a_larger_sharding_group_means_less_state_per_gpu(preset, group, ac):
    small = estimate_workload(workload(preset, 8192, 1, 1, group, ac))
    large = estimate_workload(workload(preset, 8192, 1, 1, 2 * group, ac))
    for key in STATE_TERMS:
        assert large.gib(key) < small.gib(key), key
    assert large.peak_gib <= small.peak_gib


@settings(max_examples=60, deadline=None)
@given(presets, st.integers(1, 32), st.integers(1, 4), st.sampled_from([1, 2, 4, 8]))
def test_activation_checkpointing_lowers_activation_memory(preset, k, batch, cp):
    seq = 1024 * k
    none, selective, full = (estimate_workload(workload(preset, seq, batch, cp, 8, ac)).gib("activations")
                             for ac in (None, "selective", "full"))
    assert full < selective < none


@settings(max_examples=60, deadline=None)
@given(presets, st.integers(1, 32), st.integers(1, 4), st.sampled_from([1, 2, 4, 8]), ac_modes)
def test_memory_grows_with_sequence_length(preset, k, batch, cp, ac):
    short = estimate_workload(workload(preset, 1024 * k, batch, cp, 8, ac))
    long = estimate_workload(workload(preset, 1024 * (k + 1), batch, cp, 8, ac))
    assert long.gib("activations") > short.gib("activations")
    assert long.gib("logits") > short.gib("logits")
    assert long.allocated_gib >= short.allocated_gib and long.peak_gib >= short.peak_gib


def test_the_planner_modules_import_each_other_without_a_cycle() -> None:
    """Lazy imports included: advice builds on memory, so memory must not reach back for advice.
    Imports for type checking only never run (test_architecture.py leaves them out too)."""
    import ast

    package = Path(__file__).resolve().parents[2] / "launcher" / "plan"
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        found = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in tree.body
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("launcher.plan."):
                found.add(node.module.rsplit(".", 1)[1])
            elif isinstance(node, ast.ImportFrom) and node.module == "launcher.plan":
                found |= {a.name for a in node.names if (package / f"{a.name}.py").is_file()}
        graph[path.stem] = found - {path.stem}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(n == target or (n not in seen and reaches(n, target, seen | {n})) for n in graph.get(start, ()))

    assert [m for m in graph if reaches(m, m, set())] == []


def test_the_first_blocks_backward_holds_every_other_blocks_gradient_shard():
    """seed p5 (micro-batch 4, full checkpointing): at the first block's backward the 31 other
    blocks' fp32 gradient shards exist and 1/32 of the kept block inputs. Under pipeline
    parallelism torch's schedule reduces no gradient before the step's end: a stage's 16 blocks stay
    gathered (bf16) and their gradients, with half the root's, accumulate unsharded in fp32."""
    s = SPEC_8B
    h, kv = s.hidden_size, s.num_kv_heads * s.head_dim
    block = 2 * h * s.num_heads * s.head_dim + 2 * h * kv + 3 * h * s.intermediate_size + 2 * h
    w = workload_of(seed("p5-cp8-bf16"))
    est = estimate_workload(w)
    assert est.gib("block_gradients") == pytest.approx(4 * 31 * block / 8 / GIB, rel=1e-9)
    assert est.gib("first_block_activations") == pytest.approx(est.gib("activations") / 32, rel=1e-9)
    assert est.peak_phase in ("first_block_mlp", "first_block_attention")
    staged = replace(w, layout=ParallelLayout(world=8, dp_replicate=1, dp_shard=4, cp=1, tp=1, pp=2))
    staged_est = estimate_workload(staged)
    assert staged_est.gib("block_gradients") == 0  # no shard yet
    root = 2 * s.vocab_size * h + h  # untied embedding and head, final norm
    assert staged_est.gib("pipeline_accumulation") == pytest.approx(
        (2 * 16 * block + 4 * (16 * block + root / 2)) / GIB, rel=1e-9)


def test_a_lora_job_holds_gradients_and_optimizer_state_for_its_adapters_only():
    """use_peft with all-linear adapters of rank 16 on llama3.1-8b over 8 ranks: the frozen base has no
    gradient and no AdamW state; the adapters' 41,943,040 parameters (peft's count, test_lora_rules)
    have both, sharded. Their dropped inputs are kept where checkpointing does not wrap the block."""
    from launcher.wire.training.lora import LoraSettings, target_kinds, trainable_parameters

    lora = LoraSettings(r=16, alpha=32, dropout=0.05, targets=target_kinds(SPEC_8B))
    trainable, _ = trainable_parameters(SPEC_8B, lora)
    assert trainable == 41_943_040
    full = workload_of(seed("p4d-cp8"))
    adapted = estimate_workload(replace(full, lora=lora))
    assert adapted.gib("gradients") == pytest.approx(4 * trainable / 8 / GIB, rel=1e-9)
    assert adapted.gib("optimizer") == pytest.approx(8 * trainable / 8 / GIB, rel=1e-9)
    assert adapted.gib("head_grad") == 0 and adapted.gib("root_reduce") == 0  # the frozen root
    # control: the full fine-tune's state is the whole model's, and the parameters are the base's + adapters'
    whole = estimate_workload(full)
    assert whole.gib("gradients") == pytest.approx(4 * SPEC_8B.parameter_count() / 8 / GIB, rel=1e-9)
    assert adapted.gib("parameters") == pytest.approx(whole.gib("parameters") + 4 * trainable / 8 / GIB, rel=1e-9)
    assert adapted.gib("lora_dropout") == 0  # every block checkpointed (the seed's full AC)
    uncheckpointed = estimate_workload(replace(full, lora=lora, ac_mode=None))
    assert uncheckpointed.gib("lora_dropout") > 0


def test_a_qlora_job_s_base_is_planned_in_nf4():
    """load_in_4bit on llama3.1-8b, all-linear r 16, 8 ranks: 32 x (4096 x 4096 x 2 + 1024 x 4096 x 2 +
    14336 x 4096 x 3) = 6,979,321,856 NF4 weights, 872,415,232 a rank: 436,207,616 B of 4-bit codes +
    13,631,488 int8 scales (one per 64) + 212,992 fp32 factors (one per 64 x 256) + 224 tensors x 68 B
    (each one's scales' mean and level table); the other 1,092,882,432 parameters (embeddings, norms,
    adapters) fp32 shards, 546,441,216 B. The tiny Llama of tests/support/nf4_reference.py at world 2:
    701,000 B, what a real run and its trace hold (measured: container.holdings, test_trace_exact)."""
    from launcher.wire.training.hf_config import spec_from_hf_config
    from launcher.wire.training.lora import LoraSettings, target_kinds
    from tests.support.hf_models import llama_config
    from tests.support.nf4_reference import QLORA_SHAPES

    full = workload_of(seed("p4d-cp8"))
    lora = LoraSettings(r=16, alpha=32, dropout=0.05, targets=target_kinds(SPEC_8B))
    qlora = estimate_workload(replace(full, lora=replace(lora, nf4=True)))
    expected = 436_207_616 + 13_631_488 + 212_992 + 224 * 68 + 546_441_216
    assert qlora.gib("parameters") + qlora.gib("nf4_base") == pytest.approx(expected / GIB, rel=1e-12)
    assert qlora.gib("parameters") == pytest.approx(546_441_216 / GIB, rel=1e-12)  # what a checkpoint holds
    assert qlora.gib("gradients") == estimate_workload(replace(full, lora=lora)).gib("gradients")  # adapters' only
    assert estimate_workload(replace(full, lora=lora)).gib("nf4_base") == 0  # the control: an fp32 base
    # the running and the prefetched block all-gathered: the NF4 weights (218,103,808 a block) in NF4, the
    # rest (norms, adapters: 1,318,912) in bf16; and one dequantization of the largest weight, gate_proj's
    block_nf4, rest = 218_103_808, 8_192 + 1_310_720
    gathered = 2 * (2 * rest + block_nf4 / 2 + block_nf4 / 64 + 4 * block_nf4 / 16384 + 7 * 68)
    assert qlora.gib("gathered_forward") == pytest.approx(gathered / GIB, rel=1e-12)
    assert qlora.gib("nf4_dequantize") == pytest.approx(20 * 14336 * 4096 / GIB, rel=1e-12)
    lora_only = estimate_workload(replace(full, lora=lora))
    assert lora_only.gib("gathered_forward") == pytest.approx(2 * 2 * (block_nf4 + rest) / GIB, rel=1e-12)
    assert lora_only.gib("nf4_dequantize") == 0

    tiny = spec_from_hf_config(llama_config(**QLORA_SHAPES).to_dict(), "tiny")
    two = ParallelLayout(world=2, dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=1)
    tiny_qlora = LoraSettings(r=4, alpha=8, dropout=0.0, targets=target_kinds(tiny), nf4=True)
    planned = estimate_workload(replace(full, spec=tiny, layout=two, lora=tiny_qlora))
    assert (planned.gib("parameters") + planned.gib("nf4_base")) * GIB == pytest.approx(701_000, abs=1e-6)
