"""Plan a job before paying for it: memory per accelerator (does it fit, what dominates, the
largest single allocation, which setting fixes an OOM), throughput and cost, sweeps and --auto.

Pure arithmetic on the validated job: no torch, no boto3, no rich until a table is rendered.
Importing this package loads nothing until a name is used.

    from launcher.config.jobfile import validate_job_file
    from launcher.plan import plan, explain_oom
    result = plan(validate_job_file("configs/seed/p4d-no-cp.yaml"))
    if result.oom:
        print(explain_oom(result.memory))
"""

from __future__ import annotations

_EXPORTS = {
    "estimate_memory": "advice",
    "MemoryEstimate": "memory",
    "MemoryTerm": "memory",
    "Allocation": "memory",
    "Fix": "memory",
    "SAFETY_MARGIN": "memory",
    "estimate_throughput": "throughput",
    "ThroughputEstimate": "throughput",
    "CALIBRATION": "throughput",
    "plan": "configurations",
    "PlanResult": "report",
    "sweep": "configurations",
    "sweep_job_file": "configurations",
    "parse_sweeps": "configurations",
    "default_space": "configurations",
    "auto": "configurations",
    "auto_job_file": "configurations",
    "search_job_file": "search",
    "SearchResult": "search",
    "pareto": "search",
    "render_table": "report",
    "explain_oom": "report",
    "PredictedOOMError": "fits",
    "check_fits": "fits",
    "check_trace": "fits",
    "TraceRefusal": "fits",
    "describe": "report",
    "explain_step": "report",
    "PlanError": "workload",
    "Workload": "workload",
    "workload_of": "workload",
}
__all__ = [
    "CALIBRATION",
    "SAFETY_MARGIN",
    "Allocation",
    "Fix",
    "MemoryEstimate",
    "MemoryTerm",
    "PlanError",
    "PlanResult",
    "PredictedOOMError",
    "SearchResult",
    "TraceRefusal",
    "ThroughputEstimate",
    "Workload",
    "auto",
    "auto_job_file",
    "check_fits",
    "check_trace",
    "default_space",
    "describe",
    "estimate_memory",
    "estimate_throughput",
    "explain_oom",
    "explain_step",
    "pareto",
    "parse_sweeps",
    "plan",
    "render_table",
    "search_job_file",
    "sweep",
    "sweep_job_file",
    "workload_of",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'launcher.plan' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"launcher.plan.{module}"), name)
