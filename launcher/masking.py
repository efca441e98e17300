"""Secrets stay out of everything smlaunch prints.

A value is masked when its key contains TOKEN, SECRET, PASSWORD, KEY or CREDENTIAL (camelCase and
snake_case alike). Numbers and booleans stay visible (num_key_value_heads is a count, not a
secret); a purely numeric secret would therefore show, a trade-off made for readable requests.
"""

from __future__ import annotations

import json
import re
from typing import Any

SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")
MASK = "****"


def is_secret_name(name: str) -> bool:
    upper = re.sub(r"([a-z])([A-Z])", r"\1_\2", name).upper()
    return any(word in upper for word in SECRET_WORDS)


def _looks_numeric(value: Any) -> bool:
    # Counts such as num_key_value_heads stay visible; secrets are strings.
    if isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        try:
            return isinstance(json.loads(value), (bool, int, float))
        except ValueError:
            return False
    return False


def mask_secrets(obj: Any) -> Any:
    """A copy of obj for printing: values of secret-looking keys replaced by '****'."""
    if isinstance(obj, dict):
        if set(obj) == {"Key", "Value"} and isinstance(obj["Key"], str):  # an AWS tag
            return {"Key": obj["Key"], "Value": MASK if is_secret_name(obj["Key"]) else obj["Value"]}
        return {k: MASK if _is_secret(str(k), v) else mask_secrets(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_secrets(v) for v in obj]
    return obj


def mask_value(path: str, value: Any) -> Any:
    """A finding's value for printing: masked when the last part of its dotted path is secret-like."""
    return MASK if _is_secret(re.split(r"[.\[]", path)[-1], value) else mask_secrets(value)


def _is_secret(key: str, value: Any) -> bool:
    return is_secret_name(key) and not _looks_numeric(value) and not isinstance(value, (dict, list))
