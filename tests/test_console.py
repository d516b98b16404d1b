"""The reporter's plain progress lines, for output that is not a terminal (a log file)."""

import io

from rich.console import Console

from polyturn.console import RichReporter


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_log_file_gets_progress_lines_while_a_phase_runs_not_only_at_the_end():
    buf, clock = io.StringIO(), FakeClock()
    rep = RichReporter(Console(file=buf, force_terminal=False, width=200), log_interval=3600.0, clock=clock)
    rep.start("bc", 48)
    for _ in range(12):  # a quarter: lines at 10% (5 of 48) and 20% (10 of 48)
        clock.t += 45.0
        rep.advance()
    mid = buf.getvalue().splitlines()
    assert mid[0] == "[progress] bc 0/48 (0%) elapsed 0:00:00"
    assert "[progress] bc 5/48 (10%) elapsed 0:03:45 eta 0:32:15" in mid
    assert any(line.startswith("[progress] bc 10/48 (20%)") for line in mid)
    assert len(mid) == 3  # the hour's interval never passes here: a line only at each tenth
    for _ in range(36):
        rep.advance()
    rep.close()
    lines = buf.getvalue().splitlines()
    assert lines[-1] == "[progress] bc 48/48 (100%) elapsed 0:09:00"
    assert len(lines) == 11  # the start and each tenth, nothing drawn again at close


def test_a_slow_phase_prints_at_least_every_interval():
    buf, clock = io.StringIO(), FakeClock()
    rep = RichReporter(Console(file=buf, force_terminal=False, width=200), log_interval=60.0, clock=clock)
    rep.start("eval bc", 1000)
    for _ in range(3):
        clock.t += 61.0
        rep.advance()
    rep.close()
    lines = buf.getvalue().splitlines()
    assert [line.split(" elapsed")[0] for line in lines] == [
        "[progress] eval bc 0/1000 (0%)", "[progress] eval bc 1/1000 (0%)",
        "[progress] eval bc 2/1000 (0%)", "[progress] eval bc 3/1000 (0%)"]


def test_a_terminal_gets_the_bar_and_no_plain_lines():
    buf = io.StringIO()
    rep = RichReporter(Console(file=buf, force_terminal=True, width=120))
    rep.start("bc", 4)
    for _ in range(4):
        rep.advance()
    rep.close()
    out = buf.getvalue()
    assert "[progress]" not in out and "4/4" in out


def test_a_long_step_inside_a_phase_prints_its_own_count_only_when_the_interval_passes():
    buf, clock = io.StringIO(), FakeClock()
    rep = RichReporter(Console(file=buf, force_terminal=False, width=200), log_interval=60.0, clock=clock)
    rep.start("rl", 5)
    fast = rep.sub("sampling", 48)  # a fast iteration (the demo's): no line of its own
    for _ in range(48):
        clock.t += 0.1
        fast(1)
    rep.advance()
    assert [line.split(" elapsed")[0] for line in buf.getvalue().splitlines()] == [
        "[progress] rl 0/5 (0%)", "[progress] rl 1/5 (20%)"]
    slow = rep.sub("sampling", 48)  # a SmolLM2 iteration: a line each time the interval has passed
    for _ in range(48):
        clock.t += 25.0
        slow(1)
    rep.close()
    lines = buf.getvalue().splitlines()[2:]
    assert lines[0] == "[progress] rl 1/5: sampling 3/48 elapsed 0:01:15"
    assert lines[-2] == "[progress] rl 1/5: sampling 45/48 elapsed 0:18:45"
    assert lines[-1] == "[progress] rl 1/5: sampling 48/48 elapsed 0:20:00"  # its end, 75 s after the last line
    assert len(lines) == 16
    # A short step that meets the minute mark prints that line only, not its end 3 s later (a fast iteration's update).
    n = len(buf.getvalue().splitlines())
    clock.t += 58.0  # 58 s after the last line
    short = rep.sub("update", 4)
    for _ in range(4):
        clock.t += 1.0
        short(1)
    assert [line.split(" elapsed")[0] for line in buf.getvalue().splitlines()[n:]] == ["[progress] rl 1/5: update 2/4"]


def test_a_terminal_shows_a_step_as_a_second_bar_that_goes_when_the_next_starts():
    buf = io.StringIO()
    rep = RichReporter(Console(file=buf, force_terminal=True, width=120))
    rep.start("rl", 2)
    step = rep.sub("sampling", 3)
    for _ in range(3):
        step(1)
    assert [t.description for t in rep.progress.tasks if t.visible] == ["rl", "  sampling"]
    rep.advance()
    rep.sub("sampling", 3)
    assert len(rep.progress.tasks) == 2  # the finished step's bar was removed, not stacked
    rep.close()
    assert "[progress]" not in buf.getvalue()
