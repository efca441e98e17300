"""A fifth backend for the tests: a row of launcher.config.backend_table (FAKE) with its class, its section,
its rules and what its hosts run, whose jobs live in memory (FakeBackend.jobs) and end when followed.

`fresh_launcher()` imports launcher afresh with the row in its table, as if the row were in the table's
source: the job schema (so both SDK faces and the CLI's job files) is built when launcher.config.job is
first imported. The modules of its start come back when it ends. The class imports launcher inside its
methods, so that it uses the modules of the graph it runs in (their errors are the ones the CLI catches).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field

HERE = __name__
CREATED, ENDED = "2026-11-03T10:00:00+00:00", "2026-11-03T10:00:10+00:00"


class FakeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    zone: str = Field("a", description="The fake engine's zone.")


def fake_rules(ctx) -> list:
    """The fake backend's own rule: zone z is refused."""
    from launcher.wire.training.issues import Issue

    section = ctx.job.fake
    if section is None or section.zone != "z":
        return []
    return [Issue("fake.zone", section.zone, "is the fake backend's own rule", "use another zone")]


def fake_image(job) -> str:
    return f"the fake engine's own image in zone {job.config.fake.zone if job.config.fake else 'a'}"


def _finished(name: str, **fields) -> dict:
    return {"TrainingJobName": name, "TrainingJobStatus": "Completed", "CreationTime": CREATED,
            "TrainingEndTime": ENDED, "Zone": "a", "Backend": "fake", **fields}


class FakeBackend:
    """What a row's class has (launcher.backends.base.Backend); a job's val_loss is its lr, so that a sweep
    has a best trial."""

    name = "fake"
    jobs: dict[str, dict] = {}

    def __init__(self, region: str | None = None, printer=None):
        self.region, self.print = region, printer or print

    @classmethod
    def reset(cls) -> None:
        cls.jobs = {"fake-1": _finished("fake-1")}

    @classmethod
    def create(cls, options):
        return cls(options.region, options.printer)

    def dryrun(self, job, job_name=None):
        from launcher.backends.base import JobDryRun

        zone = job.config.fake.zone if job.config.fake else "a"
        return JobDryRun(self.name, {"FakeJob": {"TrainingJobName": job_name or "fake-next", "Zone": zone}})

    def submit(self, job, job_name=None, *, detach=False) -> str:
        """A detached job has ended by the time anyone looks (a sweep's trials); a followed one ends in `wait`."""
        from launcher.wire import hyperparameters as wire

        cfg = job.config
        name = job_name or f"fake-{len(self.jobs) + 1}"
        self.jobs[name] = _finished(name, TrainingJobStatus="Completed" if detach else "InProgress",
                                    Zone=cfg.fake.zone if cfg.fake else "a", LossAt20=cfg.hyperparameters.lr,
                                    ResourceConfig={"InstanceType": cfg.instance_type, "InstanceCount": 1},
                                    HyperParameters=wire.encode(cfg.hyperparameters.raw()),
                                    EntryPoint=cfg.entry_point, SourceDir=str(job.base_dir / cfg.source_dir))
        return name

    def describe(self, name: str) -> dict:
        from launcher.backends.base import BackendError

        if name not in self.jobs:
            raise BackendError(f"no fake job {name!r}")
        return self.jobs[name]

    def how(self, record: dict) -> str:
        return f"fake, zone {record['Zone']}"

    def attach_fields(self, desc: dict) -> dict:
        return {"backend": self.name, "fake": {"zone": desc["Zone"]}, "entry_point": desc["EntryPoint"],
                "source_dir": desc["SourceDir"]}

    def wait(self, name: str, logs: bool = True, poll: float = 5.0) -> dict:
        if logs:
            self.logs(name)
        self.describe(name).update(TrainingJobStatus="Completed")
        return self.describe(name)

    def interrupted(self, name: str) -> None:
        return None

    def logs(self, name: str, follow: bool = False, poll: float = 5.0) -> None:
        self.print(f"[{name}] trained in zone {self.describe(name)['Zone']}")

    def stop(self, name: str) -> None:
        from launcher.backends.base import BackendError

        if self.describe(name)["TrainingJobStatus"] != "InProgress":
            raise BackendError(f"fake job {name} has already ended")
        self.describe(name)["TrainingJobStatus"] = "Stopped"

    def list(self, status=None, name_contains=None, max_results=50) -> list[dict]:
        return [{k: job.get(k) for k in ("TrainingJobName", "TrainingJobStatus", "CreationTime", "TrainingEndTime")}
                for job in self.jobs.values() if not status or job["TrainingJobStatus"] == status][:max_results]

    def exists(self, name: str) -> bool:
        return name in self.jobs

    def artifacts(self, name: str) -> dict[str, str]:
        return {"model.tar.gz": f"fake://{name}/model.tar.gz"}

    def progress(self, name: str):
        return None

    def checkpoint(self, name: str):
        from launcher.wire.checkpoints import Checkpoint

        return Checkpoint(20, f"fake://{name}/checkpoints/step-20")

    def metrics(self, name: str, logs=None):
        from launcher.backends.metric_records import JobMetrics

        loss = self.describe(name).get("LossAt20") or 0.5
        return JobMetrics(f"{self.name}:{name}", "the fake engine's records",
                          [{"step": 10, "loss": 2.0, "val_loss": 1.0 + loss},
                           {"step": 20, "loss": 1.5, "val_loss": loss}])

    def goodput(self, name: str):
        return None

    def restarts(self, name: str) -> list:
        return []

    def job_dir(self, name: str) -> None:
        return None

    def output_data_dirs(self, name: str) -> dict:
        from launcher.backends.base import FilesElsewhere

        raise FilesElsewhere(f"job {name}'s output data is in the fake engine's zone {self.describe(name)['Zone']}")


def interface() -> list[str]:
    """The methods of launcher.backends.base.Backend, which every row's class has."""
    from launcher.backends.base import Backend

    return sorted(name for name, value in vars(Backend).items()
                  if not name.startswith("_") and (callable(value) or isinstance(value, classmethod)))


def has_the_interface(cls) -> None:
    """Every method of the interface, taking its parameters first (a class may add optional ones)."""
    from launcher.backends.base import Backend

    assert len(interface()) > 15  # the interface as it is, not an empty list
    for method in interface():
        asked = list(inspect.signature(getattr(Backend, method)).parameters)
        assert callable(getattr(cls, method, None)), method
        assert list(inspect.signature(getattr(cls, method)).parameters)[:len(asked)] == asked, method


def fake_row():
    """The row, made with the table's class of the graph that asks."""
    from launcher.config.backend_table import BackendRow

    return BackendRow("fake", f"{HERE}:FakeBackend", "any", restarts="the fake engine restarts nothing",
                      settings=f"{HERE}:FakeSettings", settings_description="backend: fake: its zone",
                      rules=f"{HERE}:fake_rules", job_ids=True, in_job_store=False, sweeps=True,
                      image=f"{HERE}:fake_image")


def _launcher_modules() -> dict:
    return {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("launcher", "container")}


@contextmanager
def fresh_launcher() -> Iterator[None]:
    """launcher (and container, which imports it) imported afresh with the fake row in the table."""
    kept = _launcher_modules()
    for name in kept:
        del sys.modules[name]
    try:
        table = importlib.import_module("launcher.config.backend_table")
        table.BACKENDS = (*table.BACKENDS, fake_row())
        FakeBackend.reset()
        yield
    finally:
        for name in _launcher_modules():
            del sys.modules[name]
        sys.modules.update(kept)
