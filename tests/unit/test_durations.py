"""The suite's recorded costs (tests/support/durations.py): what the scheduler in tests/conftest.py
starts first, and what `make test` prints per folder."""

from __future__ import annotations

import json

from tests.support.durations import FOLDERS, estimate, folder_of, longest, recorded

KNOWN = {"tests/unit/test_a.py": 2.0, "tests/unit/test_b.py": 4.0, "tests/integration/test_c.py": 90.0,
         "tests/e2e/test_d.py": 40.0, "tests/e2e/test_e.py": 70.0}


def test_a_module_not_recorded_counts_as_its_folders_average_module():
    seconds = estimate(KNOWN)
    assert seconds("tests/integration/test_c.py") == 90.0
    assert seconds("tests/unit/test_new.py") == 3.0  # (2 + 4) / 2
    assert seconds("tests/e2e/test_new.py") == 55.0
    assert estimate({})("tests/unit/test_a.py") == 0.0  # nothing recorded: xdist's own order


def test_the_longest_scope_goes_first_and_a_group_counts_all_its_modules():
    seconds = estimate(KNOWN)
    queue = {"tests/unit/test_a.py": ["tests/unit/test_a.py::t1", "tests/unit/test_a.py::t2"],
             "tests/integration/test_c.py": ["tests/integration/test_c.py::t"],
             "engine": ["tests/e2e/test_d.py::t", "tests/e2e/test_e.py::t1", "tests/e2e/test_e.py::t2"]}
    assert longest(queue, seconds) == "engine"  # 40 + 70, each module once however many tests
    del queue["engine"]
    assert longest(queue, seconds) == "tests/integration/test_c.py"  # the control: one module alone


def test_the_recorded_costs_name_modules_of_this_suite(tmp_path):
    assert recorded(tmp_path / "none.json") == {}
    (tmp_path / "d.json").write_text(json.dumps(KNOWN))
    assert recorded(tmp_path / "d.json") == KNOWN
    costs = recorded()
    assert costs, "tests/durations.json is missing: make test, then make durations"
    assert {folder_of(module) for module in costs} <= set(FOLDERS)
    assert all(module.startswith("tests/") and module.endswith(".py") for module in costs)
