"""The planner's memory model: the seed's runs, terms derived by hand, and monotone properties.

Expectations come from arithmetic on the model's shapes, not from running the planner.
Here the tests that start processes; the rest are tests/unit/test_plan_memory.py."""

from __future__ import annotations

import subprocess
import sys

from tests.support.plan_memory import ROOT, SEED, WHOLE_LOGITS


def test_importing_the_planner_loads_neither_torch_nor_boto3():
    code = ("import sys; from launcher.config.jobfile import validate_job_file; from launcher.plan import plan; "
            f"r = plan(validate_job_file({str(SEED / 'p4d-no-cp.yaml')!r}, [{WHOLE_LOGITS!r}])); assert r.oom; "
            "print(sorted(m for m in ('torch', 'boto3', 'botocore', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# --- properties -----------------------------------------------------------------------------


