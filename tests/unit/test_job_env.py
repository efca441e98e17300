"""A job's requirements.txt goes into a Python environment of the job's own, never into the launching
Python (issue 30; launcher/local/jobenv.py): the failure text, the environment's key, which runner
builds one where, and the bootstrap that does not install again. Here the tests that run in one
process; the jobs themselves are tests/integration/test_job_env.py."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from launcher.backends.sourcedir import build_sourcedir
from launcher.config.requirements import runtime_constraints
from launcher.local import jobenv, pip_failure
from launcher.local.process import ProcessRunner
from launcher.local.spec import LocalJobSpec
from launcher.slurm.runner import SlurmRunner
from launcher.wire.faults import ATTEMPT_ENV, FAULT_ENV, MAX_RESTARTS_ENV, Fault, fault_spec
from launcher.wire.opt_ml import REQUIREMENTS_INSTALLED_ENV
from tests.support.sourcedir import write

NOT_FOUND = [
    "Looking in links: /wheels",
    "Processing /wheels/smlaunch_own_probe-0.1-py3-none-any.whl (from -r requirements.txt (line 3))",
    "ERROR: Could not find a version that satisfies the requirement smlaunch-no-such-dist==9.9 (from versions: none)",
    "ERROR: No matching distribution found for smlaunch-no-such-dist==9.9",
]
CONFLICT = [
    "ERROR: Cannot install pydantic==1.10.13 because these package versions have conflicting dependencies.",
    "The conflict is caused by:",
    "    The user requested pydantic==1.10.13",
    "    The user requested (constraint) pydantic<3,>=2.6",
    "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/",
]


def test_a_pip_failure_names_the_requirement_it_stopped_at():
    lines = ["--no-index", "smlaunch_own_probe==0.1", "smlaunch-no-such-dist==9.9  # the one"]
    assert pip_failure.failing_requirement(NOT_FOUND, lines) == "smlaunch-no-such-dist==9.9"
    text = pip_failure.pip_failure(NOT_FOUND, lines)
    assert text.startswith("pip could not install 'smlaunch-no-such-dist==9.9' from requirements.txt; Could not "
                           "find a version that satisfies the requirement")
    assert text.endswith("ERROR: No matching distribution found for smlaunch-no-such-dist==9.9")
    # a name written another way (pip normalises it) is still found
    assert pip_failure.failing_requirement(["ERROR: No matching distribution found for my-pkg"], ["My_Pkg"]) == "My_Pkg"
    assert pip_failure.failing_requirement(["ERROR: something else"], ["numpy"]) is None
    failure = pip_failure.failure(1, "pip could not install requirements.txt")
    assert failure == 'InstallRequirementsError:\nExitCode 1\nErrorMessage "pip could not install requirements.txt"'


def test_a_pin_against_the_runtime_says_what_the_runtime_needs():
    text = pip_failure.pip_failure(CONFLICT, ["pydantic==1.10.13"], ["pydantic>=2.6,<3", "numpy>=1.24"])
    assert text.startswith("pip could not install 'pydantic==1.10.13' from requirements.txt; smlaunch's runtime "
                           "(the job's entry point imports container.trainer) needs pydantic>=2.6,<3: drop or "
                           "loosen that line, or run a script of your own; Cannot install pydantic==1.10.13")
    assert len(pip_failure.failure(1, text * 5)) <= 1024


def test_the_runtimes_constraints_are_smlaunchs_own_requirements():
    constraints = runtime_constraints()
    assert [pip_failure.distribution_name(c) for c in constraints] == ["pydantic", "numpy", "safetensors",
                                                                        "huggingface-hub", "torch"]
    assert "pydantic>=2.6,<3" in constraints


BASE = {"executable": "/venv/bin/python", "prefix": "/venv", "version": "3.11.7", "installed": "abc",
        "site_dirs": ["/venv/lib/python3.11/site-packages"], "pip": True}


def test_the_key_follows_the_requirements_the_files_they_name_and_the_launching_python(tmp_path):
    code = tmp_path / "code"
    write(code / "wheels" / "a-0.1-py3-none-any.whl", "one")
    reqs = b"--find-links ./wheels\na==0.1\n"
    write(code / "requirements.txt", reqs.decode())
    key = jobenv.environment_key(reqs, code, BASE)
    assert key == jobenv.environment_key(reqs, code, dict(BASE))  # the same inputs: the same environment
    assert key != jobenv.environment_key(reqs + b"b\n", code, BASE)
    assert key != jobenv.environment_key(reqs, code, {**BASE, "executable": "/other/bin/python"})
    assert key != jobenv.environment_key(reqs, code, {**BASE, "installed": "def"})  # packages changed there
    assert key != jobenv.environment_key(reqs, code, BASE, ["pydantic>=2.6,<3"])
    write(code / "wheels" / "a-0.1-py3-none-any.whl", "two")  # a rebuilt wheel of the same name
    assert key != jobenv.environment_key(reqs, code, BASE)


def test_the_key_follows_every_local_input_of_the_requirements(tmp_path):
    """An editable project, -r and -c files and what they name in turn: a change of any gives a new
    environment; a file the requirements do not name does not."""
    code = tmp_path / "code"
    write(code / "pkg" / "pyproject.toml", "[project]\nname = 'pkg'\n")
    write(code / "pkg" / "pkg" / "__init__.py", "VALUE = 1\n")
    write(code / "reqs" / "more.txt", "-c ../constraints.txt\n./local.whl\n")
    write(code / "constraints.txt", "numpy<3\n")
    write(code / "local.whl", "wheel one")
    write(code / "train.py", "print(1)\n")
    reqs = b"-e ./pkg\n-r reqs/more.txt\n"
    write(code / "requirements.txt", reqs.decode())
    key = jobenv.environment_key(reqs, code, BASE)
    write(code / "train.py", "print(2)\n")  # the control: not an input of the environment
    assert jobenv.environment_key(reqs, code, BASE) == key
    for path, text in (("pkg/pkg/__init__.py", "VALUE = 2\n"),
                       ("reqs/more.txt", "-c ../constraints.txt\n./local.whl\n\n"),
                       ("constraints.txt", "numpy<2\n"), ("local.whl", "wheel two")):
        write(code / path, text)
        assert jobenv.environment_key(reqs, code, BASE) != key, path
        key = jobenv.environment_key(reqs, code, BASE)


def site_packages(env: Path) -> Path:
    site = env / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    return site


def test_an_environment_whose_paths_are_gone_is_not_usable(tmp_path):
    """An editable install's project (direct_url.json) and a .pth file's directory must exist for an
    environment to be used; the launching interpreter's .pth is not the environment's to check."""
    env = tmp_path / "env"
    site = site_packages(env)
    project, added = tmp_path / "project", tmp_path / "added"
    project.mkdir()
    added.mkdir()
    write(site / "pkg-0.1.dist-info" / "direct_url.json",
          json.dumps({"url": project.as_uri(), "dir_info": {"editable": True}}))
    write(site / "__editable__.pkg-0.1.pth", f"{added}\n")
    write(site / "wheel-0.1.dist-info" / "direct_url.json",  # a wheel's origin: not needed once installed
          json.dumps({"url": (tmp_path / "gone.whl").as_uri(), "archive_info": {}}))
    write(site / jobenv.PTH_FILE, "import site; site.addsitedir('/nowhere')\n")
    write(env / "bin" / "python", "")
    write(env / jobenv.MARKER, json.dumps({"key": "k"}))
    assert jobenv.dangling_paths(env) == []
    assert jobenv._usable(env, "k") == env / "bin" / "python"
    project.rmdir()
    added.rmdir()
    assert jobenv.dangling_paths(env) == sorted([str(project), str(site / added)])
    assert jobenv._usable(env, "k") is None


def test_only_a_requirements_txt_that_names_something_needs_an_environment(tmp_path):
    src = tmp_path / "src"
    write(src / "job.py", "print(1)\n")
    write(src / "requirements.txt", "# nothing yet\n\n")
    bundle = build_sourcedir(tmp_path / "a.tar.gz", entry_point="job.py", source_dir=src)
    assert jobenv.archived_requirements(bundle.path) is None
    write(src / "requirements.txt", "# one\nnumpy\n")
    bundle = build_sourcedir(tmp_path / "b.tar.gz", entry_point="job.py", source_dir=src)
    assert jobenv.archived_requirements(bundle.path) == b"# one\nnumpy\n"
    write(tmp_path / "lone.py", "print(1)\n")
    lone = build_sourcedir(tmp_path / "c.tar.gz", entry_point=tmp_path / "lone.py", source_dir=None)
    assert jobenv.archived_requirements(lone.path) is None


def spec(tmp_path: Path, **fields) -> LocalJobSpec:
    job_dir = tmp_path / "jobs" / "j"
    return LocalJobSpec(name="j", job_dir=job_dir, hosts=["algo-1", "algo-2"], instance_type="local",
                        processes_per_host=1, hyperparameters={}, channels={}, environment={},
                        checkpoint_dir=job_dir / "checkpoints", max_run=60, **fields)


def test_the_hosts_run_the_jobs_environment_and_do_not_install_again(tmp_path, monkeypatch):
    monkeypatch.setenv(REQUIREMENTS_INSTALLED_ENV, "from-the-callers-shell")
    runner, job = ProcessRunner(), spec(tmp_path)
    assert runner.python() == sys.executable  # no requirements.txt: the launching Python itself
    assert REQUIREMENTS_INSTALLED_ENV not in runner.environment(job, "algo-1", 1234)
    env_dir = tmp_path / "envs" / "k"
    runner.job_env = jobenv.JobEnvironment(env_dir, env_dir / "bin" / "python", True, "ab" * 32)
    assert runner.python() == str(env_dir / "bin" / "python")
    assert runner.environment(job, "algo-2", 1234)[REQUIREMENTS_INSTALLED_ENV] == "ab" * 32
    assert runner.job_env.record() == {"Path": str(env_dir), "Python": str(env_dir / "bin" / "python"),
                                       "Reused": True, "RequirementsSha256": "ab" * 32}


def test_smlaunchs_control_variables_come_from_the_job_never_from_the_callers_shell(tmp_path, monkeypatch):
    """The shell's SMLAUNCH_FAULT_INJECTION armed every job, its SMLAUNCH_MAX_RESTARTS raised a job's
    budget and its SMLAUNCH_ATTEMPT spent it; a Slurm job's hosts get the same environment."""
    shell = {FAULT_ENV: fault_spec(Fault("exit", 0, 2)), MAX_RESTARTS_ENV: "1000000", ATTEMPT_ENV: "5",
             "SMLAUNCH_BOOTSTRAP_PID": "1", "MY_SETTING": "kept"}
    for name, value in shell.items():
        monkeypatch.setenv(name, value)
    job = spec(tmp_path)
    for runner in (ProcessRunner(), SlurmRunner()):
        runner._master_addr = "n1"  # as SlurmRunner.start places the rendezvous
        env = runner.environment(job, "algo-1", 1234)
        # control: the rest of the caller's environment is the job's
        assert [name for name in shell if name in env] == ["MY_SETTING"], env
    # the deliberate path: the job's own environment (validate warns), its max_restarts, the supervisor's attempt
    armed = spec(tmp_path, attempt=1)
    armed.environment = {FAULT_ENV: fault_spec(Fault("signal", 1, 3)), MAX_RESTARTS_ENV: "2"}
    env = ProcessRunner().environment(armed, "algo-1", 1234)
    assert (env[FAULT_ENV], env[MAX_RESTARTS_ENV], env[ATTEMPT_ENV]) == (armed.environment[FAULT_ENV], "2", "1")


def test_slurm_nodes_run_the_jobs_environment_unless_an_image_brings_python(tmp_path):
    job = spec(tmp_path)
    runner = SlurmRunner({"python": "/shared/py/bin/python"})
    runner.placement = {"algo-1": "n1", "algo-2": "n2"}  # as the allocation would give them
    assert runner.srun_command(job, "algo-1")[-4:] == ["/shared/py/bin/python", "-m", "container", "train"]
    runner.job_env = jobenv.JobEnvironment(job.job_dir / "env", job.job_dir / "env" / "bin" / "python", False, "x")
    assert runner.srun_command(job, "algo-2")[-4:] == [str(job.job_dir / "env" / "bin" / "python"), "-m", "container",
                                                "train"]
    in_image = SlurmRunner({"container_image": "smlaunch.sqsh"})
    # the image's bootstraps install requirements.txt into the image's Python, as on SageMaker
    assert in_image.setup(job, print, lambda: False) is None and in_image.job_env is None


def test_the_bootstrap_installs_only_what_the_runner_has_not(tmp_path, monkeypatch):
    from container.toolkit import code
    from container.toolkit.contract import read_training_env
    from tests.support.bootstrap import host_tree

    base = host_tree(tmp_path, "algo-1", ["algo-1"], {"sagemaker_program": "job.py"})
    env = read_training_env(base, num_gpus=0)
    write(env.code_dir / "requirements.txt", "numpy\n")
    ran = []
    monkeypatch.setattr(code.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or type(
        "Done", (), {"returncode": 0, "stderr": b""})())
    monkeypatch.setenv(REQUIREMENTS_INSTALLED_ENV, hashlib.sha256(b"numpy\n").hexdigest())
    code.install_requirements(env)
    assert ran == []  # installed in the job's environment before the hosts started
    monkeypatch.setenv(REQUIREMENTS_INSTALLED_ENV, hashlib.sha256(b"another file\n").hexdigest())
    code.install_requirements(env)
    assert ran == [[sys.executable, "-m", "pip", "install", "-r", "requirements.txt"]]
