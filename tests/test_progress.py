"""tiltlab.progress: the one progress reporter (bar on a TTY, periodic lines elsewhere)."""

from __future__ import annotations

import io

import pytest

from tiltlab.progress import Progress, format_seconds, progress_mode, track


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_format_seconds():
    assert format_seconds(0) == "0s"
    assert format_seconds(59.4) == "59s"
    assert format_seconds(75.2) == "1m15s"
    assert format_seconds(3725) == "1h02m05s"


def test_mode_follows_tty_and_env(monkeypatch):
    monkeypatch.delenv("TILTLAB_PROGRESS", raising=False)
    assert progress_mode(TTY()) == "bar"
    assert progress_mode(io.StringIO()) == "lines"
    monkeypatch.setenv("TILTLAB_PROGRESS", "off")
    assert progress_mode(TTY()) == "off"
    monkeypatch.setenv("TILTLAB_PROGRESS", "Lines")
    assert progress_mode(TTY()) == "lines"
    monkeypatch.setenv("TILTLAB_PROGRESS", "loud")
    with pytest.raises(ValueError, match="TILTLAB_PROGRESS must be one of"):
        progress_mode(TTY())


def test_lines_mode_writes_at_most_one_line_per_interval_with_eta():
    clock, out = FakeClock(), io.StringIO()
    with Progress(10, "figures", "figure", mode="lines", stream=out, interval=30, clock=clock) as p:
        clock.t += 10
        p.update(1)  # 10 s after start: under the interval, nothing written
        assert out.getvalue() == ""
        clock.t += 30
        p.update(3, postfix="fig04")  # 40 s, 4/10: one line, ETA = 40/4 * 6 = 60 s
        assert out.getvalue().splitlines() == ["figures: 4/10 figure (40%) 40s elapsed, ETA 1m00s [fig04]"]
        clock.t += 5
        p.update(1)  # 5 s after the last line: nothing new
        assert len(out.getvalue().splitlines()) == 1
        clock.t += 15
        p.update(5)  # done: the final line comes from close(), not from this update
        assert len(out.getvalue().splitlines()) == 1
    lines = out.getvalue().splitlines()
    assert lines[-1] == "figures: 10/10 figure (100%) 1m00s elapsed [fig04]"
    assert len(lines) == 2


def test_unknown_total_and_zero_items():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(None, "shards", "shard", mode="lines", stream=out, interval=0, clock=clock)
    clock.t += 2
    p.update(2)
    p.close()
    p.close()  # idempotent
    assert out.getvalue().splitlines() == ["shards: 2 shard 2s elapsed", "shards: 2 shard 2s elapsed"]
    out2 = io.StringIO()
    Progress(0, "empty", mode="lines", stream=out2, interval=0).close()
    assert out2.getvalue() == ""  # nothing done, nothing to report


def test_off_mode_is_silent_and_bar_mode_draws(monkeypatch):
    out = io.StringIO()
    assert list(track(range(3), "x", mode="off", stream=out)) == [0, 1, 2]
    assert out.getvalue() == ""
    tty = TTY()
    assert list(track(range(3), "checks", mode="bar", stream=tty)) == [0, 1, 2]
    assert "checks" in tty.getvalue() and "3/3" in tty.getvalue()


def test_bad_input_is_one_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="total must be"):
        Progress(-1, "x", mode="off")
    with pytest.raises(ValueError, match="mode must be one of"):
        Progress(1, "x", mode="tty")
    with pytest.raises(ValueError, match="can only advance"):
        Progress(1, "x", mode="off").update(-1)
    monkeypatch.setenv("TILTLAB_PROGRESS_INTERVAL", "soon")
    with pytest.raises(ValueError, match="TILTLAB_PROGRESS_INTERVAL must be a number"):
        Progress(1, "x", mode="off")


def test_line_at_the_interval_boundary_zero_steps_and_write():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(4, "eval", "dataset", mode="lines", stream=out, interval=30, clock=clock)
    assert p.line() == "eval: 0/4 dataset (0%) 0s elapsed"  # no ETA before the first step
    p.update(0)  # a zero step is allowed and writes nothing
    clock.t += 30
    p.update(1)  # exactly one interval after the start: a line
    assert out.getvalue().splitlines() == ["eval: 1/4 dataset (25%) 30s elapsed, ETA 1m30s"]
    p.write("note")
    assert out.getvalue().splitlines()[-1] == "note"
    Progress(1, "x", mode="off", stream=out).write("hidden")
    assert "hidden" not in out.getvalue()
    tty = TTY()
    bar = Progress(2, "stage1", "shard", mode="bar", stream=tty)
    bar.update(1, postfix="shard 0")
    bar.write("between")
    bar.close()
    assert "shard 0" in tty.getvalue() and "between" in tty.getvalue()
