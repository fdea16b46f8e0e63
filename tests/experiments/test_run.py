"""``rotary experiment`` end to end on the tiny preset: the files, their shapes, bit-identical reruns,
``--resume`` after a kill, and every bad input as one line and exit status 2."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rotary.tools.cli import main
from rotary.tools.experiments.claims import assess
from rotary.tools.experiments.config import EXTEND_SCALINGS, PRESETS, SCALINGS, default_encodings
from rotary.tools.experiments.report import report_markdown
from rotary.tools.experiments.run import load_run
from rotary.tools.experiments.studies import study_claims

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
L = PRESETS["tiny"]["train_length"]
LENGTHS = [L, 2 * L, 4 * L, 8 * L]


def experiment(out: Path, *flags: str) -> int:
    return main(["experiment", "--preset", "tiny", "--device", "cpu", "--out", str(out), *flags])


def _shared_dir(tmp_path_factory) -> Path:
    """A directory every pytest-xdist worker of this session sees (their base temps' parent), or this
    process's base temp when it runs alone."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _once_per_session(tmp_path_factory, name: str, make) -> Path:
    """``make(out)`` runs once per test session, however many xdist workers ask for ``name``: the first
    holds a lock while it runs, the others wait and read what it wrote (``done`` marks a finished
    run; an unfinished one is removed and run again)."""
    from filelock import FileLock  # a dependency of torch

    shared = _shared_dir(tmp_path_factory) / f"shared-{name}"
    with FileLock(str(shared) + ".lock"):
        if not (shared / "done").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            make(shared / name)
            (shared / "done").write_text("")
    return shared / name


def _tiny(out: Path) -> None:
    terminal = io.StringIO()
    with contextlib.redirect_stdout(terminal):
        assert experiment(out, "--jobs", "1") == 0  # one model at a time: what the runs with --jobs 2 must equal
    (out.parent / "terminal.txt").write_text(terminal.getvalue())  # what the run printed, beside it


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """One run of the tiny preset per session, shared by the tests that read it (none writes into it)."""
    return _once_per_session(tmp_path_factory, "tiny", _tiny)


def numbers(run: Path) -> dict:
    """Everything a run measured (not its wall times or dates)."""
    results = json.loads((run / "results.json").read_text())
    return {"rows": results["rows"], "losses": [m["losses"] for m in results["models"]], "claims": results["claims"]}


def test_writes_every_file_with_the_expected_shapes(tiny_run):
    for name in [
        "config.json",
        "results.json",
        "results.csv",
        "positions.csv",
        "passkey.csv",
        "retrieval.csv",
        "tasks.csv",
        "report.md",
    ]:
        assert (tiny_run / name).is_file(), name
    for figure in ["perplexity", "position_buckets", "passkey", "retrieval", "tasks"]:
        assert (tiny_run / "figures" / f"{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tiny_run / "figures" / f"{figure}.svg").read_text().lstrip().startswith("<?xml")
    results = json.loads((tiny_run / "results.json").read_text())
    encodings = list(default_encodings())
    stages = encodings + [f"rope-ft-{s}" for s in EXTEND_SCALINGS] + ["rope-scratch"] + [f"task-{e}" for e in encodings]
    models = [f"{m}-{seed}" for seed in (0, 1) for m in stages]
    assert [m["name"] for m in results["models"]] == models
    for name in models:
        assert (tiny_run / "models" / name / "checkpoint.pt").is_file()
    rows = results["rows"]["perplexity"]
    # per seed: every encoding as trained, the RoPE model under the 4 other scalings, the 4 fine-tunes and the
    # model trained at 4L; each at 4 lengths in 2 modes
    methods = len(encodings) + (len(SCALINGS) - 1) + len(EXTEND_SCALINGS) + 1
    assert len(rows) == 2 * methods * 4 * 2
    keys = {(r["model"], r["scaling"], r["eval_length"], r["mode"], r["seed"]) for r in rows}
    assert len(keys) == len(rows)
    assert {r["scaling"] for r in rows if r["model"] == "rope"} == set(SCALINGS)
    fine_tuned = [r for r in rows if r["model"].startswith("rope-ft-")]
    assert all(r["scaling"] == r["model"].removeprefix("rope-ft-") for r in fine_tuned)
    assert {r["factor"] for r in fine_tuned if r["scaling"] != "none"} == {4.0}  # the fine-tuned scaling's own factor
    for r in rows:
        assert r["eval_length"] in LENGTHS and r["perplexity"] > 1 and r["bits_per_byte"] > 0
        assert r["factor"] == (
            1.0 if r["scaling"] == "none" else 4.0 if r["model"].startswith("rope-ft-") else r["eval_length"] / L
        )
        assert r["stride"] == (r["eval_length"] if r["mode"] == "windows" else L // 2)
    passkey = results["rows"]["passkey"]
    assert {r["trials"] for r in passkey} == {2} and len(passkey) == 2 * methods * 4 * 5  # 10 prompts at 5 depths
    retrieval = results["rows"]["retrieval"]
    assert len(retrieval) == 2 * methods * len(
        results["config"]["retrieval_distances"] or [56, 84, 112, 168, 224, 336, 448, 672, 848]
    )
    positions = results["rows"]["positions"]
    assert {(r["start"], r["end"]) for r in positions} == {(a, min(a + 14, 895)) for a in range(0, 895, 14)}
    # the task models: each task at 1, 2, 4 and 8 times the task length, RoPE's under every scaling, nothing else
    T = PRESETS["tiny"]["task_length"]
    tasks = results["rows"]["tasks"]
    task_methods = len(encodings) + len(SCALINGS) - 1
    assert len(tasks) == 2 * task_methods * 2 * 4
    assert {r["model"] for r in tasks} == {f"task-{e}" for e in encodings} and {r["task"] for r in tasks} == {
        "copy",
        "induction",
    }
    assert {r["scaling"] for r in tasks if r["model"] == "task-rope"} == set(SCALINGS)
    for r in tasks:
        assert r["eval_length"] in (T, 2 * T, 4 * T, 8 * T) and r["trials"] == PRESETS["tiny"]["task_trials"]
        assert r["factor"] == (1.0 if r["scaling"] == "none" else r["eval_length"] / T)
        assert 0 <= r["exact"] <= r["trials"] and 0 <= r["correct"] <= r["predictions"]
        assert r["predictions"] == (4 * r["trials"] if r["task"] == "induction" else r["predictions"])
    assert not any(
        r["model"].startswith("task-") for kind in ("perplexity", "passkey", "retrieval") for r in results["rows"][kind]
    )
    with open(tiny_run / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and list(table[0]) == [
        "model",
        "seed",
        "scaling",
        "factor",
        "mode",
        "eval_length",
        "stride",
        "loss",
        "perplexity",
        "bits_per_byte",
        "predictions",
    ]
    for key in ("config", "data", "environment", "timings", "claims", "wall_seconds"):
        assert key in results
    assert results["environment"]["torch"] == torch.__version__
    assert results["data"]["source"] == "builtin:pydoc" and results["data"]["files"] == 1
    learned = next(m for m in results["models"] if m["name"] == "learned-0")
    assert learned["untrained_rows_unchanged"] is True and learned["trained_rows_changed"] is True
    report = (tiny_run / "report.md").read_text()
    for needle in [
        "figures/perplexity.png",
        "figures/position_buckets.png",
        "figures/passkey.png",
        "figures/retrieval.png",
        "figures/tasks.png",
        "## Copying and associative recall",
        "Mamba: Linear-Time Sequence Modeling with Selective State Spaces",
        "Repeat After Me",
        "Train Short, Test Long",
        "The Impact of Positional Encoding",
        "Positional Interpolation",
        "YaRN",
        "RoPE + YaRN, fine-tuned at 4L",
        "RoPE trained at 4L",
        "NoPE",
        "Sliding windows (stride 56",
        "## Retrieval at a distance",
        "Wilson",
        f"rows {L}..{8 * L - 1} never receive a gradient",
    ]:
        assert needle in report, needle
    config = json.loads((tiny_run / "config.json").read_text())
    assert config["command"].startswith("rotary experiment --preset tiny --device cpu")
    # the wall time of every phase: each model's training and evaluation, and the total
    assert all(m["compiled"] is False and m["compile_seconds"] == 0 for m in results["models"])  # the CPU stays eager
    timings = results["timings"]
    assert all(f"train {n}" in timings and f"evaluate {n}" in timings for n in models)
    section = report[report.index("## Wall time") :]
    assert all(f"| {n} | " in section for n in models) and f"Total {results['wall_seconds']:.0f} s" in section


def test_the_tiny_preset_says_it_is_a_smoke_test_and_withholds_every_verdict(tiny_run):
    """Its models stay near uniform (perplexity 110 to 170 per byte of 256): the report and the terminal say
    so before any number, and no claim is agreed or disagreed with."""
    results = json.loads((tiny_run / "results.json").read_text())
    assert {c["verdict"] for c in results["claims"]} <= {"withheld", "not measured"}
    assert "withheld" in {c["verdict"] for c in results["claims"]}
    report = (tiny_run / "report.md").read_text()
    top = report[: report.index("## Setup")]
    assert "**Smoke test**" in top and "**Not learned enough to judge**" in top
    claims = report[report.index("## Compared with the published findings") :]
    assert "**Verdicts withheld.**" in claims and "**agrees**" not in claims and "**does not agree**" not in claims
    terminal = " ".join((tiny_run.parent / "terminal.txt").read_text().split())
    assert "Smoke test: the tiny preset" in terminal and "the comparison with the papers is withheld" in terminal


def test_the_hybrid_encodings_run_through_the_experiment(tmp_path):
    out = tmp_path / "hybrids"
    assert (
        experiment(
            out,
            "--encodings",
            "rope_alibi,rope_relative",
            "--extend-steps",
            "0",
            "--scalings",
            "none,yarn",
            "--eval-lengths",
            f"{L},{2 * L}",
            "--steps",
            "4",
            "--passkey-trials",
            "5",
            "--task-steps",
            "0",
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert not results["rows"]["tasks"] and not (out / "figures" / "tasks.png").exists()
    assert [m["name"] for m in results["models"]] == [
        "rope_alibi-0",
        "rope_relative-0",
        "rope_alibi-1",
        "rope_relative-1",
    ]
    # both rotate q and k, so both are also evaluated under the scalings, every seed
    keys = sorted({(r["model"], r["scaling"], r["eval_length"], r["seed"]) for r in results["rows"]["perplexity"]})
    assert keys == sorted(
        (m, s, e, seed)
        for m in ("rope_alibi", "rope_relative")
        for s in ("none", "yarn")
        for e in (L, 2 * L)
        for seed in (0, 1)
    )
    assert all(math.isfinite(r["perplexity"]) and r["perplexity"] > 1 for r in results["rows"]["perplexity"])
    report = (out / "report.md").read_text()
    assert "RoPE + ALiBi + YaRN" in report and "RoPE + learned bias" in report


def study_run(tmp_path_factory, study: str) -> Path:
    """``rotary experiment --preset tiny --study STUDY``, run once per session (none writes into it)."""

    def make(out: Path) -> None:
        assert experiment(out, "--study", study) == 0

    return _once_per_session(tmp_path_factory, f"study-{study}", make)


@pytest.mark.parametrize("study", ["base", "transfer"])
def test_the_studies_run_on_the_tiny_preset(tmp_path_factory, study):
    out = study_run(tmp_path_factory, study)
    results = json.loads((out / "results.json").read_text())
    models = {m["model"] for m in results["models"]}
    report = (out / "report.md").read_text()
    claims = {c["claim"][:30]: c for c in results["claims"]}
    if study == "base":
        assert models == {"rope-base100", "rope-base10000"}
        assert {r["model"] for r in results["rows"]["positions"]} == models
        assert (
            "Scaling Laws of RoPE-based Extrapolation" in report
            and "d_extra" in report
            and "could not be verified" in report
        )
        # head width 16: pairs 0, 1, 2 of base 10000 complete a period within L = 112 (periods 6.3, 19.9, 62.8), pair 3
        # does not (199): d_extra = 6 and T_extra = 199
        periods = [2 * math.pi * 10000 ** (2 * i / 16) for i in range(8)]
        d_extra = 2 * sum(p <= L for p in periods)
        assert f"| 10000 | {d_extra} of 16 | {min(p for p in periods if p > L):.0f} (1.77L) |" in report
    else:
        assert models == {"sinusoidal", "rope", "sinusoidal-short", "transfer-0", "transfer"}
        steps = {m["model"]: len(m["losses"]) for m in results["models"] if m["seed"] == 0}
        assert steps == {"sinusoidal": 12, "rope": 12, "sinusoidal-short": 8, "transfer-0": 0, "transfer": 4}
        assert (out / "figures" / "training_loss.png").is_file()
        assert "transfer_position_encoding" in report and "No paper we cite measures this transfer" in report
    # a tiny run's models learn almost nothing: every verdict it could give is withheld
    assert {c["verdict"] for c in claims.values()} <= {"withheld", "not measured"}, claims
    assert "**Smoke test**" in report and "**Verdicts withheld.**" in report
    # the report of the same run without figures (--no-figures): every section, no image
    run, loaded = load_run(out)
    bare = report_markdown(run, loaded, assess(study_claims(loaded.config), loaded), {})
    assert "](figures/" not in bare and "made with `--no-figures`" in bare
    assert _sections(bare) == _sections(report)


def _sections(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("#")]


def checkpoints(run: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in (run / "models").glob("*/checkpoint.pt")}


#: the encodings of the killed-and-resumed run: ALiBi and RoPE (with its fine-tunes, scratch and task models), 18
#: of the tiny preset's 34 models; each model's numbers do not depend on which others a run trains
KILLED_ENCODINGS = "alibi,rope"  # in the default list's order: the same plan order


def _lines_of(run: Path, name: str, models: set[tuple[str, int]]) -> list[str]:
    """The lines of the CSV file ``name`` of ``run`` whose (model, seed) is in ``models``, sorted (the header first)."""
    header, *rows = (run / name).read_text().splitlines()
    assert header.startswith("model,seed,"), header
    return [header, *sorted(r for r in rows if (r.split(",")[0], int(r.split(",")[1])) in models)]


def test_killed_and_resumed_two_models_at_a_time_ends_with_the_numbers_of_one_uninterrupted_run(
    tiny_run, tmp_path, capsys, monkeypatch
):
    """Killed while it trains two models at once in worker processes (``--jobs 2``), continued two at a time:
    the numbers of the run that was never interrupted and trained one model at a time (``tiny_run``, one
    thread each as here), model for model: the same losses and rows, the same lines of every CSV file, the
    models and phases in plan order. It trains the ALiBi and RoPE models of the first seed only
    (``KILLED_ENCODINGS``, ``--seeds 1``), so this is also a check that a model's numbers do not depend on the
    other models of its run. The models the kill left
    unstarted train from scratch in the workers: this is also the same command's run with ``--jobs 2`` against
    ``--jobs 1``. It is resumed with ``--no-figures``, where matplotlib cannot be imported: the report's sections
    without its figures (``tiny_run`` checks those)."""
    out = tmp_path / "killed"
    subset = ["--encodings", KILLED_ENCODINGS, "--seeds", "1"]
    command = ["experiment", "--preset", "tiny", "--device", "cpu", "--out", str(out), "--jobs", "2", *subset]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rotary", *command],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    first = out / "models" / "alibi-0" / "checkpoint.pt"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.exists(), proc.stderr.read().decode()
    before = checkpoints(out)  # the workers died with it: nothing goes on writing checkpoints beside the resumed run
    time.sleep(1.5)
    assert checkpoints(out) == before
    assert not (out / "results.json").exists()  # killed while training: not a finished run
    steps = {p.parent.name: torch.load(p, weights_only=True)["step"] for p in (out / "models").glob("*/checkpoint.pt")}
    assert len(steps) < 9 or min(steps.values()) < PRESETS["tiny"]["steps"], steps
    capsys.readouterr()
    resume = ["experiment", "--preset", "tiny", "--device", "cpu", "--resume", str(out), "--jobs", "2", *subset]
    with monkeypatch.context() as without:
        without.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
        assert main([*resume, "--no-figures"]) == 0
    one, two = (json.loads((run / "results.json").read_text()) for run in (tiny_run, out))
    assert any(m["resumed_at_step"] > 0 for m in two["models"]), two["models"]
    names = [m["name"] for m in two["models"]]
    assert len(names) == 9 and names == [m["name"] for m in one["models"] if m["name"] in names]  # in plan order
    losses = {m["name"]: m["losses"] for m in one["models"]}
    assert all(m["losses"] == losses[m["name"]] for m in two["models"])
    models = {(row["model"], row["seed"]) for rows in two["rows"].values() for row in rows}
    assert {seed for _, seed in models} == {0}  # --seeds 1: the first seed of the uninterrupted run's two
    for kind, rows in two["rows"].items():  # the same rows, in another order (each model's rows in plan order)
        theirs = [r for r in one["rows"][kind] if (r["model"], r["seed"]) in models]
        assert sorted(json.dumps(r, sort_keys=True) for r in rows) == sorted(
            json.dumps(r, sort_keys=True) for r in theirs
        ), kind
    for name in ("results.csv", "positions.csv", "passkey.csv", "retrieval.csv", "tasks.csv"):
        assert _lines_of(out, name, models) == _lines_of(tiny_run, name, models), name
    assert two["config"] == {**one["config"], "encodings": two["config"]["encodings"], "seeds": 1}
    in_run = [k for k in one["timings"] if k.split(" ")[0] not in ("train", "evaluate") or k.split(" ", 1)[1] in names]
    assert list(two["timings"]) == in_run
    assert two["parallel"]["jobs"] == 2 and two["environment"]["jobs"] == 2 and "parallel" not in one
    printed = capsys.readouterr().out  # the workers' progress, shown by the main process
    assert all(f"evaluate {m['name']}" in printed for m in two["models"]), printed
    fresh = [m["name"] for m in two["models"] if m["resumed_at_step"] == 0]  # trained from scratch in the workers
    assert fresh and all(f"train {name}" in printed for name in fresh), printed
    assert "2 models at a time, 1 torch thread(s) each" in printed
    report = (out / "report.md").read_text()
    assert "2 models at a time on 1 torch thread(s) each" in report and "2 at a time (each in a process" in report
    # --no-figures: no figures/, no image in the report, every section of the run with figures (after the title)
    assert not (out / "figures").exists() and "](figures/" not in report and "made with `--no-figures`" in report
    assert _sections(report)[1:] == _sections((tiny_run / "report.md").read_text())[1:]
    assert "and the CSV files in" in " ".join(printed.split()) and "figures/" not in printed  # (wrapped lines)


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
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "image.bin").write_bytes(bytes([0xFF, 0xD8, 0x00]) * 100)
    out = tmp_path / "out"
    assert "no such file or directory" in bad(capsys, out, "--data", str(tmp_path / "nope.txt"))
    message = bad(capsys, out, "--data", str(tmp_path / "nothing"))
    assert (
        f"--data {tmp_path / 'nothing'}: the directory holds no UTF-8 text" in message
        and "give files of UTF-8 text" in message
    )
    assert "matches no file" in bad(capsys, out, "--data", str(tmp_path / "*.csv"))
    assert "is empty" in bad(capsys, out, "--data", str(tmp_path / "empty.txt"))
    assert "not UTF-8" in bad(capsys, out, "--data", str(tmp_path / "binary.bin"))
    assert "unknown built-in corpus" in bad(capsys, out, "--data", "builtin:wiki")
    message = bad(capsys, out, "--data", str(tmp_path / "short.txt"))
    assert (
        "has 500 bytes, too short: one training batch (8 rows of 113 bytes" in message
        and "at least 17920 bytes" in message
    )


def test_a_corpus_smaller_than_one_batch(capsys, tmp_path):
    """Enough held-out text for the evaluation, but a training part shorter than one batch of rows."""
    path = tmp_path / "corpus.txt"
    path.write_text(
        "words " * 400
    )  # 2400 bytes: 1200 held out (enough), 1200 to train from, one batch needs 64 rows x 113
    message = bad(
        capsys,
        tmp_path / "o",
        "--data",
        str(path),
        "--held-out-fraction",
        "0.5",
        "--batch-size",
        "64",
        "--sliding-tokens",
        "0",
    )
    assert (
        "has 2400 bytes, too short: one training batch (64 rows of 113 bytes" in message
        and "smaller --batch-size" in message
    )


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--study", "bases"], "argument --study: invalid choice: 'bases' (choose from"),
        (["--extend-length", "112"], "--extend-length 112 is not longer than the training length L = 112"),
        (["--extend-length", "56"], "use e.g. --extend-length 448, or --extend-steps 0 to skip the stage"),
        (["--seeds", "0"], "argument --seeds: must be at least 1 (how many times every method is trained"),
        (["--seeds", "-2"], "argument --seeds: must be at least 1"),
        (["--encodings", "alibi"], "the extension stage fine-tunes the RoPE model, but --encodings alibi has no rope"),
        (["--extend-scalings", "dynamic"], "dynamic NTK changes with the length by itself"),
        (
            ["--study", "transfer", "--transfer-steps", "12"],
            "--study transfer fine-tunes 12 of the --steps 12 with RoPE",
        ),
        (["--bases", "1"], "--bases must be finite numbers > 1"),
        (["--eval-stride", "200"], "--eval-stride 200 is longer than L = 112"),
        (["--task-length", "12"], "--task-length 12 is too short for a copy row and 4 key-value pairs"),
        (["--task-pairs", "27"], "--task-pairs 27 is more than the 26 keys"),
        (["--task-length", "8192"], "--task-length 8192 is evaluated up to 8 times that"),
        (["--task-hidden-size", "34"], "--task-hidden-size 34 must split into --num-heads 2 heads of an even width"),
        (["--task-steps", "-1"], "argument --task-steps"),
        (["--task-seeds", "3"], "--task-seeds 3 is more than the run's --seeds 2; use at most 2"),
    ],
)
def test_bad_settings_of_the_new_stages(capsys, tmp_path, flags, needle):
    assert needle in bad(capsys, tmp_path / "o", *flags)


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
        (
            ["--train-length", "8192"],
            "longest evaluation length is 65536 tokens, but models are built for at most 32768",
        ),
        (["--eval-lengths", "112,40000"], "longest evaluation length is 40000 tokens"),
        (["--train-length", "64"], "too short for a passkey sample, which needs at least 110 tokens"),
        (["--eval-lengths", "224,448"], "--eval-lengths must include the training length L = 112 and nothing shorter"),
        (
            ["--eval-lengths", "56,112,224"],
            "(every length is measured against L), got 56,112,224; e.g. --eval-lengths 112,224,448,896",
        ),
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
    assert "torchrun runs 3 processes but --batch-size 8 does not split into 3 equal shards" in bad(
        capsys, tmp_path / "o"
    )
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
    code = experiment(
        out, *flags, "--steps", "3", "--encodings", "rope", "--seeds", "1", "--extend-steps", "0", "--scalings", "none"
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "training rope (encoding rope, seed 0) diverged at step " in err and needle in err
    assert f"{out} has no results.json (not a finished run)" in err
    assert sorted(p.name for p in out.iterdir()) == ["config.json"], (
        "nothing past the settings: no figures, report or results"
    )


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
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    (copy / "models" / "alibi-0" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    code = main(["experiment", "--preset", "tiny", "--device", "cpu", "--resume", str(copy)])
    err = capsys.readouterr().err
    assert code == 2 and "checkpoint" in err and "alibi-0" in err and "is corrupted" in err and "Traceback" not in err


def test_resume_offers_the_run_s_own_settings_when_its_preset_has_changed_since(
    capsys, tiny_run, tmp_path, monkeypatch
):
    """A run started before its preset changed (as the default's steps went from 600 to 480): the command
    offered to continue it names the run's values, and that command resumes it."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    monkeypatch.setitem(PRESETS, "tiny", {**PRESETS["tiny"], "steps": 10, "warmup_steps": 1})  # a later version's
    code = main(["experiment", "--preset", "tiny", "--device", "cpu", "--resume", str(copy)])
    err = capsys.readouterr().err
    assert code == 2 and "steps: the run has 12, this command 10" in err, err
    offered = err.split("Continue it with the command it was started with: ", 1)[1].strip()
    argv = shlex.split(offered)
    assert argv[:4] == ["rotary", "experiment", "--preset", "tiny"] and argv[-2:] == ["--resume", str(copy)], offered
    assert "--steps 12" in offered and "--warmup-steps 2" in offered and "--device cpu" in offered, offered
    # the run recorded the command that reproduced it under the preset as it was, naming neither
    assert "--steps" not in json.loads((copy / "config.json").read_text())["command"]
    # the offered command passes the check and resumes the run (without drawing its figures again: not read here)
    assert main([*argv[1:], "--no-figures"]) == 0, capsys.readouterr().err
    assert numbers(copy) == numbers(tiny_run)


def test_resume_offers_the_recorded_command_for_settings_this_version_cannot_read(capsys, tiny_run, tmp_path):
    """A stored configuration of a preset this version lacks cannot be written against today's presets:
    the refusal offers the command the run recorded, in one line."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    stored = json.loads((copy / "config.json").read_text())
    stored["config"]["preset"] = "renamed"
    (copy / "config.json").write_text(json.dumps(stored))
    code = main(["experiment", "--preset", "tiny", "--device", "cpu", "--resume", str(copy)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "preset: the run has 'renamed'" in err, err
    assert err.strip().endswith(f"with: {stored['command']} --resume {copy}"), err


def _docs_writer(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "write_experiment_docs", ROOT / "benchmarks" / "write_experiment_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    (tmp_path / "README.md").write_text(
        "# rotary\n\n<!-- experiment:start -->\nold block\n<!-- experiment:end -->\n\n## Quick start\n"
    )
    module.ROOT = tmp_path
    return module


def _figures_saved_as_the_run_s(monkeypatch, run: Path) -> None:
    """Each figure is built from the rows as before, then saved as a copy of the files ``run`` wrote for it:
    ``run`` rendered the same figures from the same rows with the same code (the tiny run's files are checked,
    PNG and SVG, by test_writes_every_file_with_the_expected_shapes); rendering them again here would cost
    seconds per run and check nothing more."""
    import matplotlib.pyplot as plt

    from rotary.tools import plots

    def save(fig, path) -> list[Path]:
        plt.close(fig)
        out = [Path(f"{path}.png"), Path(f"{path}.svg")]
        for file in out:
            shutil.copyfile(run / "figures" / file.name, file)
        return out

    monkeypatch.setattr(plots, "save", save)


def test_write_experiment_docs_renders_the_readme_block_and_report_from_a_run(tiny_run, tmp_path, capsys, monkeypatch):
    """benchmarks/write_experiment_docs.py, pointed at a copy of the docs: the block, the report, the figures
    (saved as copies of the run's, see :func:`_figures_saved_as_the_run_s`)."""
    _figures_saved_as_the_run_s(monkeypatch, tiny_run)
    module = _docs_writer(tmp_path)
    assert module.main([str(tiny_run)]) == 0
    readme = (tmp_path / "README.md").read_text()
    assert "old block" not in readme and readme.startswith("# rotary\n\n<!-- experiment:start -->\n![perplexity")
    assert readme.endswith("<!-- experiment:end -->\n\n## Quick start\n")
    assert "`rotary experiment --preset tiny --device cpu`" in readme and "mean ± half the range over 2 seeds" in readme
    results = json.loads((tiny_run / "results.json").read_text())
    rope_at_L = [
        r["perplexity"]
        for r in results["rows"]["perplexity"]
        if (r["model"], r["scaling"], r["eval_length"], r["mode"]) == ("rope", "none", L, "windows")
    ]
    assert f"| RoPE | {sum(rope_at_L) / 2:.4g} ± " in readme  # the table's numbers are the run's
    report = (tmp_path / "docs" / "experiment_report.md").read_text()
    assert report == (tiny_run / "report.md").read_text().replace("](figures/", "](figures/experiment_")
    for name in ("perplexity", "position_buckets", "passkey", "retrieval", "tasks"):
        assert (tmp_path / "docs" / "figures" / f"experiment_{name}.png").read_bytes()[:4] == b"\x89PNG"
    header = next(line for line in readme.splitlines() if line.startswith("| method |"))
    assert (
        "| copy 1L | copy 2L | recall 1L | recall 2L |" in header and "copy and associative-recall accuracy" in readme
    )
    capsys.readouterr()
    assert module.main([str(tmp_path)]) == 2 and "not a finished run" in capsys.readouterr().err


def test_write_experiment_docs_writes_a_study_page_and_leaves_the_readme(
    tmp_path_factory, tmp_path, capsys, monkeypatch
):
    run = study_run(tmp_path_factory, "base")  # the studies' own run, read only
    _figures_saved_as_the_run_s(monkeypatch, run)
    module = _docs_writer(tmp_path / "copy")
    assert module.main([str(run)]) == 0
    assert "old block" in (tmp_path / "copy" / "README.md").read_text()
    page = (tmp_path / "copy" / "docs" / "experiment_base.md").read_text()
    assert page.startswith("# RoPE's base") and "(figures/experiment_base_position_buckets.png)" in page


def test_the_library_never_imports_the_command_line():
    """rotary.tools.cli and rotary.tools.commands build on the library, never the other way round: no module
    outside them imports them, not even lazily inside a function."""
    import ast

    package = ROOT / "src" / "rotary"
    command_line = ("rotary.tools.cli", "rotary.tools.commands")
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


def test_the_run_settles_device_and_threads_on_a_copy_and_leaves_the_caller_s_config_as_given():
    from rotary.tools.experiments.config import ExperimentConfig
    from rotary.tools.experiments.distributed import Distributed
    from rotary.tools.experiments.run import settle_config

    given = ExperimentConfig(**{**PRESETS["tiny"], "device": None, "threads": None})
    before = given.to_dict()
    settled, specs, jobs = settle_config(given, Distributed(), None)
    assert given.to_dict() == before and given.device is None and given.threads is None
    assert settled is not given and settled.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert settled.threads >= 1 and jobs >= 1 and len(specs) > 0
    assert {k: v for k, v in settled.to_dict().items() if k not in ("device", "threads")} == {
        k: v for k, v in before.items() if k not in ("device", "threads")
    }
