"""What `smlaunch plan --trace` asks the runtime and what the runtime answers (docs/planner.md).

The client (launcher.plan.trace) starts `python -m container trace`, writes one request per traced
rank on its standard input (a JSON line each) and reads one result line per request, in their
order, from its standard output; the runtime (container/trace/) builds each rank of its job's whole
world on torch's fake process group and traces one training step on fake tensors. Both sides read
this module only.

A result is a JSON object: `rank`, and either `error` (the trace failed: the rank, the module and
the shapes, in words), `exit` (the process tracing the rank ended with that code and no result: its
standard error says why), `not_traced` (why this job's step cannot be traced on fake CPU tensors), or
the figures: `mesh` ({dimension: size}), `parameter_bytes`, `gradient_bytes`, `optimizer_bytes`
(the storage of the local shards the rank holds, padded as FSDP2 pads), `peak_bytes` (the step's
peak of live tensors), `peak_kinds` (that peak's bytes by torch's memory tracker's kinds: "Sharded
Param", "Temp", ..., and "Total"), `peak_at` ({phase, module}), `collectives` (one row per kind and group:
`kind`, `group` (mesh dimension names), `group_size`, `count`, `bytes`: what the rank passes in)
and `seconds`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from launcher.wire.training.models import ModelSpec

COMMAND = ("-m", "container", "trace")  # after the interpreter: the runtime's entry of a trace
FIGURES = ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "peak_bytes")


@dataclass(frozen=True)
class TraceRequest:
    """One rank of one job: what the runtime needs to build it as `train.py` would."""

    rank: int
    world_size: int
    processes_per_host: int
    hyperparameters: dict[str, Any]  # TrainingHyperparameters.model_dump(mode="json")
    mp_parameters: dict[str, Any]  # ModelParallelParameters.model_dump(mode="json")
    model: dict[str, Any]  # the ModelSpec the client resolved (no download on the runtime's side)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> TraceRequest:
        fields = json.loads(text)
        if not isinstance(fields, dict) or set(fields) != set(TraceRequest.__dataclass_fields__):
            raise ValueError("a trace request is a JSON object with the fields "
                             f"{sorted(TraceRequest.__dataclass_fields__)}")
        return TraceRequest(**fields)

    def spec(self) -> ModelSpec:
        return spec_from_dict(self.model)


def spec_to_dict(spec: ModelSpec) -> dict[str, Any]:
    """As JSON has it (tuples as lists), so a request equals itself read back."""
    return json.loads(json.dumps(asdict(spec)))


def spec_from_dict(fields: dict[str, Any]) -> ModelSpec:
    """JSON has no tuples: every list field of a ModelSpec is a tuple (rope_scaling, eos_token_id, ...)."""
    return ModelSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def result_line(result: dict[str, Any]) -> str:
    """The line a traced rank's result is printed as."""
    return json.dumps(result, sort_keys=True)


def read_result(stdout: str) -> dict[str, Any] | None:
    """The result in a traced rank's output (its last result line), or None without one."""
    results = read_results(stdout)
    return results[-1] if results else None


def read_results(stdout: str) -> list[dict[str, Any]]:
    """The result lines in the output, in their order (other lines, torch's, are not results)."""
    found = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and "rank" in value:
                found.append(value)
    return found
