"""A user's script's heartbeat (launcher.wire.heartbeat) and the bootstrap's watch of it
(container.toolkit.script_watch): once a rank has beaten, only beats say the script moves."""

from __future__ import annotations

import os

from container.toolkit import script_watch
from launcher.wire.heartbeat import HEARTBEAT_DIR_ENV, beat, newest_beat


def test_a_beat_touches_its_ranks_file_where_the_bootstrap_asks_for_beats_and_nothing_elsewhere(monkeypatch, tmp_path):
    monkeypatch.delenv(HEARTBEAT_DIR_ENV, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.chdir(tmp_path)
    beat()  # the control: no hang_timeout, or not under smlaunch
    assert list(tmp_path.iterdir()) == [] and newest_beat(tmp_path) is None
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path))
    beat()
    assert [p.name for p in tmp_path.iterdir()] == ["rank-3"]
    os.utime(tmp_path / "rank-3", ns=(5, 5))
    (tmp_path / "rank-0").touch()
    os.utime(tmp_path / "rank-0", ns=(9, 9))
    assert newest_beat(tmp_path) == 9  # any rank's newest


def test_once_a_script_beats_its_cpu_and_output_no_longer_say_it_moves(monkeypatch, tmp_path):
    ticks = iter(range(10**6))
    monkeypatch.setattr(script_watch, "cpu_ticks", lambda pid: next(ticks))  # a rank that spins on the CPU
    monkeypatch.setattr(script_watch, "written", lambda log_dir: 0)
    (tmp_path / "beats").mkdir()
    watch = script_watch.ScriptWatch(1, 10.0, tmp_path, lambda: 0, lambda s: None, tmp_path / "beats")
    assert watch.mark() != watch.mark() and watch.silence == script_watch.SILENT  # before its first beat: CPU
    (tmp_path / "beats" / "rank-0").touch()
    assert watch.mark() == watch.mark() and watch.silence == script_watch.UNBEATING  # spinning, but not beating
    (tmp_path / "beats" / "rank-1").touch()
    os.utime(tmp_path / "beats" / "rank-1", ns=(2 * 10**18, 2 * 10**18))
    assert watch.mark() == ("beat", 2 * 10**18)  # a beat moves it
    # the control: a watch without a heartbeat directory goes by the CPU, as before
    plain = script_watch.ScriptWatch(1, 10.0, tmp_path, lambda: 0, lambda s: None)
    assert plain.mark() != plain.mark() and plain.silence.failure == "used no CPU and wrote nothing"
