"""The instance catalog: coverage of SageMaker's training types, figures, lookups, light import.
Here the tests that start processes; the rest are tests/unit/test_catalog.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_and_lookups_load_no_heavy_modules():
    code = (
        "import sys; import launcher.wire.training.catalog as c\n"
        "c.get_instance_type('p5.48xlarge'); c.catalog_names(); c.fp8_instance_types()\n"
        "assert c.botocore_training_instance_types()\n"
        "print(sorted(m for m in ('boto3', 'botocore', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
