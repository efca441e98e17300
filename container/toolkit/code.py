"""The job's code: fetched into `<base>/code` and its requirements.txt installed, as the
sagemaker-training toolkit does before it launches anything (docs/sagemaker-contract.md).

Archives are extracted as strictly as tarfile's "data" filter (launcher.wire.code_archive): nothing
lands outside the code directory, devices and pipes are refused, also where Python lacks the filter.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from container.toolkit.console import log
from container.toolkit.contract import ContractError, TrainingEnv
from container.toolkit.failure_report import MESSAGE_LIMIT, fit, toolkit_error
from launcher.wire import code_archive, masking, pip_output, s3io
from launcher.wire.opt_ml import REQUIREMENTS_INSTALLED_ENV


class RequirementsError(Exception):
    """pip could not install the code's requirements.txt; str() is the failure file's text."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code


def fetch_code(env: TrainingEnv) -> None:
    """Put `sagemaker_submit_directory` into `<base>/code`, as the toolkit's
    `files.download_and_extract` does.

    An s3:// URI of a tar.gz (the SDK's sourcedir.tar.gz), a local path of a tar archive (the SDK
    with network isolation: `/opt/ml/input/data/code/sourcedir.tar.gz`; smlaunch's local runners),
    a local directory, or a single file. Nothing is fetched when `<base>/code` already holds files
    (code baked into the image, or SageMaker local mode's `/opt/ml/code` mount, which its SDK
    names as the submit directory in place of the `file://` URI it was given) or when there is no
    submit directory.
    """
    env.code_dir.mkdir(parents=True, exist_ok=True)
    source = env.hyperparameters.get("sagemaker_submit_directory")
    if not source:
        return
    source = str(source)
    if any(env.code_dir.iterdir()):
        log(f"{env.code_dir} is not empty: running the code in it, not {source}")
        return
    if source.startswith("s3://"):
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "sourcedir.tar.gz"
            _download_s3(source, archive, env.hyperparameters.get("sagemaker_region"))
            _extract(archive, env.code_dir)
        return
    path = Path(source)
    if path.is_dir():
        shutil.copytree(path, env.code_dir, dirs_exist_ok=True)
    elif path.is_file():
        if tarfile.is_tarfile(path):
            _extract(path, env.code_dir)
        else:
            shutil.copy2(path, env.code_dir)
    else:
        raise ContractError(
            f"sagemaker_submit_directory {source!r} is neither an s3:// URI nor an existing local "
            "path; give the s3:// URI of sourcedir.tar.gz, or a directory, tar archive or file in "
            "the container (a file:// URI is read by neither this bootstrap nor the toolkit)"
        )


def _download_s3(uri: str, dest: Path, region: str | None) -> None:
    import boto3  # only jobs whose code is on S3 pay for importing boto3

    bucket, key = s3io.split(uri)
    # boto3 honours AWS_ENDPOINT_URL itself; S3_ENDPOINT_URL is the toolkit's own override.
    client = boto3.client(
        "s3", region_name=region or None, endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None
    )
    client.download_file(bucket, key, str(dest))


def _extract(archive: Path, dest: Path) -> None:
    try:
        code_archive.extract(archive, dest)
    except code_archive.UnsafeArchive as exc:
        raise ContractError(str(exc)) from None


def install_requirements(env: TrainingEnv) -> None:
    """`python -m pip install -r requirements.txt` in the code directory, as the toolkit does
    before it launches anything (into this image's Python, which the script runs with).

    Not when smlaunch's process or Slurm runner has installed this very requirements.txt already,
    into the job's own environment whose Python runs this bootstrap (REQUIREMENTS_INSTALLED_ENV
    holds its sha256; launcher.local.jobenv): the hosts of a job do not each run pip."""
    path = env.code_dir / "requirements.txt"
    if not path.is_file():
        return
    installed = os.environ.get(REQUIREMENTS_INSTALLED_ENV)
    if installed and installed == hashlib.sha256(path.read_bytes()).hexdigest():
        log(f"requirements.txt is installed in the job's environment ({sys.prefix}): not installing it again")
        return
    cmd = [sys.executable, "-m", "pip", "install", "-r", "requirements.txt"]
    log(f"installing the code's requirements.txt: {shlex.join(cmd)}")
    proc = subprocess.run(cmd, cwd=env.code_dir, stderr=subprocess.PIPE, check=False)
    # An index URL in requirements.txt may hold a password; masked before lines are cut to fit.
    stderr = pip_output.without_noise(masking.installed()(proc.stderr.decode("utf-8", "replace")))
    sys.stderr.write(stderr)
    if proc.returncode:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        message = fit(["pip could not install requirements.txt; last lines of its output:"], lines, MESSAGE_LIMIT)
        raise RequirementsError(proc.returncode, toolkit_error("InstallRequirementsError", proc.returncode,
                                                               message, cmd))
