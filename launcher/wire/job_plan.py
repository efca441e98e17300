"""The plan's prediction a job carries to its metrics trackers, so a run's dashboard shows what was
predicted beside what was measured (docs/metrics.md).

The client plans the job when it builds the code archive (launcher.backends.sourcedir) and writes
the prediction as FILE in `_smlaunch/`, beside the runtime's packages; the runtime reads it there
(container/trackers/run_info.py). An archive, not a hyperparameter or an environment variable: what
SageMaker's CreateTrainingJob carries stays what the SageMaker SDK would send, and the archive is
already smlaunch's own. Only jobs that run smlaunch's runtime carry it (the trackers are the
runtime's); run from a checkout there is none.
"""

from __future__ import annotations

import json
from pathlib import Path

FILE = "smlaunch_plan.json"


def encode(prediction: dict) -> bytes:
    """The file's bytes: sorted keys, so the same job gives the same archive."""
    return (json.dumps(prediction, sort_keys=True, indent=1) + "\n").encode()


def read(packages_dir: Path) -> dict | None:
    """The prediction shipped in `packages_dir` (the `_smlaunch/` directory), or None without one.
    A file that is not a JSON object is an error naming it: it was written by smlaunch, so it is
    damaged, and a tracker must not show a wrong prediction."""
    path = packages_dir / FILE
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}): rebuild the job's code archive (submit again)") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds {type(value).__name__}, not the plan's JSON object: rebuild the job's "
                         "code archive (submit again)")
    return value
