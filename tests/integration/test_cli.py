"""The `smlaunch` CLI: exit codes (0 ok, 1 failed/AWS, 2 invalid), messages, JSON, light imports.
Here the tests that start processes; the rest are tests/unit/test_cli.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import ROOT

pytestmark = pytest.mark.usefixtures("no_network")  # every test here runs with the network refused

LIGHT_PROBE = """
import json, sys
from launcher.cli.app import main
try:
    main(sys.argv[1:], prog_name="smlaunch")
    code = 0
except SystemExit as exc:
    code = exc.code or 0
heavy = sorted(m for m in ("boto3", "botocore", "s3transfer", "torch", "moto") if m in sys.modules)
sys.stderr.write("PROBE " + json.dumps({"code": code, "heavy": heavy}) + "\\n")
"""


@pytest.mark.parametrize("args", [
    ["--help"],
    ["validate", "configs/seed/p4d-cp8.yaml"],
    ["validate", "configs/seed/p5-cp8-fp8.yaml", "--json"],
    ["validate", "configs/seed/p4d-cp8.yaml", "--set", "hyperparameters.fp8=1"],
    ["schema"],
    ["plan", "configs/seed/p4d-cp8.yaml", "--sweep", "context_parallel_degree=4,8"],
], ids=["help", "validate", "validate-json", "validate-invalid", "schema", "plan"])
def test_light_commands_import_neither_boto3_nor_torch(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", LIGHT_PROBE, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    probe = [line for line in proc.stderr.splitlines() if line.startswith("PROBE ")]
    assert probe, proc.stderr
    result = json.loads(probe[-1].removeprefix("PROBE "))
    assert result["heavy"] == [], result
    assert result["code"] == (2 if "hyperparameters.fp8=1" in args else 0), proc.stderr
