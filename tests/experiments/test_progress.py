"""Progress: rich bars on a terminal, plain lines otherwise, nothing off rank 0."""

import io

from helpers import run_main
from rotary.tools.experiments.progress import Reporter


class Clock:
    """A stand-in for time.perf_counter that advances 3 s per call, so progress lines are due."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 3.0
        return self.now


def test_plain_lines_when_not_a_terminal(monkeypatch):
    monkeypatch.setattr("rotary.tools.experiments.progress.time.perf_counter", Clock())
    out = io.StringIO()
    reporter = Reporter(stream=out)
    assert not reporter.interactive  # a StringIO is no terminal
    with reporter.task("train rope", total=20) as task:
        for i in range(20):
            task.advance(loss=5.0 - i / 10)
    lines = out.getvalue().splitlines()
    assert lines[0] == "train rope: 0/20"
    assert lines[-1].startswith("train rope: done 20/20 loss 3.1")
    middle = lines[1:-1]
    assert 3 <= len(middle) <= 10 and all("s left)" in line for line in middle)
    assert "\x1b" not in out.getvalue()  # no terminal escapes in a log


def test_rich_bar_on_a_terminal():
    out = io.StringIO()
    reporter = Reporter(stream=out, interactive=True)
    with reporter.task("evaluate rope", total=4) as task:
        for _ in range(4):
            task.advance(scaling="yarn")
    text = out.getvalue()
    assert "evaluate rope" in text and "4/4" in text and "yarn" in text


def test_silent_off_rank_zero():
    out = io.StringIO()
    reporter = Reporter(enabled=False, stream=out)
    with reporter.task("train rope", total=3) as task:
        task.advance()
    reporter.log("hello")
    assert out.getvalue() == ""


def test_experiment_is_a_subcommand_of_rotary(tmp_path):
    """In process: ``python -m rotary`` itself, in a subprocess, is tested in test_cli.py (it reaches the same
    ``main``)."""
    proc = run_main("experiment", "--help", cwd=tmp_path)
    for flag in ("--preset", "--encodings", "--scalings", "--resume", "--data", "--device", "--out", "--eval-lengths"):
        assert flag in proc.stdout
