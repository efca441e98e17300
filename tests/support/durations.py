"""What the suite costs, and the order its modules start in.

Each test's seconds (setup, call and teardown) are summed per module and per folder, and `make test`
ends with them: the time of tests/unit, tests/integration and tests/e2e, and with `--durations=N`
the N slowest modules beside pytest's N slowest tests, so that a module added later shows what it
costs. `--durations-file PATH` writes the modules' seconds as JSON (`make test` writes
build/test-durations.json); `make durations` copies that file to tests/durations.json, the recorded
costs that tests/conftest.py's scheduler starts the longest modules by. Beside it go each module's CPU
seconds (test-durations-cpu.json), each test's seconds and CPU seconds (test-durations-tests.json),
for finding what to make cheaper, and each module's worker, start and end (test-durations-timeline.json);
the summary says when each worker ran its last test, so that a worker idling at the end beside a
long last module shows (the order to mend).

Seconds are wall time, and on a loaded 2-core machine a module's seconds also hold the other
worker's load. What a module costs everyone is the CPU it uses: each phase of each test also counts
the CPU seconds of the worker and of every process under it, reaped (RUSAGE_CHILDREN: a job's CLI,
supervisor, torchrun and ranks) or still running (/proc: a fork server's ranks, which the server
reaps, count while it lives), and the summary prints them beside the seconds. A container's
processes are the engine's children, not the worker's: the container tests' CPU is mostly not
counted, nor a process that left the worker's tree.
"""

from __future__ import annotations

import glob
import json
import os
import resource
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

RECORDED = Path(__file__).resolve().parents[1] / "durations.json"
FOLDERS = ("unit", "integration", "e2e")


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def folder_of(module: str) -> str:
    parts = Path(module).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def recorded(path: Path = RECORDED) -> dict[str, float]:
    """Module -> seconds, as the last `make durations` recorded them ({} without the file)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def estimate(known: dict[str, float]):
    """module -> the seconds it should take: as recorded, or for a module not yet recorded its
    folder's average module (a new module starts among its peers, not last)."""
    by_folder: dict[str, list[float]] = defaultdict(list)
    for module, seconds in known.items():
        by_folder[folder_of(module)].append(seconds)
    mean = {folder: sum(values) / len(values) for folder, values in by_folder.items()}
    return lambda module: known.get(module, mean.get(folder_of(module), 0.0))


def longest(workqueue: dict[str, Iterable[str]], seconds) -> str:
    """The scope (a module, or a group of modules that run together) of the most recorded seconds,
    among a scheduler's scopes of test ids."""
    return max(workqueue, key=lambda scope: sum(seconds(module) for module in {module_of(n) for n in workqueue[scope]}))


def cpu_seconds(descendants: bool = True) -> float:
    """CPU seconds (user and system) of this process, of the children it has reaped so far, and
    (`descendants`) of the processes under it that still run (with what they reaped)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    running = _running_descendants() if descendants else 0.0
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + running


def _may_start_processes(item: pytest.Item) -> bool:
    """tests/unit starts none (its conftest refuses them): the /proc walk, a glob over each of the
    worker's threads, was 5% of the unit tests' CPU there, for nothing."""
    return folder_of(module_of(item.nodeid)) != "unit"


def _running_descendants() -> float:
    """CPU seconds of the live processes under this one: each one's utime, stime, cutime and cstime
    (its own and its reaped children's), found through Linux's /proc/<pid>/task/<tid>/children, so
    that a test without processes reads a few small files, not every process's (0 without them)."""
    ticks, todo = 0, _children(os.getpid())
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command, which may hold spaces
        ticks += sum(int(value) for value in fields[11:15])
        todo += _children(pid)
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):  # each thread's children
        try:
            with open(path) as f:
                found += [int(child) for child in f.read().split()]
        except OSError:
            continue
    return found


_PHASE_START = pytest.StashKey[dict]()


def _phase(item: pytest.Item, when: str):
    item.stash.setdefault(_PHASE_START, {})[when] = cpu_seconds(_may_start_processes(item))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    yield from _phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    yield from _phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    yield from _phase(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """The phase's CPU seconds in its report's user_properties (xdist carries them to the controller)."""
    outcome = yield
    start = item.stash.get(_PHASE_START, {}).get(call.when)
    if start is not None:
        outcome.get_result().user_properties.append(("cpu_s", cpu_seconds(_may_start_processes(item)) - start))


def cpu_of(report: pytest.TestReport) -> float:
    return sum(value for name, value in report.user_properties if name == "cpu_s")


class Costs:
    """Seconds per module and tests per folder, from the reports of every test (on the controller
    of an xdist run, which receives every worker's reports)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)
        self.per_test: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # test id -> [seconds, CPU seconds]
        self.spans: dict[str, list] = {}  # module -> [worker, first start, last stop] (epoch seconds)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = module_of(report.nodeid)
        self.seconds[module] += report.duration
        self.cpu[module] += cpu_of(report)
        self.per_test[report.nodeid][0] += report.duration
        self.per_test[report.nodeid][1] += cpu_of(report)
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[folder_of(module)] += 1
        node = getattr(report, "node", None)  # xdist's worker, on the controller
        worker = node.gateway.id if node is not None else "main"
        span = self.spans.setdefault(module, [worker, report.start, report.stop])
        span[1], span[2] = min(span[1], report.start), max(span[2], report.stop)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        write = terminalreporter.write_line
        terminalreporter.section("seconds and CPU seconds per folder (tests' setup, call and teardown, all workers)")
        folder_seconds: dict[str, float] = defaultdict(float)
        folder_cpu: dict[str, float] = defaultdict(float)
        for module, seconds in self.seconds.items():
            folder_seconds[folder_of(module)] += seconds
            folder_cpu[folder_of(module)] += self.cpu[module]
        for folder in sorted(folder_seconds, key=lambda f: FOLDERS.index(f) if f in FOLDERS else len(FOLDERS)):
            write(f"{folder_seconds[folder]:9.1f} s  {folder_cpu[folder]:9.1f} cpu s  {self.tests[folder]:5d} tests"
                  f"  tests/{folder}")
        write(f"{sum(folder_seconds.values()):9.1f} s  {sum(folder_cpu.values()):9.1f} cpu s"
              f"  {sum(self.tests.values()):5d} tests  in all")
        self._write_idle_tails(write)
        slowest = self.config.option.durations
        if slowest:
            terminalreporter.section(f"slowest {slowest} modules (seconds, CPU seconds)")
            for module, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1])[:slowest]:
                write(f"{seconds:9.1f} s  {self.cpu[module]:9.1f} cpu s  {module}")
        path = self.config.option.durations_file
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps({m: round(s, 1) for m, s in sorted(self.seconds.items())}, indent=0)
                                  + "\n")
            cpu = Path(path).with_name(Path(path).stem + "-cpu.json")  # beside it: what each module used
            cpu.write_text(json.dumps({m: round(c, 1) for m, c in sorted(self.cpu.items())}, indent=0) + "\n")
            tests = Path(path).with_name(Path(path).stem + "-tests.json")  # each test's [seconds, CPU seconds]
            tests.write_text(json.dumps({t: [round(s, 2), round(c, 2)] for t, (s, c) in sorted(self.per_test.items())},
                                        indent=0) + "\n")
            # each module's worker and its start and end, in seconds from the first test's start
            begin = self._first_start()
            timeline = Path(path).with_name(Path(path).stem + "-timeline.json")
            timeline.write_text(json.dumps({m: [w, round(a - begin, 1), round(b - begin, 1)] for m, (w, a, b)
                                            in sorted(self.spans.items(), key=lambda kv: kv[1][1])}, indent=0) + "\n")

    def _first_start(self) -> float:
        return min(start for _, start, _ in self.spans.values())

    def _write_idle_tails(self, write) -> None:
        """When each worker ran its last test, from the first test's start: a worker that ended
        long before the others idled beside the last modules (the scheduler's order to mend)."""
        ends: dict[str, tuple[float, str]] = {}
        for module, (worker, _, stop) in self.spans.items():
            if stop > ends.get(worker, (0.0, ""))[0]:
                ends[worker] = (stop, module)
        if len(ends) < 2:
            return
        begin = self._first_start()
        last = max(stop for stop, _ in ends.values())
        write("workers' last tests (s from the first test's start; idle at the end):")
        for worker, (stop, module) in sorted(ends.items()):
            write(f"  {worker}: {stop - begin:7.1f} s (idle {last - stop:6.1f} s), its last module {module}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-file", metavar="PATH", default=None,
                     help="write each module's seconds as JSON (make durations records them in tests/durations.json)")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller
        config.pluginmanager.register(Costs(config), "smlaunch-costs")
