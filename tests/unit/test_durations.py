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


class _Report:
    def __init__(self, nodeid: str, when: str, duration: float, cpu: float | None, start: float = 100.0,
                 worker: str | None = None):
        self.nodeid, self.when, self.duration, self.skipped = nodeid, when, duration, False
        self.user_properties = [] if cpu is None else [("other", 9.0), ("cpu_s", cpu)]
        self.start, self.stop = start, start + duration
        if worker is not None:  # as xdist's controller receives it
            from types import SimpleNamespace

            self.node = SimpleNamespace(gateway=SimpleNamespace(id=worker))


def test_each_module_sums_its_phases_cpu_seconds_beside_their_wall_seconds(tmp_path):
    from types import SimpleNamespace

    from tests.support.durations import Costs, cpu_of

    assert cpu_of(_Report("tests/unit/test_a.py::t", "call", 1.0, None)) == 0.0  # a report without it
    options = SimpleNamespace(durations=0, durations_file=str(tmp_path / "d.json"))
    costs = Costs(SimpleNamespace(option=options))
    for report in (_Report("tests/unit/test_a.py::t", "setup", 2.0, 1.5),
                   _Report("tests/unit/test_a.py::t", "call", 3.0, 0.25),
                   _Report("tests/integration/test_c.py::t", "call", 10.0, 7.0)):
        costs.pytest_runtest_logreport(report)
    assert costs.seconds == {"tests/unit/test_a.py": 5.0, "tests/integration/test_c.py": 10.0}
    assert costs.cpu == {"tests/unit/test_a.py": 1.75, "tests/integration/test_c.py": 7.0}
    lines: list[str] = []
    costs.pytest_terminal_summary(SimpleNamespace(section=lambda *a, **k: None, write_line=lines.append))
    assert "      5.0 s        1.8 cpu s      1 tests  tests/unit" in lines
    assert json.loads((tmp_path / "d-cpu.json").read_text()) == {"tests/integration/test_c.py": 7.0,
                                                                  "tests/unit/test_a.py": 1.8}
    assert json.loads((tmp_path / "d.json").read_text())["tests/unit/test_a.py"] == 5.0  # the seconds as before
    # each test's phases summed: [seconds, CPU seconds], for finding what to make cheaper
    assert json.loads((tmp_path / "d-tests.json").read_text()) == {"tests/integration/test_c.py::t": [10.0, 7.0],
                                                                    "tests/unit/test_a.py::t": [5.0, 1.75]}


def test_each_workers_last_test_shows_how_long_it_idled_beside_the_others(tmp_path):
    from types import SimpleNamespace

    from tests.support.durations import Costs

    options = SimpleNamespace(durations=0, durations_file=str(tmp_path / "d.json"))
    costs = Costs(SimpleNamespace(option=options))
    for report in (_Report("tests/unit/test_a.py::t", "setup", 2.0, 0.0, start=1000.0, worker="gw0"),
                   _Report("tests/unit/test_a.py::t", "call", 3.0, 0.0, start=1002.0, worker="gw0"),
                   _Report("tests/unit/test_b.py::t", "call", 1.0, 0.0, start=1005.0, worker="gw0"),
                   _Report("tests/integration/test_c.py::t", "call", 40.0, 0.0, start=1001.0, worker="gw1")):
        costs.pytest_runtest_logreport(report)
    lines: list[str] = []
    costs.pytest_terminal_summary(SimpleNamespace(section=lambda *a, **k: None, write_line=lines.append))
    assert "  gw0:     6.0 s (idle   35.0 s), its last module tests/unit/test_b.py" in lines
    assert "  gw1:    41.0 s (idle    0.0 s), its last module tests/integration/test_c.py" in lines
    # each module's worker, first start and last end, in order of start
    assert json.loads((tmp_path / "d-timeline.json").read_text()) == {
        "tests/unit/test_a.py": ["gw0", 0.0, 5.0], "tests/integration/test_c.py": ["gw1", 1.0, 41.0],
        "tests/unit/test_b.py": ["gw0", 5.0, 6.0]}
    # the control: one process (no xdist) has no other worker to idle beside
    alone = Costs(SimpleNamespace(option=SimpleNamespace(durations=0, durations_file=None)))
    alone.pytest_runtest_logreport(_Report("tests/unit/test_a.py::t", "call", 3.0, 0.0))
    lines.clear()
    alone.pytest_terminal_summary(SimpleNamespace(section=lambda *a, **k: None, write_line=lines.append))
    assert not any("idle" in line for line in lines) and lines


def test_only_tests_that_may_start_processes_walk_proc_for_their_descendants(monkeypatch):
    from types import SimpleNamespace

    from tests.support import durations

    walks = []
    monkeypatch.setattr(durations, "_running_descendants", lambda: walks.append(1) or 2.0)
    unit = SimpleNamespace(nodeid="tests/unit/test_a.py::t")
    integration = SimpleNamespace(nodeid="tests/integration/test_c.py::t")
    assert not durations._may_start_processes(unit) and durations._may_start_processes(integration)
    alone = durations.cpu_seconds(descendants=False)
    assert walks == [] and durations.cpu_seconds() >= alone + 2.0 and walks == [1]  # the control walks
