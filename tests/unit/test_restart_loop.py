"""max_restarts on SageMaker: the three hyperparameters it changes in the request
(launcher.wire.restart_loop), the restart loop shipped in the code archive, what validate says, and
the loop's environment in the container (container/toolkit/restart_loop.py). AWS's toolkit runs the
loop in tests/integration/test_toolkit_restarts.py."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from container.toolkit.contract import ContractError, read_training_env, sm_environment
from container.toolkit.restart_loop import loop_environment
from launcher.backends.sagemaker import SageMakerBackend
from launcher.backends.sourcedir import build_job_sourcedir
from launcher.config import validate_job
from launcher.wire import restart_loop
from launcher.wire.hyperparameters import decode, encode
from launcher.wire.opt_ml import write_opt_ml
from launcher.wire.restart_policy import RestartPolicy
from launcher.wire.training.issues import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ROLE = "arn:aws:iam::111122223333:role/SageMakerExecutionRole"
HP = {"model_preset": "llama3-tiny", "dataset_type": "synthetic", "max_steps": 4, "checkpoint_freq": 2}
TORCHRUN = {"torch_distributed": {"enabled": True}}


def _job(max_restarts: int = 0, **fields):
    data = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "role": ROLE, "region": "us-east-1",
            "instance_type": "ml.g5.xlarge", "output_path": "s3://bucket/output/", "hyperparameters": HP,
            "distribution": TORCHRUN, "max_restarts": max_restarts, **fields}
    return validate_job(data, base_dir=ROOT)


def _user_script(tmp_path: Path, **fields) -> dict:
    """The fields of a job that runs a user's own script (fit.py) on a PyTorch DLC."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "fit.py").write_text("print('hi')\n")
    return {"entry_point": "fit.py", "source_dir": str(code), "framework_version": "2.8.0", "py_version": "py312",
            "hyperparameters": {"epochs": 1}, **fields}


def _hyperparameters(job) -> dict:
    request = SageMakerBackend(region="us-east-1").dryrun(job, job_name="rs-1", build=False).request
    return decode(request["HyperParameters"])


# --- the request --------------------------------------------------------------------------------
def test_max_restarts_changes_three_hyperparameters_and_nothing_else():
    plain = SageMakerBackend(region="us-east-1").dryrun(_job(0), job_name="rs-1", build=False).request
    looped = SageMakerBackend(region="us-east-1").dryrun(_job(3), job_name="rs-1", build=False).request
    assert {k: v for k, v in looped.items() if k != "HyperParameters"} == \
        {k: v for k, v in plain.items() if k != "HyperParameters"}
    theirs, ours = decode(plain["HyperParameters"]), decode(looped["HyperParameters"])
    changed = {k for k in set(theirs) | set(ours) if theirs.get(k, "absent") != ours.get(k, "absent")}
    assert changed == {"sagemaker_program", "sagemaker_torch_distributed_enabled", "sagemaker_smlaunch_restart_loop"}
    assert ours["sagemaker_program"] == "_smlaunch/restart_loop.py"  # what the archive holds, below
    assert "sagemaker_torch_distributed_enabled" not in ours  # the toolkit then runs `python <program>`
    assert ours["sagemaker_smlaunch_restart_loop"] == {
        "max_restarts": 3, "replaced": {"sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True}}
    # the loop gives back exactly the SDK's hyperparameters
    assert restart_loop.sdk_hyperparameters(ours) == (theirs, RestartPolicy(3))
    assert restart_loop.sdk_hyperparameters(theirs) == (theirs, RestartPolicy())  # control: a job without the loop


def test_the_recovery_rules_travel_in_the_loops_hyperparameter_and_come_back(tmp_path):
    """A script's restart_on_exit_codes alone runs the loop (its restarts need no max_restarts)."""
    job = _job(0, **_user_script(tmp_path, restart_on_exit_codes=[75, 3, 75]))
    hps = _hyperparameters(job)
    assert hps["sagemaker_smlaunch_restart_loop"]["restart_on_exit_codes"] == [3, 75]
    assert restart_loop.sdk_hyperparameters(hps)[1] == RestartPolicy(0, (3, 75))
    both = _hyperparameters(_job(2, **_user_script(tmp_path, restart_on_job_errors=1)))
    assert restart_loop.sdk_hyperparameters(both)[1] == RestartPolicy(2, (), 1)
    watched = _hyperparameters(_job(0, **_user_script(tmp_path, hang_timeout=300)))  # the bootstrap watches it
    assert restart_loop.sdk_hyperparameters(watched)[1] == RestartPolicy(hang_timeout=300)
    assert restart_loop.KEY not in _hyperparameters(_job(0, **_user_script(tmp_path)))  # control: no rules


def test_a_plain_python_job_keeps_its_launch(tmp_path):
    """Without torch_distributed the toolkit ran `python <program>` anyway: only the program is replaced."""
    job = _job(1, **_user_script(tmp_path, distribution=None))
    hps = _hyperparameters(job)
    assert hps["sagemaker_smlaunch_restart_loop"] == {"max_restarts": 1, "replaced": {"sagemaker_program": "fit.py"}}
    assert "sagemaker_torch_distributed_enabled" not in restart_loop.sdk_hyperparameters(hps)[0]


@pytest.mark.parametrize("value", ["2", {"max_restarts": 2}, {"max_restarts": True, "replaced": {}},
                                   {"max_restarts": -1, "replaced": {}},
                                   {"max_restarts": 1, "replaced": {}, "restart_on_exit_codes": ["3"]}])
def test_a_damaged_loop_key_is_refused(value):
    with pytest.raises(ValueError, match="sagemaker_smlaunch_restart_loop=.*submit the job again"):
        restart_loop.sdk_hyperparameters({"sagemaker_program": "_smlaunch/restart_loop.py",
                                          restart_loop.KEY: value})


# --- the code archive ---------------------------------------------------------------------------
def _archive(job, tmp_path: Path) -> dict[str, bytes]:
    path = build_job_sourcedir(job, tmp_path / "sourcedir.tar.gz").path
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_archive_ships_the_loop_the_program_names(tmp_path):
    files = _archive(_job(1), tmp_path / "a")
    assert files["_smlaunch/restart_loop.py"] == restart_loop.STUB
    assert "_smlaunch/container/toolkit/restart_loop.py" in files
    compile(restart_loop.STUB, "restart_loop.py", "exec")  # the stub is Python
    assert "_smlaunch/restart_loop.py" not in _archive(_job(0), tmp_path / "b")  # control


def test_a_user_scripts_archive_ships_only_the_loop(tmp_path):
    user = _user_script(tmp_path)
    files = _archive(_job(1, **user), tmp_path / "a")
    shipped = {name.split("/")[1] + "/" + name.split("/")[2] for name in files if name.startswith("_smlaunch/")
               and name.count("/") > 1}
    assert shipped == {"container/__init__.py", "container/toolkit", "launcher/__init__.py", "launcher/wire"}
    assert "requirements.txt" not in files  # nothing to install: the loop needs the standard library only
    assert set(_archive(_job(0, **user), tmp_path / "b")) == {"fit.py"}  # control: nothing of smlaunch


def test_local_jobs_have_no_loop(tmp_path):
    """Local and Slurm jobs run smlaunch's bootstrap, which reads SMLAUNCH_MAX_RESTARTS itself."""
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "hyperparameters": HP, "max_restarts": 2}, base_dir=ROOT)
    assert "_smlaunch/restart_loop.py" not in _archive(job, tmp_path)


# --- validate -----------------------------------------------------------------------------------
def test_validate_says_what_it_means_on_sagemaker():
    notes = [i.problem for i in _job(2).notes + _job(2).warnings if i.path == "max_restarts"]
    assert any("restart loop" in n and "lost instance is SageMaker's" in n and "checkpoint_s3_uri resumes" in n
               for n in notes), notes
    assert any("differs from the SageMaker SDK's in three hyperparameters only" in n for n in notes), notes
    assert not [i for i in _job(0).notes + _job(0).warnings if i.path == "max_restarts"]  # control


@pytest.mark.parametrize("fields, refused", [
    ({"container_entry_point": ["python", "x.py"]}, "container_entry_point"),
    ({"distribution": {"mpi": {"enabled": True}}}, "distribution.mpi"),
])
def test_what_the_loop_cannot_run_is_refused(tmp_path, fields, refused):
    user = _user_script(tmp_path, **fields)
    with pytest.raises(ConfigError) as err:
        _job(1, **user)
    [issue] = [i for i in err.value.issues if i.path == "max_restarts"]
    assert refused in issue.problem + issue.fix
    _job(0, **user)  # control: the same job without restarts is valid


def test_a_code_directory_the_toolkit_takes_for_a_package_is_refused(tmp_path):
    """Issue 49: with a setup.py in source_dir, AWS's toolkit (sagemaker_training, read here) installs
    the directory as a package and runs the program as a module: the loop's program, a path, is none.
    The same code without setup.py, with setup.py left out by source_ignore, or without restarts, and
    a local run of it (smlaunch's bootstrap runs `python <program>`) are valid (the controls)."""
    from sagemaker_training import _entry_point_type

    user = _user_script(tmp_path, distribution=None)
    code = Path(user["source_dir"])
    loop_program = _hyperparameters(_job(1, **user))["sagemaker_program"]
    (code / "setup.py").write_text("from setuptools import setup\nsetup(name='fit')\n")
    assert _entry_point_type.get(str(code), loop_program) is _entry_point_type.PYTHON_PACKAGE
    with pytest.raises(ConfigError) as err:
        _job(1, **user)
    [issue] = [i for i in err.value.issues if i.path == "max_restarts"]
    assert "holds a setup.py" in issue.problem and "python -m _smlaunch/restart_loop`" in issue.problem
    assert "-e ./pkg" in issue.fix and "remove max_restarts" in issue.fix
    _job(0, **user)
    _job(1, **user, source_ignore=["setup.py"])
    _job(1, **{**user, "instance_type": "local", "output_path": None, "role": None})


# --- the container side -------------------------------------------------------------------------
def _sdk_and_loop_trees(tmp_path: Path) -> tuple[Path, Path]:
    trees = []
    for name, job in (("sdk", _job(0)), ("loop", _job(2))):
        base = tmp_path / name / "opt" / "ml"
        write_opt_ml(base, hyperparameters=encode(_hyperparameters(job)), current_host="algo-1",
                     hosts=["algo-1", "algo-2"], instance_type="ml.g5.xlarge", channels={})
        trees.append(base)
    return trees[0], trees[1]


def test_the_loop_runs_the_jobs_program_with_the_sdks_environment(tmp_path, monkeypatch):
    sdk, loop = _sdk_and_loop_trees(tmp_path)
    tree = read_training_env(loop, num_gpus=0)
    # as the toolkit reads the tree
    assert tree.user_entry_point == "_smlaunch/restart_loop.py" and not tree.torch_distributed
    env, policy = loop_environment(tree)
    assert policy == RestartPolicy(2)
    assert (env.user_entry_point, env.torch_distributed, env.distribution_hosts) == ("train.py", True,
                                                                                      ["algo-1", "algo-2"])
    ours, theirs = sm_environment(env), sm_environment(read_training_env(sdk, num_gpus=0))
    ours = {k: v.replace(str(loop), "BASE") for k, v in ours.items()}
    theirs = {k: v.replace(str(sdk), "BASE") for k, v in theirs.items()}
    assert ours == theirs  # every SM_* variable the ranks get is the SDK request's


def test_a_damaged_tree_is_a_contract_error(tmp_path):
    base = tmp_path / "opt" / "ml"
    write_opt_ml(base, hyperparameters=encode({"sagemaker_program": "_smlaunch/restart_loop.py",
                                               restart_loop.KEY: {"max_restarts": "two"}}),
                 current_host="algo-1", hosts=["algo-1"], instance_type="ml.g5.xlarge", channels={})
    with pytest.raises(ContractError, match=restart_loop.KEY):
        loop_environment(read_training_env(base, num_gpus=0))


def test_the_request_key_is_json_the_toolkit_reads():
    """The toolkit json.loads each value (launcher.wire.hyperparameters): the key must survive it."""
    raw = SageMakerBackend(region="us-east-1").dryrun(_job(1), job_name="rs-1", build=False).request["HyperParameters"]
    assert json.loads(raw[restart_loop.KEY])["max_restarts"] == 1
