"""The report is built from typed rows: its tables, observations and sections state the rows' numbers."""

from __future__ import annotations

import io
import math

import pytest

from helpers import experiment_rows
from rotary.tools.experiments.claims import CLAIMS, assess
from rotary.tools.experiments.config import ExperimentConfig
from rotary.tools.experiments.figures import draw_figures
from rotary.tools.experiments.plan import model_specs
from rotary.tools.experiments.report import observations, report_markdown
from rotary.tools.experiments.results import Results
from rotary.tools.experiments.rows import Measurements, PasskeyRow, PositionRow, RetrievalRow, TaskRow, csv_text
from rotary.tools.experiments.tables import render_table, spread_table, summary_table

L = 128
LENGTHS = [L, 2 * L, 4 * L, 8 * L]
CFG = ExperimentConfig(train_length=L, device="cpu", encodings=("none", "alibi", "rope"), seeds=2)
TABLE = {
    ("none", "none", "windows"): [4.0, 3.9, 4.3, 4.5],
    ("alibi", "none", "windows"): [4.0, 3.95, 3.95, 3.96],
    ("rope", "none", "windows"): [4.1, 9.0, 20.0, 40.0],
    ("rope", "yarn", "windows"): [4.1, 4.6, 5.0, 5.5],
    ("rope-ft-yarn", "yarn", "windows"): [4.05, 3.7, 3.6, 4.0],
    ("alibi", "none", "sliding"): [3.9, 3.89, 3.89, 3.89],
    ("rope", "none", "sliding"): [4.0, 9.0, 20.0, 40.0],
}


def results(table=TABLE) -> Results:
    rows = experiment_rows(table, LENGTHS)
    for seed in (0, 1):  # retrieval: RoPE retrieves inside L only; positions: RoPE breaks past L
        for d in (64, 128, 256, 512):
            gain = (2.0 if d <= L else 0.1) + 0.1 * seed
            rows.retrieval.append(
                RetrievalRow("rope", seed, "none", 1.0, d, d + 48, 16, 4.0 - gain, 4.0, gain, 0.5, 0.0, 60)
            )
        for a in range(0, 1023, 16):
            rows.positions.append(
                PositionRow("rope", seed, "none", 1.0, 1024, a, min(a + 16, 1023), 1.5 if a < L else 3.0, 256)
            )
        for model, scaling in [("rope", "none"), ("rope", "yarn"), ("alibi", "none"), ("none", "none")]:
            rows.passkey.append(PasskeyRow(model, seed, scaling, 1.0, L, 0.5, 3 if model == "rope" else 0, 10))
        # task models: copy and recall at 1L..8L of the task length; ALiBi holds, RoPE falls past L (YaRN less)
        T = CFG.task_length
        for model, scaling, accuracy in [
            ("task-none", "none", [0.9, 0.6, 0.3, 0.1]),
            ("task-alibi", "none", [0.95, 0.9, 0.8, 0.6]),
            ("task-rope", "none", [1.0, 0.3, 0.05, 0.04]),
            ("task-rope", "yarn", [1.0, 0.5, 0.2, 0.1]),
        ]:
            for k, a in zip((1, 2, 4, 8), accuracy):
                for task in ("copy", "induction"):
                    rows.tasks.append(
                        TaskRow(model, seed, scaling, 1.0, task, k * T, round(a * 1000), 1000, 0, 64, 1.0)
                    )
    return Results(rows, model_specs(CFG), CFG)


def test_the_summary_table_gives_mean_and_spread_per_method():
    header, body = summary_table(results())
    assert header == [
        "method",
        "ppl 1L",
        "ppl 2L",
        "ppl 4L",
        "ppl 8L",
        "sliding 1L",
        "sliding 8L",
        "copy 1L",
        "copy 2L",
        "recall 1L",
        "recall 2L",
        "retrieval ≤ L",
        "retrieval > L",
        "passkey 1L",
    ]
    labels = [row[0] for row in body]
    assert labels == ["NoPE", "ALiBi", "RoPE", "RoPE + YaRN", "RoPE + YaRN, fine-tuned at 4L"]
    rope = body[2]
    assert rope[1] == "4.102 ± 0.002" and rope[4] == "40.02 ± 0.02"  # mean of 4.1 and 4.1041, half their range
    # the task model of the same encoding under the same scaling: 2000 bytes pooled over the seeds, Wilson interval
    assert rope[7] == "100% [100%, 100%]" and rope[8] == "30% [28%, 32%]" and body[3][8] == "50% [48%, 52%]"
    assert body[4][7:11] == ["–"] * 4  # a fine-tuned text model has no task model
    assert rope[11] == "2.05 ± 0.05" and rope[12] == "0.15 ± 0.05"  # retrieval gain up to L and past it
    assert rope[13] == "30% [15%, 52%]" and body[0][13] == "0% [0%, 16%]"  # passkey: 6 of 20, 0 of 20
    assert body[0][5] == "–"  # NoPE has no sliding row


def test_the_summary_table_leaves_out_a_column_no_method_scores_on():
    """Passkey at 0% for every method, and a retrieval probe not run, leave the table; the task columns stay."""
    r = results()
    zero = [
        PasskeyRow(p.model, p.seed, p.scaling, p.factor, p.eval_length, p.depth, 0, p.trials) for p in r.rows.passkey
    ]
    rows = Measurements(perplexity=r.rows.perplexity, passkey=zero, tasks=r.rows.tasks)
    header, body = summary_table(Results(rows, model_specs(CFG), CFG))
    assert header[-5:] == ["sliding 8L", "copy 1L", "copy 2L", "recall 1L", "recall 2L"]
    assert all(len(row) == len(header) for row in body)


def test_one_seed_has_no_spread():
    one = Results(Measurements(perplexity=[r for r in results().rows.perplexity if r.seed == 0]), model_specs(CFG), CFG)
    assert summary_table(one)[1][2][1] == "4.1"
    assert spread_table(results())[1][2][1:] == ["0.000", "0.000", "0.000", "0.000"]


def test_observations_state_the_numbers():
    lines = observations(results())
    assert (
        "At 1024 tokens (8L), non-overlapping windows: the lowest perplexity is ALiBi's, 3.962; "
        "the highest RoPE's, 40.02." in lines
    )
    assert any(
        line.startswith("RoPE: perplexity at 8L is 9.76x with non-overlapping windows and 10.00x with sliding windows")
        for line in lines
    )
    assert any("RoPE +1.500" in line for line in lines)  # the position bins: 3.0 past 4L against 1.5 before L
    assert any(
        line.startswith("Retrieval gain (nats per byte), mean over the distances up to L / past L: RoPE 2.05 / 0.15")
        for line in lines
    )


def test_the_report_is_built_from_the_rows_and_the_claims(tmp_path, monkeypatch):
    """The report's sections, tables and figure links. Its figures are built from the rows but not rendered to
    files (test_figures_skip_perplexities_that_are_not_finite renders these rows' figures, ALiBi's perplexity
    aside; the report reads only their names)."""
    import matplotlib.pyplot as plt

    from rotary.tools import plots

    def unrendered(fig, path):
        plt.close(fig)
        return [path.with_name(path.name + ".png"), path.with_name(path.name + ".svg")]

    monkeypatch.setattr(plots, "save", unrendered)
    r = results()
    figures = draw_figures(r, tmp_path)
    run = {
        "command": "rotary experiment --preset default",
        "finished": "2026-01-01T00:00:00+00:00",
        "wall_seconds": 300.0,
        "environment": {
            "cpu": "CPU",
            "threads": 2,
            "device": "cpu",
            "world_size": 1,
            "torch": "2.x",
            "rotary": "0.1",
            "load_average_at_start": [1.5, 1, 1],
            "load_average_at_end": [1.7, 1, 1],
        },
        "data": {
            "source": "builtin:pydoc",
            "bytes": 466273,
            "files": 1,
            "skipped": 0,
            "sha256": "ab" * 32,
            "eval_tokens": 16384,
            "sliding_tokens": 4096,
        },
        "models": [{"model": m, "seed": 0, "stage": "pretrain", "parameters": 1000} for m in CFG.encodings],
        "timings": {"train rope-0": 20.0},
    }
    assessments = assess(CLAIMS, r)
    text = report_markdown(run, r, assessments, figures)
    for needle in [
        "# Train short, test long: 3 position encodings, 5 RoPE scalings, fine-tuned at 4L",
        "Load average (1 min) 1.5 at the start, 1.7 at the end.",
        "**Extension stage**",
        "**Seeds**",
        "## Perplexity against evaluation length",
        "Sliding windows (stride 64",
        "## Retrieval at a distance",
        "## Passkey retrieval",
        "## Copying and associative recall",
        "![tasks](figures/tasks.png)",
        "| RoPE + YaRN | 100% [100%, 100%] | 50% [48%, 52%] | 20% [18%, 22%] | 10% [9%, 11%] |",
        "## Run-to-run spread",
        "## Compared with the published findings",
        "| verdict | paper | claim | needs | measured as | this run |",
        "![retrieval](figures/retrieval.png)",
    ]:
        assert needle in text, needle
    for a in assessments:
        assert f"| **{a.verdict}** | {a.paper} | {a.claim} |" in text


def test_the_console_table(capsys):
    from rich.console import Console

    out = io.StringIO()
    render_table(results(), Console(file=out, width=200))
    assert "RoPE + YaRN, fine-tuned at 4L" in out.getvalue() and "mean over 2 seed(s)" in out.getvalue()


def test_csv_columns_are_the_row_fields():
    text = csv_text(results().rows.retrieval, RetrievalRow)
    assert text.splitlines()[0] == (
        "model,seed,scaling,factor,distance,length,span,copy_loss,control_loss,gain,"
        "copy_accuracy,control_accuracy,predictions"
    )
    assert len(text.splitlines()) == 1 + 8


@pytest.mark.parametrize("broken", [("alibi",), ("none", "alibi", "rope", "rope-ft-yarn")])
def test_figures_skip_perplexities_that_are_not_finite(tmp_path, broken):
    """Once, a run whose perplexities were all NaN failed in matplotlib ("Data cannot be log-scaled")."""
    table = {k: ([math.nan, math.inf, math.nan, math.inf] if k[0] in broken else v) for k, v in TABLE.items()}
    paths = draw_figures(results(table), tmp_path)
    for name in ("perplexity", "buckets", "passkey", "retrieval"):
        assert [p.suffix for p in paths[name]] == [".png", ".svg"] and all(p.stat().st_size > 0 for p in paths[name])
