"""The SageMaker wire format of hyperparameters: the encoding the v2 SDK sends, and its decoding.

The v2 SDK json.dumps every hyperparameter value and adds reserved `sagemaker_*` keys and, for
the distributed launchers, `mp_parameters` and friends (docs/sagemaker-contract.md). The
container and the sagemaker-training toolkit json.loads each value, falling back to the raw
string. What a job's hyperparameters are is decided in launcher.config.sent_hyperparameters.
"""

from __future__ import annotations

import json
from typing import Any

RESERVED_PREFIXES = ("sagemaker_", "smlaunch_")
# The SDK has no key for torchrun's processes per host; the container reads this one. Its
# `sagemaker_` prefix makes AWS's toolkit treat it as a framework parameter, never a script argument.
PROCESSES_PER_HOST = "sagemaker_smlaunch_processes_per_host"


def encode(values: dict[str, Any]) -> dict[str, str]:
    """json.dumps every value, as the v2 SDK does ("llama" -> '"llama"', True -> 'true')."""
    return {str(k): json.dumps(v) for k, v in values.items()}


def decode(values: dict[str, str]) -> dict[str, Any]:
    """json.loads each value, falling back to the raw string (the toolkit's rule)."""
    out = {}
    for key, raw in values.items():
        try:
            out[key] = json.loads(raw)
        except (TypeError, ValueError):
            out[key] = raw
    return out


def split_reserved(decoded: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(user hyperparameters, reserved/distribution keys)."""
    reserved_keys = {"mp_parameters"}
    user = {k: v for k, v in decoded.items() if not k.startswith(RESERVED_PREFIXES) and k not in reserved_keys}
    reserved = {k: v for k, v in decoded.items() if k not in user}
    return user, reserved


def parse_mp_parameters(raw: str | dict | None) -> dict:
    """`mp_parameters` as the toolkit passes it: a dict (decoded JSON), JSON text, or `k=v,k2=v2`
    (how the toolkit flattens a dict hyperparameter into SM_HP_MP_PARAMETERS)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    raw = raw.strip()
    if raw.startswith("{"):
        return json.loads(raw)
    out = {}
    for item in raw.split(","):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out
