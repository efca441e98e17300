"""The agent template imports the runtime with the cyclic collector off, then freezes what it imported
and turns the collector back on, also when the import fails (container.distributed.zygote,
container.uncollected)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import pytest

from container import uncollected
from container.distributed import zygote

RUNTIME = "container.distributed.forked_ranks"


class Collector:
    """gc as container.uncollected calls it: the calls, in order."""

    def __init__(self):
        self.calls: list[str] = []

    def disable(self):
        self.calls.append("disable")

    def freeze(self):
        self.calls.append("freeze")

    def enable(self):
        self.calls.append("enable")


class Runtime(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stands in for the runtime's module; notes the collector's calls made before it is executed
    (`fails`: its execution raises, as a broken import would)."""

    def __init__(self, collector: Collector, fails: bool = False):
        self.collector, self.fails, self.calls_before = collector, fails, None

    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self) if name == RUNTIME else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.calls_before = list(self.collector.calls)
        if self.fails:
            raise ImportError("a broken runtime")


@pytest.fixture
def collector(monkeypatch):
    recorded = Collector()
    monkeypatch.setattr(uncollected, "gc", recorded)
    monkeypatch.setattr(zygote, "_runtime", None)
    monkeypatch.delitem(sys.modules, RUNTIME, raising=False)
    monkeypatch.delattr(sys.modules["container.distributed"], "forked_ranks", raising=False)
    return recorded


def _installed(monkeypatch, runtime: Runtime) -> Runtime:
    monkeypatch.setattr(sys, "meta_path", [runtime, *sys.meta_path])
    return runtime


def test_the_runtime_is_imported_with_the_collector_off_then_frozen_and_the_collector_on(collector, monkeypatch):
    runtime = _installed(monkeypatch, Runtime(collector))
    zygote._import_runtime()
    assert runtime.calls_before == ["disable"]  # executed with the collector off
    assert collector.calls == ["disable", "freeze", "enable"]
    assert zygote._runtime is sys.modules[RUNTIME]


def test_a_failed_import_leaves_the_collector_on(collector, monkeypatch):
    runtime = _installed(monkeypatch, Runtime(collector, fails=True))
    with pytest.raises(ImportError, match="a broken runtime"):
        zygote._import_runtime()
    assert runtime.calls_before == ["disable"]
    assert collector.calls == ["disable", "freeze", "enable"]  # the control: the collector is not left off
    assert zygote._runtime is None
