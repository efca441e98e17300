"""scripts/changed-tests.sh, which picks the integration and e2e modules `make check` runs: those a
branch changed or added since it left main, those changed in the work tree, new ones not yet
committed; never a unit module (make check runs them all), a deleted module or one left as it was.
~1 s: git in a temporary repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def changed(repo: Path, *base: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(repo / "scripts" / "changed-tests.sh"), *base], cwd=repo, capture_output=True,
                          text=True)


def test_the_modules_a_branch_and_its_work_tree_change(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "changed-tests.sh", repo / "scripts")
    for module in ("integration/test_kept.py", "integration/test_edited.py", "e2e/test_committed.py",
                   "integration/test_gone.py", "unit/test_unit.py"):
        (repo / "tests" / module).parent.mkdir(parents=True, exist_ok=True)
        (repo / "tests" / module).write_text("x = 1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "main")
    git(repo, "checkout", "-qb", "work")
    assert changed(repo).stdout == ""  # the control: nothing differs from main
    (repo / "tests" / "e2e" / "test_committed.py").write_text("x = 2\n")
    (repo / "tests" / "unit" / "test_unit.py").write_text("x = 2\n")
    git(repo, "commit", "-qam", "branch")
    (repo / "tests" / "integration" / "test_edited.py").write_text("x = 2\n")
    (repo / "tests" / "integration" / "test_new.py").write_text("x = 1\n")
    (repo / "tests" / "integration" / "test_gone.py").unlink()
    out = changed(repo)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["tests/e2e/test_committed.py", "tests/integration/test_edited.py",
                                  "tests/integration/test_new.py"]
    wrong = changed(repo, "no-such-ref")
    assert wrong.returncode == 2 and "no-such-ref is not a commit" in wrong.stderr
