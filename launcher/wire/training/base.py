"""What every config model shares: the strict base model and the number and value types.

pydantic's lax mode reads `true` as 1 and `2.0` as 2, so YAML's `instance_count: yes` would run
one host; a job's numbers are therefore whole numbers or finite numbers as YAML/JSON write them.
Hyperparameters are the exception: scripts receive them as text (`--lr 1e-4`) and notebooks
often write them so, so their numbers may be text, but never booleans, .inf or .nan.

And the bounds on what a job may ask for: SageMaker's request limits, and the sizes smlaunch checks
its arithmetic against (`MAX_WORLD`, `MAX_DIMENSION`).
"""

from __future__ import annotations

import math
import typing
from types import UnionType
from typing import Annotated, Any, Union

from pydantic import AfterValidator, AllowInfNan, BaseModel, ConfigDict
from pydantic import Strict as StrictType


class Strict(BaseModel):
    """Unknown keys are errors (with a did-you-mean); values are checked on assignment too.

    A model is built (its pydantic core schema and validator) when its class is created, so a
    model used inside others (Distribution, the debugger settings, ...) is built once and reused
    by every model that holds it; a deferred inner model would be generated again inside each
    (the job models, the user-script variant of them, a lone `Distribution.model_validate`).
    Only the outermost models, which no other model holds, defer: JobConfig and JobFile are built
    when first used (launcher.config.job).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


# A whole number as written (not a boolean, not 2.0, not "2").
WholeNumber = Annotated[int, StrictType()]
# A finite number as written (an int is one; a boolean, .inf, .nan or "1.5" is not).
FiniteNumber = Annotated[float, StrictType(), AllowInfNan(False)]


# What is wrong with a boolean where a number belongs, and the fix (validate.py words pydantic's
# strict-mode errors the same way).
BOOLEAN_NOT_NUMBER = ("is a boolean, not a number (YAML reads yes/no/on/off/true/false as booleans)",
                      "write the number")


def reject_boolean(value: Any, annotation: Any) -> Any:
    """`value` unless it is a boolean for a field of int or float type (pydantic's lax mode would
    take it as 1 or 0); for the hyperparameters, which stay lax so text such as "8" is read."""
    if not isinstance(value, bool):
        return value
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, UnionType) else (annotation,)
    if {typing.get_args(m)[0] if typing.get_origin(m) is Annotated else m for m in members} & {int, float}:
        raise ValueError("; ".join(BOOLEAN_NOT_NUMBER))
    return value


def json_problem(value: Any) -> str | None:
    """Why `value` cannot travel as JSON (the wire json.dumps every hyperparameter), or None."""
    if value is None or isinstance(value, (str, int)):  # bool is an int
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number (JSON has no inf or nan)"
    if isinstance(value, (list, tuple)):
        return next((p for p in map(json_problem, value) if p), None)
    if isinstance(value, dict):
        bad_keys = [k for k in value if not isinstance(k, str)]
        if bad_keys:
            return f"mapping key {bad_keys[0]!r} is of type {type(bad_keys[0]).__name__}, and JSON keys are strings"
        return next((p for p in map(json_problem, value.values()) if p), None)
    return f"a {type(value).__name__} ({value!r:.40}) is not a JSON value"


def _json_value(value: Any) -> Any:
    problem = json_problem(value)
    if problem:
        raise ValueError(f"{problem}; write a string, a number, true/false, null, or a list or mapping of "
                         "those (quote dates and other YAML tags: '2024-01-01')")
    return value


def _named(key: str) -> str:
    if not key.strip():
        raise ValueError("a hyperparameter needs a name (the script would get a bare '--' argument); "
                         "name it or remove it")
    return key


# What a hyperparameter that smlaunch does not type may hold: what json.dumps writes faithfully.
JsonValue = Annotated[Any, AfterValidator(_json_value)]
HyperparameterName = Annotated[str, AfterValidator(_named)]


# --- bounds on what a job may ask for -------------------------------------------------------------
# The request limits are those of botocore's service model for CreateTrainingJob
# (botocore/data/sagemaker/2017-07-24/service-2.json): the `HyperParameters` map (max 100 entries,
# `HyperParameterKey` max 256, `HyperParameterValue` max 2500 characters), `TrainingEnvironmentMap`
# (max 100, `TrainingEnvironmentKey` max 512, `TrainingEnvironmentValue` max 512), `TagList`
# (max 50, `TagKey` 1-128, `TagValue` max 256). SageMaker refuses a request beyond them only after
# the code is uploaded; validation refuses it first, in local mode too, so a job that runs here
# runs there.
HYPERPARAMETERS_MAX = 100
HYPERPARAMETER_KEY_MAX = 256
HYPERPARAMETER_VALUE_MAX = 2500  # of the value as sent: json.dumps'ed, as the SDK sends it
ENVIRONMENT_MAX = 100
ENVIRONMENT_KEY_MAX = 512
ENVIRONMENT_VALUE_MAX = 512
TAGS_MAX = 50
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256
# TagKey and TagValue's pattern: letters, separators, digits and _.:/=+-@
TAG_PATTERN = r"^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$"
# KeepAlivePeriodInSeconds (ResourceConfig and UpdateTrainingJob's ResourceConfigForUpdate): min 0,
# max 21600 (6 hours) in botocore's model and AWS's API reference; the developer guide's warm-pool
# page still says 3600 (docs/sagemaker-warm-pools.md). tests/unit/test_warm_pools.py reads the model.
KEEP_ALIVE_MAX = 21600

# CreateTrainingJob's InstanceCount has no maximum in the API (botocore: TrainingInstanceCount,
# min 0); accounts' service quotas set the real one. 4096 hosts (32768 GPUs of p5) is beyond any
# training job's, and bounds every rank computation (the divisors of the world).
MAX_INSTANCE_COUNT = 4096
# More than any instance has accelerators (16) or a CPU instance has vCPUs (192).
MAX_PROCESSES_PER_HOST = 256
MAX_WORLD = MAX_INSTANCE_COUNT * MAX_PROCESSES_PER_HOST  # so no parallel degree can exceed it
# A model or batch dimension: a tensor dimension (int32, as CUDA kernels index), so the
# planner's products of them stay within float range.
MAX_DIMENSION = 2**31 - 1
