"""A job's requirements.txt in an environment of its own, as a user runs it (issue 30): `smlaunch
submit --local` from a Python environment of the test's own (tests/support/own_scripts.py), whose
installed packages must be the same after a job whose requirements.txt adds a package and pins an
older pydantic than smlaunch uses; the job's environment is built once, reused by the next job, and
a pip failure or a stop ends the job before any rank starts. Here the tests that start processes;
the rest are tests/unit/test_job_env.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from launcher.config import validate_job
from launcher.local import jobenv, store
from launcher.local.spec import LocalJobSpec
from launcher.local.supervise import Supervisor
from launcher.wire.masking import Masker
from tests.support.local_jobs import cli_env
from tests.support.own_scripts import (
    PINNED,
    PROBE,
    installed,
    job_name,
    launching_environment,
    requirements,
    script_job,
    ship_wheels,
    submit,
)
from tests.support.train_runs import ROOT

# The script checks, on every rank, what it runs in; and says it in the model directory.
CHECK = """
import json, os, sys
import pydantic, smlaunch_own_probe
rank = os.environ["RANK"]
seen = {"pydantic": pydantic.VERSION, "probe": smlaunch_own_probe.VALUE, "prefix": sys.prefix,
        "executable": sys.executable}
print(f"rank {rank} runs in {sys.prefix} with pydantic {pydantic.VERSION}", flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(seen, f)
"""


@pytest.fixture(scope="module")
def launching(tmp_path_factory) -> Path:
    """The Python a user launches smlaunch from (its packages: the suite's, through a .pth file)."""
    return launching_environment(tmp_path_factory.mktemp("launching") / "venv")


def test_requirements_go_into_the_jobs_environment_never_the_launching_one(tmp_path, launching, own_wheels):
    home = tmp_path / "home"
    reqs = requirements(f"{PROBE[0]}=={PROBE[1]}", f"{PINNED[0]}=={PINNED[1]}")
    job = script_job(tmp_path, CHECK, reqs, wheels=own_wheels)
    before = installed(launching)
    assert before["prefix"] == str(launching.parent.parent)
    assert (PINNED[0], PINNED[1]) not in {(n, v) for n, v, _ in before["distributions"]}

    proc = submit(launching, job, home)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    name = job_name(proc)
    record = store.read(name, home / "jobs")
    env = record["JobEnvironment"]
    assert env["Reused"] is False and Path(env["Path"]).parent == home / "envs"
    # every rank of both hosts ran in the job's environment and saw the pinned version and the new package
    hosts = home / "jobs" / name / "hosts"
    seen = [json.loads((hosts / host / "model" / f"rank-{r}.json").read_text()) for host, r in (("algo-1", 0),
                                                                                             ("algo-2", 1))]
    assert seen == [{"pydantic": PINNED[1], "probe": 42, "prefix": env["Path"], "executable": env["Python"]}] * 2
    log = (home / "jobs" / name / "logs" / "job.log").read_text()
    assert log.count(" -m pip install ") == 1  # once for the job, before the hosts: not once per host
    assert log.count("requirements.txt is installed in the job's environment") == 2
    assert f"requirements.txt: built the job environment {env['Path']} in " in proc.stdout

    # the launching environment is as it was, and smlaunch still runs in it
    assert installed(launching) == before
    validated = subprocess.run([str(launching), "-m", "launcher.cli", "validate", str(job)], env=cli_env(home),
                               cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert validated.returncode == 0, validated.stderr

    # the next job with the same requirements.txt reuses the environment
    again = submit(launching, script_job(tmp_path, CHECK, reqs, name="again", wheels=own_wheels), home)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    second = store.read(job_name(again), home / "jobs")["JobEnvironment"]
    assert second == {**env, "Reused": True}
    assert f"requirements.txt: reusing the job environment {env['Path']}" in again.stdout
    assert " -m pip install " not in again.stdout
    assert installed(launching) == before
    assert sorted(p.name for p in (home / "envs").iterdir()) == sorted([Path(env["Path"]).name,
                                                                        Path(env["Path"]).name + ".lock"])


def test_a_requirement_pip_cannot_install_fails_the_job_before_any_rank(tmp_path, launching, own_wheels):
    home = tmp_path / "home"
    job = script_job(tmp_path, "raise SystemExit('never runs')\n",
                     requirements(f"{PROBE[0]}=={PROBE[1]}", "smlaunch-no-such-dist==9.9"), wheels=own_wheels)
    proc = submit(launching, job, home)
    assert proc.returncode == 1
    record = store.read(job_name(proc), home / "jobs")
    reason = record["FailureReason"]
    assert reason.startswith("AlgorithmError: InstallRequirementsError:\nExitCode 1\nErrorMessage \"pip could not "
                             "install 'smlaunch-no-such-dist==9.9' from requirements.txt; ")
    assert "No matching distribution found for smlaunch-no-such-dist==9.9" in reason
    assert record["HostExitCodes"] == {} and "algo-1 |" not in proc.stdout  # no host was started
    assert "never runs" not in proc.stdout + proc.stderr
    # the half-built environment is gone; nothing is left to reuse
    assert [p.name for p in (home / "envs").iterdir() if not p.name.endswith(".lock")] == []


def test_a_pin_smlaunchs_runtime_cannot_run_with_is_a_clear_error(tmp_path, launching, own_wheels):
    """train.py with pydantic 1 would crash every rank at import: pip's constraints say why first."""
    home = tmp_path / "home"
    src = tmp_path / "rt"
    src.mkdir()
    (src / "train.py").write_bytes((ROOT / "entrypoints" / "train.py").read_bytes())
    (src / "requirements.txt").write_text(requirements(f"{PINNED[0]}=={PINNED[1]}"))
    ship_wheels(src, own_wheels)
    job = tmp_path / "rt.yaml"
    job.write_text(yaml.safe_dump({"entry_point": "train.py", "source_dir": str(src), "instance_type": "local",
                                   "hyperparameters": {"model_preset": "llama3-tiny", "dataset_type": "synthetic",
                                                       "max_context_width": 32, "max_steps": 1}}))
    before = installed(launching)
    proc = submit(launching, job, home)
    assert proc.returncode == 1
    reason = store.read(job_name(proc), home / "jobs")["FailureReason"]
    assert reason.startswith("AlgorithmError: InstallRequirementsError:\nExitCode 1\nErrorMessage \"pip could not "
                             f"install '{PINNED[0]}=={PINNED[1]}' from requirements.txt; smlaunch's runtime (the "
                             "job's entry point imports container.trainer) needs pydantic>=")
    assert "The user requested (constraint) pydantic" in reason and "algo-1 |" not in proc.stdout
    assert installed(launching) == before


def test_a_stop_while_the_environment_is_built_ends_the_build(tmp_path, own_wheels, monkeypatch):
    """A stop (here SIGTERM's record) during pip ends pip and the job, Stopped, with no host started."""
    home = tmp_path / "home"
    job = validate_job(yaml.safe_load(script_job(tmp_path, CHECK, requirements("smlaunch-slow==1"), wheels=own_wheels)
                                      .read_text()))
    from launcher.local.prepare import prepare
    from launcher.local.process import ProcessRunner

    runner = ProcessRunner()
    spec = prepare(job, runner, root=home / "jobs", log=lambda _line: None)
    supervisor = Supervisor(spec, runner, printer=None)
    real = jobenv._run_pip

    def slow_pip(cmd, cwd, env, log, masker, should_stop):  # a pip that takes its time: a stop comes first
        threading.Timer(0.5, lambda: supervisor.signals.append(15)).start()
        return real([sys.executable, "-c", "import time; time.sleep(60)"], cwd, env, log, masker, should_stop)

    monkeypatch.setattr(jobenv, "_run_pip", slow_pip)
    record = supervisor.run()
    assert record["TrainingJobStatus"] == "Stopped" and record["HostExitCodes"] == {}
    assert "stopped while the job's environment was being built" in (spec.job_dir / "logs" / "job.log").read_text()
    assert [p.name for p in (home / "envs").iterdir() if not p.name.endswith(".lock")] == []


def test_a_runner_whose_setup_fails_records_the_failure_and_starts_nothing(tmp_path):
    job_dir = tmp_path / "jobs" / "j"
    store.write(job_dir, {"TrainingJobName": "j", "TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting"})
    spec = LocalJobSpec(name="j", job_dir=job_dir, hosts=["algo-1"], instance_type="local", processes_per_host=1,
                        hyperparameters={}, channels={}, environment={}, checkpoint_dir=job_dir / "checkpoints",
                        max_run=60)

    class Failing:
        name, started = "failing", False

        def setup(self, spec, log, should_stop):
            log("building")
            raise jobenv.RequirementsFailed('InstallRequirementsError:\nExitCode 1\nErrorMessage "pip: no"')

        def start(self, spec):
            self.started = True
            return []

        def cleanup(self, spec):
            pass

    runner = Failing()
    record = Supervisor(spec, runner, printer=None).run()
    assert not runner.started
    assert record["TrainingJobStatus"] == "Failed"
    assert record["FailureReason"] == 'AlgorithmError: InstallRequirementsError:\nExitCode 1\nErrorMessage "pip: no"'


def test_two_jobs_building_one_environment_at_once_build_it_once(tmp_path, launching, own_wheels):
    """The second waits on the first's lock, then reuses what the first built."""
    code = tmp_path / "code"
    code.mkdir()
    reqs = requirements(f"{PROBE[0]}=={PROBE[1]}").encode()
    (code / "requirements.txt").write_bytes(reqs)
    ship_wheels(code, own_wheels)
    base = jobenv.interpreter(str(launching))
    key = jobenv.environment_key(reqs, code, base)
    logs: list[list[str]] = [[], []]
    built: list = [None, None]

    def build(i: int) -> None:
        built[i] = jobenv.ensure_environment(tmp_path / "envs" / key[:24], key=key, requirements=reqs, code_dir=code,
                                             base=base, log=logs[i].append)

    threads = [threading.Thread(target=build, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(env.reused for env in built) == [False, True]
    assert sum(" -m pip install " in line for lines in logs for line in lines) == 1
    waited = logs[[env.reused for env in built].index(True)]
    assert waited in ([], [f"requirements.txt: another job is building {tmp_path / 'envs' / key[:24]}; waiting "
                           "for it"])  # it may have come after the build
    probe = subprocess.run([str(built[0].python), "-c", f"import {PROBE[0]}, sys; print(sys.prefix)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == str(built[0].path)


EDITABLE = """
import ownpkg
print(f"ownpkg {ownpkg.VALUE} from {ownpkg.__file__}", flush=True)
"""


def test_an_editable_requirement_of_the_code_outlives_the_build(tmp_path, launching):
    """`-e ./pkg` points into the environment's own copy of the code, not the build's temporary one:
    the job imports it, the next job reuses the environment, and one whose copy is gone is rebuilt."""
    home = tmp_path / "home"
    job = script_job(tmp_path, EDITABLE, "--no-index\n-e ./pkgsrc\n", instance_count=1)
    src = tmp_path / "job-src"
    (src / "pkgsrc" / "ownpkg").mkdir(parents=True)
    (src / "pkgsrc" / "ownpkg" / "__init__.py").write_text("VALUE = 7\n")
    (src / "pkgsrc" / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=61"]\n'
                                                   'build-backend = "setuptools.build_meta"\n'
                                                   '[project]\nname = "ownpkg"\nversion = "0.1"\n')
    offline = {"PIP_NO_BUILD_ISOLATION": "0"}  # setuptools from the launching environment: no index needed

    first = submit(launching, job, home, env=offline)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    env = Path(store.read(job_name(first), home / "jobs")["JobEnvironment"]["Path"])
    assert f"ownpkg 7 from {env / 'code' / 'pkgsrc' / 'ownpkg' / '__init__.py'}" in first.stdout

    again = submit(launching, job, home, env=offline)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert f"reusing the job environment {env}" in again.stdout and "ownpkg 7 from" in again.stdout

    shutil.rmtree(env / "code" / "pkgsrc")  # what the editable install points at is gone: never reused so
    third = submit(launching, job, home, env=offline)
    assert third.returncode == 0, third.stdout[-4000:] + third.stderr[-4000:]
    assert (f"requirements.txt: the job environment {env} points at {env / 'code' / 'pkgsrc'}, which no longer "
            "exist: building it again") in third.stdout
    assert "ownpkg 7 from" in third.stdout and "reusing" not in third.stdout


def test_pips_ignored_location_warnings_stay_out_of_the_jobs_log(tmp_path):
    """This machine's pip configuration names local indexes without most packages: pip says so per
    package, which says nothing about the job (the Makefile's installs hide it the same way)."""
    lines: list[str] = []
    noise = ("WARNING: Location 'file:///opt/pypi-more/simple/tabulate/' is ignored: it is neither a file nor a "
             "directory.")
    other = "WARNING: Retrying after connection broken"  # a warning that says something: kept
    say = f"print({noise!r}); print({other!r}); print('Successfully installed tabulate-0.10.0')"
    code, tail = jobenv._run_pip([sys.executable, "-c", say], tmp_path, {}, lines.append, Masker(), lambda: False)
    assert code == 0
    assert lines[1:] == [f"pip | {other}", "pip | Successfully installed tabulate-0.10.0"]
    assert noise not in tail
