"""One rank of a job's whole world, built by the runtime's own code and traced for one step.

The rank joins torch's fake process group at the job's world size (`init_process_group("fake")`:
one process, collectives return shaped outputs), builds the runtime's mesh (init_runtime), the model
on the meta device parallelized as container.trainer does, and runs `container.loop.train_step` on
fake tensors (FakeTensorMode: shapes, dtypes and lifetimes, no memory, no arithmetic). Its data is
synthetic: only the batch's shapes matter.

The first step runs untracked: DTensor's first sharding propagation of each op runs on fake tensors
that the tracker would count as memory (it caches the result; on a GPU it allocates nothing). AdamW's
`foreach` is set on, CUDA's default (CPU's is the per-tensor loop): sqrt(exp_avg_sq) then exists for
every parameter at once, as on a GPU. The non-finite guard issues its collective as in a run and
lets the step's update apply (a fake loss has no value to find non-finite). MoE layers route evenly
(container.trace.routing: the router's choices have no values).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.testing._internal.distributed.fake_pg import FakeStore

from container import loop, trainer
from container.data import loader as data
from container.distributed.context_parallel import apply_context_parallel
from container.distributed.parallelize import allocate
from container.distributed.pipeline import Pipeline, build_pipeline
from container.distributed.runtime import Runtime, init_runtime
from container.holdings import Holdings
from container.models import qlora
from container.models.moe import routed_by
from container.resilience.nonfinite import nonfinite_guard
from container.trace.collectives import CollectiveCounter, group_names
from container.trace.memory import WRAPPERS, peak_kinds, peak_tracker
from container.trace.pipeline import OutputCheck, settle_the_vote, stage_shapes, vote_unsupported
from container.trace.routing import EvenRouting
from launcher.wire.trace_record import TraceRequest
from launcher.wire.training.degrees import ModelParallelParameters
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.layout import ParallelLayout, num_stages
from launcher.wire.training.run_settings import RunSettings


def not_traced(rt: Runtime, s: RunSettings) -> str | None:
    """Why this job's step cannot be traced on fake CPU tensors, or None."""
    schedule = vote_unsupported() if rt.layout.pp > 1 else None
    reasons = [(s.fp8.enabled, "FP8's modules (Transformer Engine, torchao) need CUDA kernels"),
               (s.offload, "activation offload needs CUDA streams"),
               (schedule is not None, schedule)]
    return next((why for flag, why in reasons if flag), None)


def join_fake_world(request: TraceRequest, hp: TrainingHyperparameters) -> Runtime:
    """This process becomes rank `request.rank` of the job's world, with the runtime's mesh."""
    local = request.processes_per_host
    os.environ.update(RANK=str(request.rank), WORLD_SIZE=str(request.world_size),
                      LOCAL_RANK=str(request.rank % local), LOCAL_WORLD_SIZE=str(local))
    dist.init_process_group("fake", store=FakeStore(), rank=request.rank, world_size=request.world_size)
    params = ModelParallelParameters.model_validate(request.mp_parameters)
    return init_runtime(params, sharding_strategy=hp.sharding_strategy)


def trace_rank(request: TraceRequest) -> dict:
    """The rank's figures (launcher.wire.trace_record), or why its step is not traced."""
    started = time.perf_counter()
    hp = TrainingHyperparameters.model_validate(request.hyperparameters)
    spec = request.spec()
    rt = join_fake_world(request, hp)
    try:
        s = trainer.settings(rt, hp)
        result = {"rank": request.rank, "mesh": dict(zip(ParallelLayout.mesh_dim_names, rt.layout.mesh_shape))}
        why = not_traced(rt, s)
        if why:
            return {**result, "not_traced": why}
        lora = trainer.adapters(hp, spec)
        return {**result, **_traced_step(rt, s, spec, lora), "seconds": round(time.perf_counter() - started, 2)}
    except StepFailure as exc:
        return {"rank": request.rank, "error": f"rank {request.rank} of {request.world_size}: {exc}"}
    finally:
        dist.destroy_process_group()


def _step_failure(exc: Exception, forward: ForwardStack) -> StepFailure:
    if torch._C._current_graph_task_id() != -1:  # autograd is running: the backward
        return _failed("the step's backward", exc)
    found = forward.innermost()
    if found is None:
        return _failed("the step, outside the model's modules (the loss, clipping or the optimizer)", exc)
    name, module = found
    return _failed(f"the step's forward, in {name}", exc, module)


def _run(step, model) -> None:
    """One step; a failure names where in the model it happened."""
    with ForwardStack(model) as forward:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - reported with the rank and the module, not swallowed
            raise _step_failure(exc, forward) from exc


class StepFailure(RuntimeError):
    """The layout could not be built or stepped: where, in which module, with its shapes."""


def _failed(where: str, exc: Exception, module=None) -> StepFailure:
    shapes = ""
    if module is not None:
        params = [f"{name} {tuple(p.shape)}" for name, p in list(module.named_parameters())[:6]]
        shapes = f" (its parameters: {', '.join(params)})" if params else ""
    while exc.__cause__ is not None:  # what failed, not the wrappers around it (a pipeline stage's)
        exc = exc.__cause__
    return StepFailure(f"{where}{shapes}: {type(exc).__name__}: {exc}")


class ForwardStack:
    """The modules whose forward is running, innermost last. torch's ModTracker forgets them when an
    exception leaves a forward (its hooks always run); these hooks do not, so the stack still holds
    the module that failed."""

    def __init__(self, model) -> None:
        self.names = {m: name for name, m in model.named_modules()}
        self.stack: list = []

    def __enter__(self) -> ForwardStack:
        self._hooks = [register_module_forward_pre_hook(self._enter), register_module_forward_hook(self._leave)]
        return self

    def _enter(self, module, _args) -> None:  # a hook that returned something would replace the input
        self.stack.append(module)

    def _leave(self, _module, _args, _output) -> None:
        self.stack.pop()

    def __exit__(self, *_) -> None:
        for hook in self._hooks:
            hook.remove()

    def innermost(self) -> tuple[str, object] | None:
        """(the innermost model module's name, as the model names it, and the module)."""
        module = next((m for m in reversed(self.stack) if m in self.names), None)
        if module is None:
            return None
        return ".".join(p for p in self.names[module].split(".") if p not in WRAPPERS) or "the model's root", module


def _build(rt: Runtime, s: RunSettings, spec, lora) -> tuple[torch.nn.Module, Pipeline | None]:
    """The rank's model on the meta device, parallelized as container.trainer does (outside fake
    mode: the meshes it builds hold real tensors); under pp, its stages and their pipeline, the
    stages' shapes given up front (container.trace.pipeline)."""
    try:
        if rt.layout.pp > 1:
            shapes = stage_shapes(rt, s, spec, num_stages(rt.params))
            model, pipe = build_pipeline(rt, spec, s, trainer.parallelize, device=torch.device("meta"), shapes=shapes)
            settle_the_vote(pipe)
            return model, pipe
        model = trainer.build_adapted_model(spec, s, "meta", lora=lora)  # LoRA's adapters where the job has them
        if lora is not None and lora.nf4:  # QLoRA's base quantized (meta tensors' NF4) before it is sharded
            trainer.quantize_base(rt, model, s)
        trainer.parallelize(rt, model, s)
        return model, None
    except Exception as exc:  # noqa: BLE001 - reported with the rank, not swallowed
        raise _failed("parallelizing the model (container.trainer.parallelize: FP8, tensor parallel, "
                      "checkpointing, FSDP; under pp container.distributed.pipeline.build_pipeline)", exc) from exc


def _traced_step(rt: Runtime, s: RunSettings, spec, lora) -> dict:
    model, pipe = _build(rt, s, spec, lora)
    stages = tuple(stage.submod for stage in pipe.stages) if pipe else ()
    with FakeTensorMode(allow_non_fake_inputs=True):
        for module in (model, *stages):  # a merged model does not hold its stages' buffers
            allocate(module, rt.device)  # delayed init's storage, without rank 0's weights (values do not matter)
        if lora is not None and lora.nf4:
            qlora.allocate_constants(model, rt.device)
        optimizer, scheduler = trainer.build_optimization(model, s)
        for group in optimizer.param_groups:
            if "foreach" in group:
                group["foreach"] = True  # CUDA's default (see the module docstring)
        cp_shard = apply_context_parallel(rt, s.cp_comm_type)
        loader = data.build_dataloader(
            dataset_type="synthetic", path=None, seq_len=s.seq_len, micro_batch_size=s.micro_batch,
            dp_rank=rt.dp_rank, dp_size=rt.dp_size, grad_accum=s.grad_accum, vocab_size=spec.vocab_size,
            seed=s.seed, document_masking=s.document_masking)
        sequences = s.micro_batch * s.grad_accum * rt.dp_size
        nonfinite = nonfinite_guard(s, rt.rank, rt.local_rank, rt.device, None, None)

        def guard(_step, loss, grad_norm) -> bool:  # its collective, and a finite step (fake values are none)
            nonfinite.agreed_finite(loss, grad_norm)
            return True

        def step() -> None:
            micro = [cp_shard(loader.next_batch()) for _ in range(s.grad_accum)]
            with routed_by(EvenRouting()):  # MoE layers: fake tensors have no counts to route by
                loop.train_step(rt, model, pipe, optimizer, scheduler, micro, s, spec, sequences, guard=guard)

        checked = OutputCheck(pipe) if pipe else None
        _run(step, model)  # untracked warm-up (see the module docstring)
        if checked:
            checked.remove()
        held = Holdings(model, optimizer)
        tracker, counter = peak_tracker(model, optimizer, stages), CollectiveCounter(group_names(rt))
        with tracker, counter:
            _run(step, model)
        held.remove()
        kinds = peak_kinds(tracker, rt.device)
        return {"parameter_bytes": held.parameter_bytes, "gradient_bytes": held.gradient_bytes,
                "optimizer_bytes": held.optimizer_bytes, "peak_bytes": kinds["Total"], "peak_kinds": kinds,
                "peak_at": tracker.peak_at, "collectives": counter.rows()}
