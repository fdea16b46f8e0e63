"""`rotary demo` end to end: in this process through ``main`` (``run_main``), and through a real
``python -m rotary`` process where the process itself is the subject (an argparse error's exit status and
stderr as a shell sees them, a reader that leaves mid-output)."""

import subprocess
import sys

from helpers import cli_env, run_cli, run_main
from rotary.tools.cli import main


def run(*args):
    return run_cli(*args, ok=None, timeout=300)


def test_demo_runs_and_passes(tmp_path):
    out = run_main("demo", cwd=tmp_path, ok=None)
    assert out.returncode == 0, out.stderr
    assert "all checks passed" in out.stdout and "FAIL" not in out.stdout


def test_bad_argument_is_one_line_and_status_2(tmp_path):
    out = run_main("demo", "--head-dim", "7", cwd=tmp_path, ok=None)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "head_dim must be even" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_main("nosuchcommand", cwd=tmp_path, ok=None)
    assert (
        out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "invalid choice: 'nosuchcommand'" in out.stderr
    )


def test_main_returns_2_for_bad_values(capsys):
    assert main(["demo", "--head-dim", "7"]) == 2
    assert "head_dim must be even (channels rotate in pairs), got head_dim=7" in capsys.readouterr().err


def test_an_error_rotary_did_not_raise_keeps_its_traceback(monkeypatch, capsys):
    """Only rotary's own checks of the user's input become one-line errors; a ValueError or TypeError
    from elsewhere (torch, the standard library) is a bug and must reach the user with its traceback."""
    import pytest
    import torch

    from rotary.tools.commands import demo

    def torch_bug(args):
        return torch.ones(2) + "a"  # TypeError raised inside torch

    def stdlib_bug(args):
        return int("seven")  # ValueError raised by the standard library

    for bug, kind in ((torch_bug, TypeError), (stdlib_bug, ValueError)):
        monkeypatch.setattr(demo, "_demo", bug)
        with pytest.raises(kind):
            main(["demo"])
        assert "error:" not in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["demo", "--head-dim", "7"]) == 2  # rotary's own check is still one line


def test_missing_optional_package_is_one_line_not_a_traceback(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "rich", None)  # as if rotary were installed without [plot]
    monkeypatch.setitem(sys.modules, "rich.table", None)
    assert main(["inspect", "--head-dim", "16"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "needs the optional package 'rich'" in err
        and "pip install -e '.[plot]'" in err
        and "rotary[plot]" not in err
    )


def test_bad_counts_are_usage_errors(capsys):
    # the first through a real process (the exit status and stderr a shell sees); the others through
    # the same entry point in this process (argparse's exit 2), without starting torch again for each
    out = run("demo", "--seq-len", "0")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "must be a positive integer" in out.stderr
    for args in (("demo", "--seq-len", "-3"), ("bench", "--quick", "--threads", "-1")):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2, (args, err)
        assert err.strip().count("\n") == 0 and "must be a positive integer" in err and "Traceback" not in err


def test_closed_pipe_is_not_a_traceback():
    proc = subprocess.Popen(
        [sys.executable, "-m", "rotary", "inspect", "--head-dim", "1024", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    proc.stdout.read(100)  # the reader goes away long before the ~120 kB of JSON (twice a pipe buffer) is written
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and "Traceback" not in err, err
