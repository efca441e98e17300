"""SageMaker's limits on a job's hyperparameters (launcher.wire.training.base), checked on what the request carries:
the values json.dumps'ed as the SDK sends them, and the keys the launcher adds counted in.

The environment and tag limits are field constraints of JobConfig; these depend on the wire form.
"""

from __future__ import annotations

import json

from launcher.config import sent_hyperparameters
from launcher.config.context import Context
from launcher.config.rules import HP
from launcher.wire.training.base import (
    HYPERPARAMETER_KEY_MAX,
    HYPERPARAMETER_VALUE_MAX,
    HYPERPARAMETERS_MAX,
)
from launcher.wire.training.issues import Issue

_TOO_BIG = "put large settings in a file under source_dir (or an input channel) and pass its name"


def check_hyperparameter_limits(ctx: Context) -> list[Issue]:
    job = ctx.job
    user = sent_hyperparameters.user_hyperparameters(job)
    issues = []
    for key, value in user.items():
        if len(key) > HYPERPARAMETER_KEY_MAX:
            issues.append(Issue(f"{HP}.{key[:40]}...", key, f"the name has {len(key)} characters; SageMaker "
                                f"takes at most {HYPERPARAMETER_KEY_MAX}", "use a shorter name"))
        sent = len(json.dumps(value))
        if sent > HYPERPARAMETER_VALUE_MAX:
            issues.append(Issue(f"{HP}.{key}", value, f"is {sent} characters as sent (JSON-encoded); SageMaker "
                                f"takes at most {HYPERPARAMETER_VALUE_MAX}", _TOO_BIG))
    # The reserved keys' values do not matter here, only that the request carries them (the region
    # is always sent to SageMaker).
    sent_keys = sent_hyperparameters.job_hyperparameters(job, instance_type=job.instance_type, program="-",
                                                         submit_directory="-", job_name="-", region="-")
    if len(sent_keys) > HYPERPARAMETERS_MAX:
        added = sorted(set(sent_keys) - set(user))
        issues.append(Issue(HP, f"{len(user)} hyperparameters",
                            f"the request would carry {len(sent_keys)}: these and {len(added)} the launcher adds "
                            f"({', '.join(added)}); SageMaker takes at most {HYPERPARAMETERS_MAX}",
                            f"remove at least {len(sent_keys) - HYPERPARAMETERS_MAX}, or {_TOO_BIG}"))
    return issues
