"""Secrets never in the clear: the masking policy by name and by value, the private job files, and
a local job with secrets planted everywhere whose every output and file is searched for them.
Here the tests that start processes; the rest are tests/unit/test_secrets.py."""

from __future__ import annotations

import tarfile
from pathlib import Path

import yaml

from launcher.local import store
from tests.support.local_jobs import cli_env, smlaunch
from tests.support.masking_cases import MUST_HOLD, mode, secrets_in_files

# --- by name --------------------------------------------------------------------------------------


# --- by value -------------------------------------------------------------------------------------


# --- private files --------------------------------------------------------------------------------


# --- a local job with secrets everywhere ----------------------------------------------------------

ENVIRONMENT = {"HF_TOKEN": "hf_envTokenE2E1", "AWS_SECRET_ACCESS_KEY": "awsSecretE2E/abc+xyz",
               "GITHUB_PAT": "ghp_patValueE2E456", "MY_PASS": "myPassValue789",
               "DATABASE_URL": "postgresql://admin:DbUrlPassw0rd@db.internal:5432/app"}
HYPERPARAMETERS = {"hf_token": "hf_hpTokenValue321", "wandb_api_key": "wandbKeyValue654",
                   "db_password": "dbPasswordValue987", "smtp_pass": "smtpPassValue111", "lr": 0.1}
SECRETS = [*(v for k, v in ENVIRONMENT.items() if k != "DATABASE_URL"), "DbUrlPassw0rd",
           *(v for k, v in HYPERPARAMETERS.items() if k != "lr")]
CREDENTIAL_FILES = [".aws/credentials", ".ssh/id_rsa", "id_ed25519", "tls.key", ".netrc", ".git-credentials",
                    ".npmrc", ".pypirc", ".env.local", "credentials.json", "cert.p12", "cert.pfx"]
CREDENTIAL_MARK = "CREDENTIAL-FILE-CONTENT"

SCRIPT = """\
import os, sys, time
token = os.environ["HF_TOKEN"]
sys.stderr.write("stderr " + token[:6])  # cut in two: two reads of the pipe
sys.stderr.flush()
time.sleep(0.3)
sys.stderr.write(token[6:] + "\\n")
sys.stderr.flush()
time.sleep(0.2)  # stdout and stderr reach the console through two threads: keep their lines apart
print("rank", os.environ.get("RANK", "-"), "args", sys.argv[1:], flush=True)
print("env", token, os.environ["AWS_SECRET_ACCESS_KEY"], os.environ["GITHUB_PAT"], os.environ["MY_PASS"],
      os.environ["DATABASE_URL"], flush=True)
print(f"\\r 50%|## {token}", end="", flush=True)
print(f"\\r100%|#### {token}", flush=True)
open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.txt"), "w").write("weights\\n")
if os.environ.get("FAIL"):
    raise RuntimeError(f"login refused for {token} at {os.environ['DATABASE_URL']}")
"""


def secret_job(tmp_path: Path, name: str, **fields) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "job.py").write_text(SCRIPT)
    for rel in CREDENTIAL_FILES:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(f"{CREDENTIAL_MARK} {rel}\n")
    data = {"entry_point": "job.py", "source_dir": str(src), "instance_type": "local", "instance_count": 1,
            "base_job_name": name, "environment": ENVIRONMENT, "hyperparameters": HYPERPARAMETERS, **fields}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def leaks(data: bytes) -> list[str]:
    text = data.decode("utf-8", "replace")
    return [s for s in [*SECRETS, CREDENTIAL_MARK] if s in text]


def check_job_files(home: Path, job: Path) -> None:
    assert mode(job) == 0o700
    assert secrets_in_files(home, [*SECRETS, CREDENTIAL_MARK]) == {}  # every file and archive member
    held = {}
    for path in sorted(p for p in home.rglob("*") if p.is_file() and p.name in MUST_HOLD):
        assert mode(path) == 0o600 and mode(path.parent) == 0o700, path
        held[path.name] = leaks(path.read_bytes())
    # the files that must hold the secrets do (so the search above would have found them elsewhere)
    assert set(SECRETS[-4:]) <= set(held["hyperparameters.json"])
    assert set(SECRETS) <= set(held["spec.json"])
    with tarfile.open(job / "sourcedir.tar.gz") as tar:  # the code, without the credential files
        names = [m.name for m in tar.getmembers() if m.isfile()]
    assert names == ["job.py"]  # a user script: nothing of smlaunch either


def test_a_job_with_secrets_everywhere_shows_none(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home)
    proc = smlaunch("submit", str(secret_job(tmp_path, "secrets", processes_per_host=2,
                                             distribution={"torch_distributed": {"enabled": True}})),
                    env=env, timeout=240)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-4000:]
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    # the script's lines came through, masked: both ranks, the progress bar, the split stderr write
    assert console.count("env **** **** **** **** postgresql://admin:****@db.internal:5432/app") == 2
    assert "'--hf_token', '****'" in console and "stderr ****" in console and "100%|#### ****" in console
    assert "--db_password '****' --hf_token '****' --lr 0.1 --smtp_pass '****' --wandb_api_key '****'" in console
    assert "left out of sourcedir.tar.gz as credential files: .aws/, .env.local, .git-credentials" in console
    assert leaks(console.encode()) == []
    for command in (("status", name), ("status", name, "--json"), ("logs", name)):
        shown = smlaunch(*command, env=env)
        assert shown.returncode == 0 and leaks((shown.stdout + shown.stderr).encode()) == [], command
    job = home / "jobs" / name
    check_job_files(home, job)
    with tarfile.open(job / "output" / "model.tar.gz") as tar:  # the artifacts were searched too
        assert tar.getnames() == ["weights.txt"]


def test_a_failing_job_reports_its_error_without_the_secrets(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home)
    proc = smlaunch("submit", str(secret_job(tmp_path, "fails", environment={**ENVIRONMENT, "FAIL": "1"})),
                    env=env, timeout=240)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 1, console[-4000:]
    assert "RuntimeError: login refused for **** at postgresql://admin:****@db.internal:5432/app" in console
    assert "stderr ****" in console
    assert leaks(console.encode()) == []
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    record = store.read(name, home / "jobs")
    assert "login refused for ****" in record["FailureReason"] and leaks(record["FailureReason"].encode()) == []
    status = smlaunch("status", name, env=env)
    assert "failure reason: AlgorithmError" in status.stdout and leaks(status.stdout.encode()) == []
    check_job_files(home, home / "jobs" / name)

