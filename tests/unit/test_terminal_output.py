"""What a job wrote reaches the terminal without control sequences but colour (issue 31, item 19):
`status` (FailureReason) and `logs` of a local job whose script printed a window title, an OSC-8
link, a screen clear and a terminal reset."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from launcher.cli.app import main
from launcher.local import store
from launcher.wire.terminal import printable

HOSTILE = ("boom\x1b]0;pwned title\x07 \x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\ "
           "\x1b[31mred\x1b[0m\x1b[2J\x1b[H\x1bc\x9b2J\x07 end")
SHOWN = "boom docs \x1b[31mred\x1b[0m end"


def _failed_job(home: Path) -> None:
    job = home / "jobs" / "esc-1"
    store.write(job, {"TrainingJobName": "esc-1", "TrainingJobStatus": "Failed", "SecondaryStatus": "Failed",
                      "FailureReason": HOSTILE})
    (job / "logs").mkdir()
    (job / "logs" / "job.log").write_text(f"algo-1 | {HOSTILE}\nalgo-1 | plain\ttabbed\n")


def test_status_and_logs_print_no_terminal_control_but_colour(home: Path) -> None:
    _failed_job(home)
    status = CliRunner().invoke(main, ["status", "esc-1"], color=True)
    assert status.exit_code == 1
    assert f"failure reason: {SHOWN}" in status.output
    logs = CliRunner().invoke(main, ["logs", "esc-1"], color=True)
    assert logs.exit_code == 0, logs.output
    assert logs.output.splitlines() == [f"algo-1 | {SHOWN}", "algo-1 | plain\ttabbed"]
    for output in (status.output, logs.output):
        assert "\x1b]" not in output and "\x1b[2J" not in output and "\x07" not in output and "\x9b" not in output


def test_colour_tabs_and_carriage_returns_stay() -> None:
    """Control: what a progress bar and coloured logs need is left as it is."""
    text = "\x1b[1;32mok\x1b[0m\t 50%|##\r100%|####"
    assert printable(text) == text


def test_an_attached_local_job_prints_its_hosts_lines_inert(capsys) -> None:
    """`smlaunch submit --local` and `fit()` print the hosts' lines as they come (console_printer)."""
    from launcher.local.supervise import console_printer

    console_printer("algo-1", "cyan", HOSTILE)
    assert capsys.readouterr().out == f"algo-1 | {SHOWN}\n"
