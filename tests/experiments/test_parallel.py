"""``rotary experiment --jobs``: a divergence in a worker is one line; ``--jobs`` where it cannot apply is
refused; several progress bars at once. (test_run.py: a tiny run with ``--jobs 2`` gives the bytes of one
model at a time, and one killed with ``--jobs 2`` resumes to them.)"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rotary.tools.cli import main
from rotary.tools.experiments.config import ExperimentConfig, ExperimentError
from rotary.tools.experiments.distributed import Distributed
from rotary.tools.experiments.parallel import choose_jobs
from rotary.tools.experiments.progress import Reporter


def experiment(out: Path, *flags: str) -> int:
    return main(["experiment", "--preset", "tiny", "--device", "cpu", "--out", str(out), *flags])


def test_a_divergence_in_a_worker_is_one_line_naming_the_first_model(tmp_path, capsys):
    out = tmp_path / "diverged"
    flags = [
        "--learning-rate",
        "1e9",
        "--steps",
        "3",
        "--encodings",
        "none,rope",
        "--seeds",
        "1",
        "--extend-steps",
        "0",
    ]
    assert experiment(out, *flags, "--scalings", "none", "--jobs", "2") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    # both diverge; the run names the first in plan order, as one model at a time would
    assert "training none (encoding none, seed 0) diverged at step " in err
    assert not (out / "results.json").exists() and not (out / "report.md").exists()


def test_choose_jobs():
    import torch

    alone, budget = Distributed(), torch.get_num_threads()
    assert choose_jobs(ExperimentConfig(device="cpu", threads=1), alone, None, models=1) == (
        1,
        1,
    )  # never more than there are models
    jobs, threads = choose_jobs(ExperimentConfig(device="cpu"), alone, 3, models=22)
    assert jobs == 3 and threads == max(1, budget // 3)
    assert choose_jobs(ExperimentConfig(device="cpu"), alone, 1, models=22) == (
        1,
        budget,
    )  # one at a time on every thread
    assert choose_jobs(ExperimentConfig(device="cpu"), alone, None, models=22) == (max(1, budget), 1)
    with pytest.raises(ExperimentError, match="under torchrun the 2 processes train each model together"):
        choose_jobs(ExperimentConfig(device="cpu"), Distributed(0, 2, 0), 2, models=22)
    with pytest.raises(ExperimentError, match="--device cuda trains them one at a time"):
        choose_jobs(ExperimentConfig(device="cuda"), alone, 2, models=22)
    assert choose_jobs(ExperimentConfig(device="cuda"), alone, None, models=22) == (1, budget)
    assert choose_jobs(ExperimentConfig(device="cpu"), Distributed(0, 2, 0), None, models=22) == (1, budget)
    given = ExperimentConfig(device="cpu")
    choose_jobs(given, alone, 2, models=22)
    assert given.threads is None  # the caller's config is left as given


def test_bars_of_tasks_that_run_side_by_side():
    """Two tasks open at once on a terminal: both bars live; the first to end is printed above the other."""
    out = io.StringIO()
    reporter = Reporter(stream=out, interactive=True)
    a = reporter.start_task("train none-0", total=2)
    b = reporter.start_task("train rope-0", total=3)
    a.advance(loss=1.5)
    b.advance(loss=2.5)
    a.advance(loss=1.25)
    reporter.end_task(a)
    assert reporter.progress is not None  # b is still running
    b.advance(2)
    reporter.end_task(b)
    assert reporter.progress is None
    text = out.getvalue()
    assert "train none-0" in text and "2/2" in text and "train rope-0" in text and "3/3" in text
