"""Non-finite steps, the in-process half (the training runs: tests/integration/test_nonfinite.py):
validation of nonfinite_policy and nonfinite_max, the skip file a rollback leaves, the count in
progress records."""

from __future__ import annotations

import json

import pytest

from launcher.wire.metric_lines import Progress
from launcher.wire.training.nonfinite import SKIP_FILE, SkipFileError, SkippedBatch, read_skips, write_skips
from tests.support.config_checks import issues_of, only_issue, paths
from tests.unit.test_config_rules import make_job

POLICY, BOUND = "hyperparameters.nonfinite_policy", "hyperparameters.nonfinite_max"


def test_validation_of_the_policy_and_its_bound(runtime_dir, user_script_dir):
    assert paths(make_job(runtime_dir, hp={"nonfinite_policy": "skip", "nonfinite_max": 5})) == []
    assert paths(make_job(runtime_dir, hp={"nonfinite_policy": "rollback", "checkpoint_freq": 10},
                          max_restarts=1)) == []
    assert paths(make_job(runtime_dir, hp={"nonfinite_policy": "fail"})) == []  # control: the default, said
    no_checkpoints = only_issue(make_job(runtime_dir, hp={"nonfinite_policy": "rollback"}, max_restarts=1), POLICY)[0]
    assert "checkpoint_freq is unset" in no_checkpoints.problem and "checkpoint_freq: N" in no_checkpoints.fix
    for hp in ({"nonfinite_max": 2}, {"nonfinite_policy": "fail", "nonfinite_max": 2}):
        assert "under fail (the default)" in only_issue(make_job(runtime_dir, hp=hp), BOUND)[0].problem
    typo = [str(i) for i in issues_of(make_job(runtime_dir, hp={"nonfinite_policy": "skipp"}))]
    assert any(POLICY in i and "did you mean 'skip'" in i for i in typo), typo
    assert BOUND in paths(make_job(runtime_dir, hp={"nonfinite_policy": "skip", "nonfinite_max": 0}))
    # a script of the user's own means what it likes by the keys
    assert not {POLICY, BOUND} & set(paths(make_job(user_script_dir, hp={"nonfinite_policy": "rollback",
                                                                         "nonfinite_max": 2},
                                                    image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1")))


def test_a_rollback_needs_a_restart(runtime_dir):
    """A rollback is a restart: without max_restarts the job would fail at its first non-finite step
    (as under fail) after logging that it rolls back."""
    for restarts in ({}, {"max_restarts": 0}):
        issue = only_issue(make_job(runtime_dir, hp={"nonfinite_policy": "rollback", "checkpoint_freq": 10},
                                    **restarts), POLICY)[0]
        assert "max_restarts is 0, so nothing restarts it" in issue.problem and "set max_restarts: N" in issue.fix
    # control: skip restarts nothing, so it needs no restart
    assert paths(make_job(runtime_dir, hp={"nonfinite_policy": "skip", "checkpoint_freq": 10})) == []


def test_the_skip_file_keeps_every_rollback(tmp_path):
    assert read_skips(tmp_path) == []  # no file: nothing skipped
    first = SkippedBatch(step=5, first_sample=8, samples=2, attempt=0, loss="nan", grad_norm="nan")
    second = SkippedBatch(step=9, first_sample=18, samples=2, attempt=1, loss="inf", grad_norm="nan")
    write_skips(tmp_path, [first, second])
    assert read_skips(tmp_path) == [first, second]
    assert [p.name for p in tmp_path.iterdir()] == [SKIP_FILE]  # no partial file left
    assert [first.covers(n) for n in (7, 8, 9, 10)] == [False, True, True, False]
    assert json.loads((tmp_path / SKIP_FILE).read_text())["skipped"][1]["first_sample"] == 18


@pytest.mark.parametrize("content", ["not json", '{"skipped": [{"step": 1}]}', "[]"])
def test_a_damaged_skip_file_is_an_error_naming_it(tmp_path, content):
    (tmp_path / SKIP_FILE).write_text(content)
    with pytest.raises(SkipFileError, match=rf"{SKIP_FILE} is not a record of skipped batches .*delete it"):
        read_skips(tmp_path)


def test_progress_shows_the_non_finite_steps():
    record = {"step": 40, "max_steps": 200, "loss": 2.5, "nonfinite_steps": 2}
    progress = Progress.of(record)
    assert progress.nonfinite_steps == 2 and "2 non-finite steps" in progress.text()
    assert Progress.of(progress.to_dict()) == progress  # progress.json round trip
    # control: a run without any (or under fail, where records have no count) says nothing of them
    for clean in ({**record, "nonfinite_steps": 0}, {k: v for k, v in record.items() if k != "nonfinite_steps"}):
        assert "non-finite" not in Progress.of(clean).text()
