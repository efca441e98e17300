"""Rules that relate the parallelism, precision and launcher settings to the instance and model.

Each returns Issues; none raises, so all are reported. Job-level rules are in job_rules.py.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.config import backend_table
from launcher.config.context import Context
from launcher.config.job import JobConfig
from launcher.wire.training import catalog
from launcher.wire.training.degrees import ModelParallelParameters, script_arguments
from launcher.wire.training.hyperparameters import FP8Config
from launcher.wire.training.issues import Issue, did_you_mean
from launcher.wire.training.layout import (
    PipelineJob,
    divisors,
    layout_problems,
    moe_problems,
    pipeline_problems,
    sharding_group,
    with_sharding_strategy,
)
from launcher.wire.training.models import (
    MOE_MODEL_TYPES,
    VOCAB_MULTIPLE,
    ModelSpec,
    attention_kernel_problem,
    vocab_rows,
)
from launcher.wire.training.run_settings import run_settings

MP = "distribution.smdistributed.modelparallel.parameters"
HP = "hyperparameters"
SMP_V2_ONLY = (
    "hybrid_shard_degree",
    "context_parallel_degree",
    "expert_parallel_degree",
    "sm_activation_offloading",
    "activation_loading_horizon",
    "fsdp_cache_flush_warnings",
    "allow_empty_shards",
    "random_seed",
)


def check_instance(job: JobConfig) -> tuple[catalog.InstanceType | None, list[Issue]]:
    name = catalog.normalize_instance_type(job.instance_type)
    inst = catalog.get_instance_type(name)
    if inst is not None:
        return inst, []
    if name in catalog.botocore_training_instance_types():
        return None, [
            Issue(
                "instance_type", job.instance_type,
                "known to SageMaker but not to smlaunch's catalog, so accelerator checks are skipped",
                "check the degrees by hand, or add the type to launcher/wire/training/catalog.py", "warning",
            )
        ]
    suggestions = did_you_mean(name, catalog.catalog_names())
    return None, [
        Issue("instance_type", job.instance_type, "unknown instance type",
              suggestions or "see `smlaunch validate --help` for the catalog")
    ]


def processes_per_host(job: JobConfig, inst: catalog.InstanceType | None) -> tuple[int | None, list[Issue]]:
    issues: list[Issue] = []
    explicit = job.processes_per_host
    mpi = job.distribution.mpi if job.distribution else None
    if mpi and mpi.enabled and mpi.processes_per_host:
        if explicit and explicit != mpi.processes_per_host:
            issues.append(Issue(
                "processes_per_host", explicit,
                f"differs from distribution.mpi.processes_per_host ({mpi.processes_per_host})",
                "set one of them, or make them equal"))
        explicit = explicit or mpi.processes_per_host
    if inst is None:
        return explicit, issues
    gpus = backend_table.host_gpus(job, inst.accelerators)
    if gpus is None:  # local_gpu: known only on the machine that runs it
        return explicit, issues
    if gpus == 0:
        return explicit or 1, issues
    if explicit and explicit > gpus:
        issues.append(Issue(
            "processes_per_host", explicit,
            f"{inst.name} has only {gpus} accelerator(s); each process needs one",
            f"use processes_per_host <= {gpus}"))
    elif explicit and explicit < gpus:
        issues.append(Issue(
            "processes_per_host", explicit, f"leaves {gpus - explicit} of {gpus} accelerators idle",
            f"omit it to use all {gpus}", "warning"))
    return explicit or gpus, issues


def check_launchers(ctx: Context) -> list[Issue]:
    dist = ctx.job.distribution
    if dist is None:
        return []
    issues = []
    mp = dist.modelparallel
    smd = dist.smdistributed
    if mp and dist.dataparallel_enabled:
        issues.append(Issue(
            "distribution.smdistributed.dataparallel.enabled", True,
            "smdistributed data parallelism cannot be combined with modelparallel",
            "turn off dataparallel: SMP shards and reduces gradients itself"))
    elif smd and smd.modelparallel is not None and smd.dataparallel is not None:
        issues.append(Issue(
            "distribution.smdistributed", sorted(smd.model_fields_set),
            "names both modelparallel and dataparallel; the SageMaker SDK refuses more than one "
            "smdistributed strategy, even a disabled one", "remove the one you do not use"))
    if dist.mpi_enabled and dist.torchrun:
        issues.append(Issue(
            "distribution.mpi.enabled", True, "mpi and torch_distributed are two launchers; pick one",
            "for SMP v2 keep torch_distributed and remove mpi"))
    if mp and not dist.torchrun:
        v2_keys = sorted(set(mp.parameters.model_fields_set) & set(SMP_V2_ONLY))
        if v2_keys or not dist.mpi_enabled:
            issues.append(Issue(
                "distribution.torch_distributed.enabled", False,
                "SMP v2 model parallelism is launched by torchrun"
                + (f" (parameters {', '.join(v2_keys)} are SMP v2 keys)" if v2_keys else ""),
                "add torch_distributed: {enabled: true}"))
    if smd and not dist.torchrun and "p5.48xlarge" in ctx.job.instance_type \
            and not any(i.path == "distribution.torch_distributed.enabled" for i in issues):
        issues.append(Issue(
            "distribution.torch_distributed.enabled", False,
            "the SageMaker SDK refuses smdistributed (SMP, smddp) on ml.p5.48xlarge without torch_distributed",
            "add torch_distributed: {enabled: true}"))
    inst = ctx.instance
    if dist.torchrun and inst is not None and inst.accelerators == 0 and ctx.job.on_sagemaker:
        issues.append(Issue(
            "distribution.torch_distributed.enabled", True,
            f"{inst.name} has no GPU; torch_distributed on SageMaker needs GPU instances",
            "pick a GPU instance type, or run locally with instance_type: local"))
    return issues


def _whose(ctx: Context, issue: Issue, smp_rule: bool = False) -> Issue:
    """A rule of smlaunch's runtime (and, with `smp_rule`, one SMP documents) as it applies to this
    job: an error for the runtime (and for a script that uses SMP v2 where SMP has the rule), for
    any other script of the user's own a note: its own code decides (docs/own-scripts.md)."""
    if ctx.runtime or (smp_rule and ctx.smp_script):
        return issue
    return replace(issue, level="info", problem=f"{issue.problem} (a rule of smlaunch's runtime; your script "
                                                f"decides by its own)")


def check_degrees(ctx: Context) -> list[Issue]:
    p, w = ctx.params, ctx.world
    tp, cp, ep = p.tensor_parallel_degree, p.context_parallel_degree, p.expert_parallel_degree
    issues: list[Issue] = []
    if w is not None:
        # the layout the runtime builds: the seed's sharding_strategy may set the sharding group
        effective = with_sharding_strategy(p, ctx.hp.sharding_strategy, ctx.processes_per_host)
        issues += [Issue(f"{MP}.{found.key}", found.value, f"{found.problem} ({_world_text(ctx)})",
                         found.fix + _local_hint(ctx)) for found in layout_problems(effective, w)]
        issues += _check_sdp(p)
    issues += check_pipeline(ctx)
    seq = ctx.hp.max_context_width
    if cp > 1 and seq and seq % (2 * cp * tp):  # SMP's context parallelism cuts sequences alike
        issues.append(_whose(ctx, Issue(f"{HP}.max_context_width", seq,
                                        f"must be divisible by 2 x cp x tp = {2 * cp * tp} (each sequence is cut "
                                        "into 2*cp load-balanced chunks)",
                                        f"use {seq - seq % (2 * cp * tp)} or "
                                        f"{seq + 2 * cp * tp - seq % (2 * cp * tp)}"), smp_rule=True))
    if tp > 1 and cp == 1 and seq and seq % tp:
        issues.append(_whose(ctx, Issue(f"{HP}.max_context_width", seq,
                                        f"must be divisible by tensor_parallel_degree {tp} (sequence-parallel "
                                        "norms split each sequence across the tp ranks)",
                                        f"use {seq - seq % tp} or {seq + tp - seq % tp}")))
    model = ctx.model
    if tp > 1 and model is not None:
        issues += _tp_shape_issues(ctx, model, tp)
    if ep > 1 and not is_moe(ctx):
        name = model.name if model else "this dense model"
        issues.append(Issue(f"{MP}.expert_parallel_degree", ep,
                            f"expert parallelism needs a mixture-of-experts model; {name} is dense",
                            "set expert_parallel_degree: 1"))
    if model is not None and model.is_moe:  # a script of the user's own may tensor-parallelise its MoE
        issues += [Issue(f"{MP}.{found.key}", found.value, f"{found.problem} ({model.name})", found.fix)
                   for found in moe_problems(p, model.num_experts)
                   if ctx.runtime or found.key == "expert_parallel_degree"]
    for key, hp_value in script_arguments(ctx.hp).items():
        dist_value = getattr(p, key)
        if hp_value is not None and hp_value != dist_value:
            issues.append(Issue(f"{HP}.{key}", hp_value,
                                f"differs from {MP}.{key} = {dist_value}",
                                "set it in the distribution only (the script receives it from there)"))
    return issues


def _tp_shape_issues(ctx: Context, model: ModelSpec, tp: int) -> list[Issue]:
    """Whole heads and MLP columns per tp rank: smlaunch's runtime (and SMP's tensor parallelism)
    splits them evenly. A vocabulary they cannot split is padded (smlaunch's runtime:
    launcher.wire.training.models.vocab_rows; SMP pads too), which validate notes for the runtime."""
    issues = []
    world = ctx.world
    for attr, label in (("num_heads", "attention heads"), ("num_kv_heads", "key/value heads"),
                        ("intermediate_size", "MLP width")):
        n = getattr(model, attr)
        if n % tp:
            # advice never names a degree the world cannot have (a divisor of the model's count, and of the world)
            fits = [d for d in divisors(n) if world is None or world % d == 0]
            issues.append(_whose(ctx, Issue(f"{MP}.tensor_parallel_degree", tp,
                                            f"{model.name} has {n} {label}, not divisible by it",
                                            f"use one of {fits}"), smp_rule=attr != "intermediate_size"))
    if model.vocab_size % tp and ctx.runtime:  # a script's own (SMP too) pads or not by its own code
        rows = vocab_rows(model.vocab_size, tp)
        issues.append(Issue(f"{MP}.tensor_parallel_degree", tp,
                            f"{model.name} has {model.vocab_size} vocabulary entries, not divisible by it: smlaunch's "
                            f"runtime pads its embedding and head to {rows} rows (Megatron's make-vocab-size-"
                            f"divisible-by {VOCAB_MULTIPLE}); the padding's logits are masked, the exported model has "
                            f"{model.vocab_size}", level="info"))
    return issues


def check_pipeline(ctx: Context) -> list[Issue]:
    """Pipeline parallelism in smlaunch's runtime (launcher.wire.training.layout, which the container
    enforces too); a user script pipelines, or not, by its own rules."""
    if not ctx.runtime:
        return []
    hp, model = ctx.hp, ctx.model
    s = run_settings(hp, ctx.params, ctx.world or 1)
    job = PipelineJob(num_layers=model.num_layers if model else None, batch_per_rank=s.micro_batch * s.grad_accum,
                      tied_embeddings=bool(model and model.tie_embeddings), moe=is_moe(ctx), fp8=s.fp8.enabled,
                      delayed_init=s.delayed_init, validation=bool(s.validation_freq),
                      pretrained_weights=bool(hp.hf_pretrained_model_name_or_dir) and not hp.init_from_scratch)
    return [Issue(f"{HP if found.hyperparameter else MP}.{found.key}", found.value, found.problem, found.fix)
            for found in pipeline_problems(ctx.params, job)]


def _check_sdp(p: ModelParallelParameters) -> list[Issue]:
    """SMP v1 sharded data parallelism against the other settings (its degree: layout_problems)."""
    sdp = p.sharded_data_parallel_degree
    if not sdp:
        return []
    issues = []
    key = f"{MP}.sharded_data_parallel_degree"
    if p.hybrid_shard_degree and p.hybrid_shard_degree != sdp:
        issues.append(Issue(key, sdp, f"differs from hybrid_shard_degree = {p.hybrid_shard_degree}; "
                            "both name the sharding group size", "set only one of them"))
    if p.pipeline_degree > 1:
        issues.append(Issue(key, sdp, f"excludes pipeline parallelism (degree {p.pipeline_degree})",
                            "set pipeline_parallel_degree (partitions) to 1"))
    if p.shard_optimizer_state:
        issues.append(Issue(key, sdp, "excludes shard_optimizer_state",
                            "set shard_optimizer_state: false (sharded data parallelism shards it)"))
    if p.tensor_parallel_degree > 1 and not p.prescaled_batch:
        issues.append(Issue(f"{MP}.prescaled_batch", p.prescaled_batch,
                            "sharded data parallelism with tensor parallelism needs prescaled_batch",
                            "set prescaled_batch: true"))
    return issues


def check_precision(ctx: Context, fp8: FP8Config) -> list[Issue]:
    hp, p, inst = ctx.hp, ctx.params, ctx.instance
    issues = []
    bf16 = bool(hp.bf16 or p.bf16)
    fp16 = bool(hp.fp16 or p.fp16)
    if bf16 and fp16:
        issues.append(_whose(ctx, Issue(f"{HP}.fp16", True, "bf16 and fp16 are both on",
                                        "keep one (bf16 on A100/H100)"), smp_rule=True))
    elif fp16 and ctx.runtime:
        issues.append(Issue(f"{HP}.fp16" if hp.fp16 else f"{MP}.fp16", True,
                            "smlaunch's train.py has no float16 path: it would train in float32",
                            "use bf16 (A100/H100 and newer), or an entry point of your own that reads fp16",
                            "warning"))
    if hp.bf16 is not None and "bf16" in p.model_fields_set and hp.bf16 != p.bf16:
        issues.append(_whose(ctx, Issue(f"{HP}.bf16", hp.bf16, f"differs from {MP}.bf16 = {p.bf16}",
                                        "make them equal"), smp_rule=True))
    acc = inst.accelerator if inst else None
    if bf16 and acc and acc.compute_capability and acc.compute_capability < (8, 0):
        where = f"{HP}.bf16" if hp.bf16 else f"{MP}.bf16"  # SMP v1 jobs switch it on in the parameters
        issues.append(_whose(ctx, Issue(where, True, f"{acc.model} ({inst.name}) has no bfloat16 support",
                                        "use fp16, or an A100/H100 instance (p4d, p5)"), smp_rule=True))
    if not fp8.enabled:
        return issues
    if inst is not None and inst.accelerators is not None and not inst.has_fp8 and not fp8.emulate:
        # what `fp8` means is the script's; SMP's FP8 (Transformer Engine) needs the hardware, as smlaunch's does
        what = acc.model if acc else "a CPU"
        issues.append(_whose(ctx, Issue(f"{HP}.fp8", True,
                                        f"{inst.name} runs on {what}, which has no FP8 (needs compute capability "
                                        ">= 8.9)", f"use an FP8 instance family ({_fp8_families()}), or set fp8: 0"),
                             smp_rule=True))
    if not bf16:
        issues.append(_whose(ctx, Issue(f"{HP}.fp8", True, "FP8 training needs bf16 for the layers that stay in "
                                        "16 bits", "add bf16: 1"), smp_rule=True))
    if not ctx.runtime:  # the FP8 library and recipe are the user script's
        return issues
    if fp8.backend == "transformer_engine" and ctx.params.tensor_parallel_degree > 1:
        issues.append(Issue(f"{HP}.fp8_backend", fp8.backend,
                            "Transformer Engine FP8 is not combined with tensor parallelism here",
                            "use fp8_backend: torchao, or tensor_parallel_degree: 1"))
    if fp8.backend == "transformer_engine" and ctx.model is not None and ctx.model.is_gpt_neox:
        issues.append(Issue(f"{HP}.fp8_backend", fp8.backend,
                            "smlaunch's Transformer Engine FP8 swaps in projections without biases, and GPT-NeoX's "
                            "have biases", "use fp8_backend: torchao (fp8_recipe: tensorwise or rowwise)"))
    return issues


def check_memory_options(ctx: Context) -> list[Issue]:
    hp, p = ctx.hp, ctx.params
    issues = []
    ckpt_off = hp.activation_checkpointing is False
    if ckpt_off and "sm_activation_offloading" in p.model_fields_set and p.sm_activation_offloading:
        issues.append(Issue(f"{MP}.sm_activation_offloading", True,
                            "offloads checkpointed activations, but activation_checkpointing is off",
                            "set hyperparameters.activation_checkpointing: 1, or remove this key"))
    if ckpt_off and hp.offload_activations:
        issues.append(Issue(f"{HP}.offload_activations", True,
                            "offloading needs activation checkpointing, which is off",
                            "set activation_checkpointing: 1, or offload_activations: 0"))
    if hp.delayed_param is not None and "delayed_parameter_initialization" in p.model_fields_set \
            and hp.delayed_param != p.delayed_parameter_initialization:
        issues.append(Issue(f"{HP}.delayed_param", hp.delayed_param,
                            f"differs from {MP}.delayed_parameter_initialization = "
                            f"{p.delayed_parameter_initialization}", "make them equal"))
    w = ctx.world
    group = sharding_group(p, w) if w else p.hybrid_shard_degree
    if hp.sharding_strategy == "no_shard" and group and group > 1:
        issues.append(Issue(f"{HP}.sharding_strategy", "no_shard",
                            f"contradicts a sharding group of {group} ranks",
                            "set hybrid_shard_degree: 1 for no sharding, or drop sharding_strategy"))
    return issues


def check_attention_kernel(ctx: Context) -> list[Issue]:
    """The document-masking kernel smlaunch's train.py is asked for, against the precision and the
    instance's devices (the container checks again with the device it gets: launcher.wire.training.models)."""
    kernel = ctx.hp.attention_kernel
    if not ctx.runtime or kernel is None:
        return []
    inst = ctx.instance
    gpu = None  # not known: local_gpu (detected at run time), an unknown instance
    if inst is not None and inst.accelerators == 0:
        gpu = False
    elif inst is not None and inst.accelerator is not None and inst.accelerator.vendor == "nvidia":
        gpu = True
    found = attention_kernel_problem(kernel, bool(ctx.hp.bf16 or ctx.params.bf16), gpu)
    return [Issue(f"{HP}.attention_kernel", kernel, found[0], found[1])] if found else []


def check_backend(ctx: Context) -> list[Issue]:
    inst = ctx.instance
    if ctx.hp.distributed_backend == "nccl" and inst is not None and inst.accelerators == 0:
        return [Issue(f"{HP}.distributed_backend", "nccl", f"NCCL needs GPUs and {inst.name} has none",
                      "use gloo on CPU")]
    return []


def _fp8_families() -> str:
    families = sorted({catalog.get_instance_type(n).family for n in catalog.fp8_instance_types()},
                      key=lambda f: (not f.startswith("p"), f))
    return ", ".join(families) + "; e.g. ml.p5.48xlarge"


def is_moe(ctx: Context) -> bool:
    """Whether the job trains a mixture-of-experts model (its hyperparameters or its resolved model say so)."""
    hp = ctx.hp
    return bool(hp.moe or hp.num_local_experts or (hp.model_type or "") in MOE_MODEL_TYPES
                or (ctx.model and ctx.model.is_moe))


def _world_text(ctx: Context) -> str:
    return f"world: {ctx.job.instance_count} host(s) x {ctx.processes_per_host} process(es)"


def _local_hint(ctx: Context) -> str:
    """Locally the world is whatever the job asks for: say how to grow it."""
    if ctx.job.is_local:
        return ", or raise processes_per_host / instance_count (local runs choose their world)"
    return ""
