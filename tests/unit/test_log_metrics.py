"""metric_definitions on log lines, with SageMaker's semantics: every definition searched in every
line, the first group read as a number, non-numbers adding nothing, the host prefix of a merged
local log not part of the line."""

from launcher.backends.log_metrics import metrics_from_lines


def test_the_first_group_of_each_match_is_a_value_numbered_per_metric():
    lines = ["algo-1 | step 1 loss=2.5 lr=0.001\n", "algo-2 | step 1 loss=2.4\n", "algo-1 | eval loss=nan?\n",
             "algo-1 | loss=abc\n", "algo-1 | step 2 loss=1.5e-1 lr=5e-4\n"]
    definitions = [{"Name": "loss", "Regex": r"loss=([-+0-9.eE]+)"}, {"Name": "lr", "Regex": r"lr=([0-9.e-]+)"},
                   {"Name": "anchored", "Regex": r"^step (\d+)"}, {"Name": "no group", "Regex": r"loss="},
                   {"Name": "broken", "Regex": r"loss=("}]
    records = metrics_from_lines(lines, definitions)
    assert [r["loss"] for r in records if "loss" in r] == [2.5, 2.4, 0.15]
    assert [r["point"] for r in records if "loss" in r] == [1, 2, 3]
    assert [r["lr"] for r in records if "lr" in r] == [0.001, 0.0005]
    assert [r["anchored"] for r in records if "anchored" in r] == [1, 1, 2]  # ^ is the script's line start
    assert not any("no group" in r or "broken" in r for r in records)
