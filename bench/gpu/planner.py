"""The planner's prediction for a train.py run, the way `smlaunch plan` makes it (launcher/plan/configurations.py:
the job validated like `smlaunch validate`, then `plan`), against what the run measured.

The planner models SageMaker instance types; the one-GPU H100 type is ml.p5.4xlarge (launcher/config/
catalog.py), and an H200 is planned as it too (the catalog has no one-GPU H200 type): the memory
model does not depend on the card, the step time does (the H200's memory is faster). The measured
peak is torch.cuda.max_memory_allocated, the quantity the planner's memory model predicts
(docs/planner.md); the measured step is the run's median timed step.

`trace` adds the runtime's own step traced on fake tensors (`smlaunch plan --trace`'s code,
launcher.plan.trace): its peak of live tensors beside the planner's and the measured peak. It
needs no GPU, so run.py runs it on the CPU beside the part's GPU runs.
"""

from __future__ import annotations

from bench.gpu.table import Run

ONE_GPU_TYPE = "ml.p5.4xlarge"
ROLE = "arn:aws:iam::111122223333:role/SageMakerExecutionRole"  # AWS's documentation placeholder


def job_data(run: Run, instance_type: str = ONE_GPU_TYPE) -> dict:
    """The job a user would submit for this run: train.py with the run's hyperparameters."""
    from bench.gpu.trainpy import ROOT

    hp = {k: v for k, v in run.hyperparameters.items() if k != "fp8_emulate"}
    return {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "role": ROLE,
            "instance_type": instance_type, "instance_count": 1, "hyperparameters": hp}


def predict(run: Run, instance_type: str = ONE_GPU_TYPE) -> dict:
    """{"peak_gib", "step_s", "fits"} as the planner predicts them, or {"error": why not}."""
    from launcher.plan.configurations import plan_overrides

    result = plan_overrides(job_data(run, instance_type), (), base_dir=".")
    if result.errors or result.nothing_to_plan or result.memory is None or result.throughput is None:
        return {"instance_type": instance_type,
                "error": "; ".join(result.errors) or result.nothing_to_plan or "nothing planned"}
    return {"instance_type": instance_type, "peak_gib": result.memory.peak_gib,
            "step_s": result.throughput.step_s, "fits": result.memory.fits}


def against(prediction: dict, record: dict) -> dict:
    """The prediction beside the measurement, with measured / predicted where both exist."""
    out = dict(prediction)
    measured_peak, measured_step = record.get("peak_memory_gib"), record.get("step_s_median")
    out["measured_peak_gib"], out["measured_step_s"] = measured_peak, measured_step
    if measured_peak and prediction.get("peak_gib"):
        out["memory_ratio"] = measured_peak / prediction["peak_gib"]
    if measured_step and prediction.get("step_s"):
        out["step_ratio"] = measured_step / prediction["step_s"]
    return out


def trace(run: Run, instance_type: str = ONE_GPU_TYPE) -> dict:
    """{"traced_peak_gib", "trace_s"} of the run's rank 0 as `smlaunch plan --trace` traces it, or
    {"not_traced": why} (a setting the trace does not model: FP8) or {"error": why it failed}."""
    from launcher.config import ConfigError, validate_job
    from launcher.plan.trace import TraceError, run_trace

    try:
        traced = run_trace(validate_job(job_data(run, instance_type), base_dir="."))
    except (ConfigError, TraceError) as exc:
        return {"error": str(exc)}
    if traced.not_traced:
        return {"not_traced": traced.not_traced}
    return {"traced_peak_gib": traced.ranks[0]["peak_bytes"] / 2**30, "trace_s": traced.seconds,
            **({"traced_as": traced.traced_as} if traced.traced_as else {})}


def beside(record: dict, traced: dict) -> dict:
    """The planner's record with the trace's figures, and measured / traced where both exist."""
    figures = dict(traced)
    if traced.get("traced_peak_gib") and record.get("measured_peak_gib"):
        figures["memory_ratio"] = record["measured_peak_gib"] / traced["traced_peak_gib"]
    return {**record, "trace": figures}
