"""metric_definitions on log lines, with SageMaker's semantics: every definition searched in every
line, the first group read as a number, non-numbers adding nothing, the host prefix of a merged
local log not part of the line."""

from launcher.backends.log_metrics import LogMetrics, metrics_from_lines


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


# A regex that backtracks: each x may go to either x+, so a line of x's without the y is 2^n tries.
BACKTRACKS = {"Name": "slow", "Regex": r"((x+x+)+)y"}


def test_a_regex_that_backtracks_is_given_up_after_its_time_limit_and_the_others_read_on():
    lines = ["loss=1.0\n", "x" * 3000 + "\n", "loss=0.5 xxy\n"]
    found = LogMetrics([BACKTRACKS, {"Name": "loss", "Regex": r"loss=([0-9.]+)"}])
    found.feed(lines)
    assert [r["loss"] for r in found.records if "loss" in r] == [1.0, 0.5]  # control: the other one reads on
    assert not any("slow" in r for r in found.records)  # given up on line 2, so line 3's match is not read
    assert "searched line 2 of the log for over 0.5 s" in found.given_up["slow"]
    assert "slow: its Regex searched line 2" in found.note()


def test_a_log_is_read_on_from_where_the_last_read_stopped(tmp_path):
    log = tmp_path / "job.log"
    log.write_bytes(b"algo-1 | loss=3\r\nalgo-1 | loss=2\ralgo-1 | los")  # \r ends a line, as in text mode
    found = LogMetrics([{"Name": "loss", "Regex": r"^loss=([0-9.]+)"}])
    found.read(log, final=False)
    assert [r["loss"] for r in found.records] == [3.0]  # the line being written waits for its newline
    with log.open("ab") as f:
        f.write(b"s=1\nalgo-1 | loss=0.5")
    found.read(log, final=False)
    found.read(log)  # the job ended: its last line counts without a newline
    assert [(r["point"], r["loss"]) for r in found.records] == [(1, 3.0), (2, 2.0), (3, 1.0), (4, 0.5)]
    found.read(log)  # control: nothing read twice
    assert len(found.records) == 4
