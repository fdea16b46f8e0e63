"""``rotary experiment`` end to end on the tiny preset: the files, their shapes, bit-identical reruns,
``--resume`` after a kill, and every bad input as one line and exit status 2."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rotary.cli import main
from rotary.experiments.config import PRESETS, SCALINGS, default_encodings

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
L = PRESETS["tiny"]["train_length"]
LENGTHS = [L, 2 * L, 4 * L, 8 * L]


def experiment(out: Path, *flags: str) -> int:
    return main(["experiment", "--preset", "tiny", "--device", "cpu", "--out", str(out), *flags])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "tiny"
    assert experiment(out) == 0
    return out


def numbers(run: Path) -> dict:
    """Everything a run measured (not its wall times or dates)."""
    results = json.loads((run / "results.json").read_text())
    return {"rows": results["results"], "losses": [m["losses"] for m in results["models"]], "spread": results["spread"]}


def test_writes_every_file_with_the_expected_shapes(tiny_run):
    for name in ["config.json", "results.json", "results.csv", "report.md"]:
        assert (tiny_run / name).is_file(), name
    for figure in ["perplexity", "position_buckets", "passkey"]:
        assert (tiny_run / "figures" / f"{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tiny_run / "figures" / f"{figure}.svg").read_text().lstrip().startswith("<?xml")
    results = json.loads((tiny_run / "results.json").read_text())
    encodings = list(default_encodings())
    models = encodings + ["rope-2"]
    assert [m["name"] for m in results["models"]] == models
    for name in models:
        assert (tiny_run / "models" / name / "checkpoint.pt").is_file()
    rows = results["results"]
    # every encoding as trained at 4 lengths, plus the RoPE model under the 4 other scalings, plus the repeat
    expected = len(encodings) * 4 + (len(SCALINGS) - 1) * 4 + 4
    assert len(rows) == expected
    keys = {(r["model"], r["scaling"], r["eval_length"]) for r in rows}
    assert len(keys) == expected
    assert {(r["scaling"]) for r in rows if r["model"] == "rope"} == set(SCALINGS)
    for r in rows:
        assert r["eval_length"] in LENGTHS and r["factor"] == r["eval_length"] / L
        assert r["perplexity"] > 1 and r["bits_per_byte"] > 0 and r["passkey_trials"] == 50
        assert list(r["buckets"]) == [f"{a}-{b}" for a, b in zip([0, *LENGTHS[:-1]], LENGTHS)]
        filled = [v is not None for v in r["buckets"].values()]
        assert sum(filled) == LENGTHS.index(r["eval_length"]) + 1
    with open(tiny_run / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == expected
    assert set(table[0]) >= {"model", "scaling", "eval_length", "perplexity", "bits_per_byte", "passkey_accuracy", f"loss_{4 * L}_{8 * L}"}
    for key in ("config", "data", "environment", "timings", "spread", "separation", "wall_seconds"):
        assert key in results
    assert results["environment"]["torch"] == torch.__version__
    assert results["data"]["source"] == "pydoc_data.topics"
    assert [s["eval_length"] for s in results["spread"]] == LENGTHS
    learned = next(m for m in results["models"] if m["name"] == "learned")
    assert learned["untrained_rows_unchanged"] is True and learned["trained_rows_changed"] is True
    report = (tiny_run / "report.md").read_text()
    for needle in ["figures/perplexity.png", "figures/position_buckets.png", "figures/passkey.png", "Train Short, Test Long",
                   "The Impact of Positional Encoding", "Positional Interpolation", "YaRN", "RoPE + YaRN", "NoPE",
                   f"rows {L}..{8 * L - 1} never receive a gradient"]:
        assert needle in report, needle
    config = json.loads((tiny_run / "config.json").read_text())
    assert config["command"].startswith("rotary experiment --preset tiny --device cpu")


def test_the_hybrid_encodings_run_through_the_experiment(tmp_path):
    out = tmp_path / "hybrids"
    assert experiment(out, "--encodings", "rope_alibi,rope_relative", "--spread-encodings", "rope_alibi", "--scalings",
                      "none,yarn", "--eval-lengths", f"{L},{2 * L}", "--steps", "4", "--passkey-trials", "5") == 0
    results = json.loads((out / "results.json").read_text())
    assert [m["name"] for m in results["models"]] == ["rope_alibi", "rope_relative", "rope_alibi-2"]
    # both rotate q and k, so both are also evaluated under the scalings; the repeat only as trained
    keys = sorted((r["model"], r["scaling"], r["eval_length"]) for r in results["results"])
    assert keys == sorted([(m, s, e) for m in ("rope_alibi", "rope_relative") for s in ("none", "yarn") for e in (L, 2 * L)]
                          + [("rope_alibi-2", "none", e) for e in (L, 2 * L)])
    assert all(math.isfinite(r["perplexity"]) and r["perplexity"] > 1 for r in results["results"])
    assert [s["eval_length"] for s in results["spread"]] == [L, 2 * L]
    report = (out / "report.md").read_text()
    assert "RoPE + ALiBi + YaRN" in report and "RoPE + learned bias" in report


def test_same_command_same_numbers(tiny_run, tmp_path):
    assert experiment(tmp_path / "again") == 0
    assert numbers(tmp_path / "again") == numbers(tiny_run)


def test_resume_after_a_kill_ends_with_the_numbers_of_an_uninterrupted_run(tiny_run, tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rotary", "experiment", "--preset", "tiny", "--device", "cpu", "--out", str(out)],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
    )
    first = out / "models" / "none" / "checkpoint.pt"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.exists(), proc.stderr.read().decode()
    assert not (out / "results.json").exists()  # killed while training: not a finished run
    steps = {p.parent.name: torch.load(p, weights_only=True)["step"] for p in (out / "models").glob("*/checkpoint.pt")}
    assert len(steps) < 6 or min(steps.values()) < PRESETS["tiny"]["steps"], steps
    assert main(["experiment", "--preset", "tiny", "--device", "cpu", "--resume", str(out)]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["models"][0]["resumed_at_step"] > 0
    assert numbers(out) == numbers(tiny_run)


# ------------------------------------------------------------------------------------------------
# bad input: one line on stderr, exit status 2, and no run directory left behind


def bad(capsys, out: Path, *flags: str, preset: str = "tiny") -> str:
    try:
        code = main(["experiment", "--preset", preset, "--device", "cpu", "--out", str(out), *flags])
    except SystemExit as exc:  # argparse's own checks (types, choices) exit from parse_args
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert not out.exists() or not any(out.iterdir()), "bad input must leave nothing behind"
    return lines[0]


def test_bad_data_files(capsys, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "binary.bin").write_bytes(bytes([0xFF, 0xFE, 0x00]) * 10000)
    (tmp_path / "short.txt").write_text("too short " * 50)
    out = tmp_path / "out"
    assert "no such file" in bad(capsys, out, "--data", str(tmp_path / "nope.txt"))
    assert "is a directory" in bad(capsys, out, "--data", str(tmp_path))
    assert "is empty" in bad(capsys, out, "--data", str(tmp_path / "empty.txt"))
    assert "not UTF-8" in bad(capsys, out, "--data", str(tmp_path / "binary.bin"))
    message = bad(capsys, out, "--data", str(tmp_path / "short.txt"))
    assert "has 500 bytes, too short" in message and "at least 8960 bytes" in message


def test_empty_encodings_are_an_error_not_the_defaults(capsys, tmp_path):
    message = bad(capsys, tmp_path / "o", "--encodings", "")
    assert "--encodings is empty; choose from" in message and "rope_alibi" in message
    assert "--encodings is empty" in bad(capsys, tmp_path / "o", "--encodings", " , ")


@pytest.mark.parametrize("package", ["matplotlib", "rich"])
def test_missing_report_packages_stop_the_run_before_training(capsys, tmp_path, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # `import matplotlib` now raises ImportError
    out = tmp_path / "o"
    code = experiment(out)
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"needs the optional package '{package}'" in err and "pip install -e '.[plot]'" in err
    assert not out.exists(), "nothing trained, nothing written"


def test_unknown_names_list_the_known_ones(capsys, tmp_path):
    message = bad(capsys, tmp_path / "o", "--encodings", "rope,xpoz")
    assert "unknown --encodings 'xpoz'" in message and "alibi" in message and "rope_relative" in message
    message = bad(capsys, tmp_path / "o", "--scalings", "none,yarm")
    assert "unknown --scalings 'yarm'; known: none, linear, ntk, dynamic, yarn" in message


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--train-length", "0"], "--train-length: must be a positive integer, got 0"),
        (["--train-length", "-3"], "--train-length: must be a positive integer, got -3"),
        (["--eval-lengths", "112,0"], "--eval-lengths: must be positive integers, got 0"),
        (["--train-length", "8192"], "longest evaluation length is 65536 tokens, but models are built for at most 32768"),
        (["--eval-lengths", "112,40000"], "longest evaluation length is 40000 tokens"),
        (["--train-length", "64"], "too short for a passkey sample, which needs at least 110 tokens"),
        (["--eval-lengths", "224,448"], "--eval-lengths must include the training length L = 112 and nothing shorter"),
        (["--eval-lengths", "56,112,224"], "(every length is measured against L), got 56,112,224; e.g. --eval-lengths 112,224,448,896"),
        (["--device", "cuda"], "--device cuda: CUDA is not available"),
    ],
)
def test_bad_lengths_and_device(capsys, tmp_path, flags, needle):
    if "cuda" in flags and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert needle in bad(capsys, tmp_path / "o", *flags)


def test_out_not_writable(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    assert "is not writable" in bad(capsys, blocker / "run", "--steps", "2")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    code = main(["experiment", "--preset", "tiny", "--out", str(tmp_path / "full")])
    assert code == 2 and "already holds files" in capsys.readouterr().err


def test_world_size_that_does_not_divide_the_batch(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert "torchrun runs 3 processes but --batch-size 8 does not split into 3 equal shards" in bad(capsys, tmp_path / "o")
    monkeypatch.setenv("RANK", "1")  # the other ranks stay silent, with the same status
    assert main(["experiment", "--preset", "tiny", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--learning-rate", "1e9"], "Start a new run with a lower --learning-rate (this run: 1e+09)"),
        (["--weight-decay", "1e30"], "or a lower --weight-decay (this run: 1e+30"),
    ],
)
def test_diverged_training_stops_with_one_line_and_leaves_no_results(capsys, tmp_path, flags, needle):
    out = tmp_path / "diverged"
    code = experiment(out, *flags, "--steps", "3", "--encodings", "rope", "--spread-encodings=", "--scalings", "none")
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "training rope (encoding rope, seed 0) diverged at step " in err and needle in err
    assert f"{out} has no results.json (not a finished run)" in err
    assert sorted(p.name for p in out.iterdir()) == ["config.json"], "nothing past the settings: no figures, report or results"


def test_the_divergence_shown_in_the_docs_is_what_the_command_prints(capsys, tmp_path, monkeypatch):
    """docs/experiment.md shows the message of ``rotary experiment --preset tiny --learning-rate 1e9
    --steps 3`` (stderr, status 2): the same line, up to the run directory's time stamp."""
    import re

    doc = (ROOT / "docs" / "experiment.md").read_text()
    (shown,) = [line for line in doc.splitlines() if line.startswith("rotary experiment: error: training none")]
    assert "rotary experiment --preset tiny --learning-rate 1e9 --steps 3` prints this on stderr" in doc
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "--preset", "tiny", "--learning-rate", "1e9", "--steps", "3"]) == 2
    printed = capsys.readouterr().err.strip()
    stamp = re.compile(r"runs/experiment-\d{8}T\d{6}Z")
    (directory,) = (tmp_path / "runs").iterdir()
    assert stamp.search(printed).group(0) == f"runs/{directory.name}"
    assert stamp.sub("runs/experiment-<time>", printed) == stamp.sub("runs/experiment-<time>", shown)


def test_resume_refuses_another_configuration_and_corrupted_checkpoints(capsys, tiny_run, tmp_path):
    code = main(["experiment", "--preset", "tiny", "--device", "cpu", "--steps", "13", "--resume", str(tiny_run)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "steps: the run has 12, this command 13" in err and "rotary experiment --preset tiny --device cpu" in err
    code = main(["experiment", "--preset", "tiny", "--device", "cpu", "--resume", str(tmp_path / "nothing")])
    assert code == 2 and "no such run directory" in capsys.readouterr().err
    # a copy of the finished run with one checkpoint overwritten by garbage
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    (copy / "models" / "alibi" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    code = main(["experiment", "--preset", "tiny", "--device", "cpu", "--resume", str(copy)])
    err = capsys.readouterr().err
    assert code == 2 and "checkpoint" in err and "alibi" in err and "is corrupted" in err and "Traceback" not in err


def test_write_experiment_docs_renders_the_readme_block_and_report_from_a_run(tiny_run, tmp_path, capsys):
    """benchmarks/write_experiment_docs.py, pointed at a copy of the docs: the block, the report, the figures."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_experiment_docs", ROOT / "benchmarks" / "write_experiment_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# rotary\n\n<!-- experiment:start -->\nold block\n<!-- experiment:end -->\n\n## Quick start\n")
    module.ROOT = tmp_path
    assert module.main([str(tiny_run)]) == 0
    readme = (tmp_path / "README.md").read_text()
    assert "old block" not in readme and readme.startswith("# rotary\n\n<!-- experiment:start -->\n![perplexity")
    assert readme.endswith("<!-- experiment:end -->\n\n## Quick start\n")
    assert "`rotary experiment --preset tiny --device cpu`" in readme
    spread = json.loads((tiny_run / "results.json").read_text())["spread"]
    assert f"differs from the first run by {spread[0]['loss_gap']:.3f} nats at 1L" in readme
    report = (tmp_path / "docs" / "experiment_report.md").read_text()
    assert "(figures/experiment_perplexity.png)" in report and "Each length is held to its own spread" in report
    for name in ("perplexity", "position_buckets", "passkey"):
        assert (tmp_path / "docs" / "figures" / f"experiment_{name}.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert module.main([str(tmp_path)]) == 2 and "not a finished run" in capsys.readouterr().err


def test_the_library_never_imports_the_command_line():
    """rotary.cli and rotary.commands build on the library, never the other way round: no module
    outside them imports them, not even lazily inside a function."""
    import ast

    package = ROOT / "src" / "rotary"
    command_line = ("rotary.cli", "rotary.commands")
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts  # ("rotary", "experiments", "run")
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module.startswith(command_line) or module == "rotary.__main__":
            continue
        package_parts = parts[:-1]  # the package a relative import starts from
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package_parts[: len(package_parts) - node.level + 1]) if node.level else ""
                target = ".".join(p for p in (base, node.module or "") if p)
                names = [target] + [f"{target}.{alias.name}" for alias in node.names]
            else:
                continue
            if any(name == prefix or name.startswith(prefix + ".") for name in names for prefix in command_line):
                found.append(f"{module}:{node.lineno}")
    assert not found, f"library modules import the command line: {found}"
