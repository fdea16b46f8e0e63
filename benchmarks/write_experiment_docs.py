"""Put a finished `rotary experiment` run into the documentation.

    python benchmarks/write_experiment_docs.py runs/experiment-<UTC time>

A run of the main comparison (`make demo`) writes the block between `<!-- experiment:start -->` and
`<!-- experiment:end -->` in README.md (the perplexity figure, the main table and a paragraph on the
run), docs/experiment_report.md and its figures, docs/figures/experiment_*.png. A study
(`--study base`, `--study transfer`) writes docs/experiment_<study>.md and
docs/figures/experiment_<study>_*.png. The report and the figures are rendered again from the run's
rows by the current code; nothing is typed by hand.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from rotary.tools.experiments.claims import assess
from rotary.tools.experiments.config import ExperimentError
from rotary.tools.experiments.report import report_markdown, threads_used
from rotary.tools.experiments.run import load_run, write_figures
from rotary.tools.experiments.studies import study_claims
from rotary.tools.experiments.tables import markdown_table, summary_table

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- experiment:start -->", "<!-- experiment:end -->"


def readme_block(run: dict, results) -> str:
    """The README's block: the perplexity figure, the main table and what the run was."""
    config = results.config
    env = run["environment"]
    L = config.train_length
    load = ""
    if env.get("load_average_at_start"):
        load = (
            f"; load average {env['load_average_at_start'][0]:g} at the start, "
            f"{env['load_average_at_end'][0]:g} at the end"
        )
    extension = (
        f" The RoPE model is also fine-tuned at {config.extension_length} ({config.extension_length / L:g}L) for "
        f"{config.extend_steps} steps with each scaling, beside a RoPE model trained from scratch there."
        if config.extends
        else ""
    )
    header, body = summary_table(results)
    measured = []
    if any(h.startswith(("copy ", "recall ")) for h in header):
        c = config
        measured.append(
            "copy and associative-recall accuracy per answer byte at 1 and 2 times the length of each encoding's "
            f"task model (width {c.task_hidden_size}, {c.task_steps} steps at {c.task_length} bytes on the synthetic "
            "tasks alone; every seed pooled, Wilson 95% interval; RoPE's scalings applied at evaluation as for "
            "perplexity; chance 4% on copy, 6% on recall)"
        )
    if any(h.startswith("retrieval") for h in header):
        measured.append(
            "the retrieval gain on a repeated random span (nats per byte, mean over the distances up to L and past "
            "it; 0: nothing retrieved)"
        )
    if "passkey 1L" in header:
        measured.append("passkey accuracy at L with its Wilson 95% interval")
    also = "".join(f"; {m}" for m in measured)
    if config.study is None and not config.passkey_trials and not config.retrieval_trials:
        extension += (
            " Passkey retrieval and the retrieval probe on text, which no model of this size learned (0 for every "
            "method in every earlier run), are measured by `--preset large`, not here."
        )
    return "\n".join(
        [
            START,
            "![perplexity against evaluation length](docs/figures/experiment_perplexity.png)",
            "",
            markdown_table(header, body),
            "",
            f"Perplexity per byte on held-out text (lower is better) in non-overlapping and sliding windows{also}, for "
            f"small decoders trained at L = {L} bytes and evaluated at up to {results.lengths[-1]}; mean ± half the "
            f"range over {len(results.seeds)} seeds.{extension} Made by "
            + ("`make demo`, i.e. " if config.preset == "default" and config.study is None else "")
            + f"`{run['command']}`, on {env['cpu']} with {threads_used(env)} in {run['wall_seconds'] / 60:.1f} min "
            f"({run['finished']}{load}). The whole report, with the loss by position, the task accuracies at every "
            "length with exact matches, the spread over seeds and the comparison with the published findings: "
            "[docs/experiment_report.md](docs/experiment_report.md); what is measured and how, and what the default "
            "preset trades for its 10 minutes: [docs/experiment.md](docs/experiment.md).",
            END,
        ]
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    run_dir = Path(argv[0])
    try:
        run, results = load_run(run_dir)
    except ExperimentError as exc:
        print(exc, file=sys.stderr)
        return 2
    study = results.config.study
    prefix = "experiment" if study is None else f"experiment_{study}"
    figures_dir = ROOT / "docs" / "figures"
    with tempfile.TemporaryDirectory() as scratch:
        drawn = write_figures(run, results, Path(scratch))
        figures = {}
        for name, paths in drawn.items():
            png = next(p for p in paths if p.suffix == ".png")
            target = figures_dir / f"{prefix}_{png.stem}.png"
            shutil.copyfile(png, target)
            figures[name] = [Path("figures") / target.name]
    for name in ("passkey", "retrieval", "tasks"):  # a figure of an earlier run that this one does not draw
        stale = figures_dir / f"{prefix}_{name}.png"
        if name not in drawn and stale.exists():
            stale.unlink()
    report = report_markdown(run, results, assess(study_claims(results.config), results), figures)
    page = ROOT / "docs" / ("experiment_report.md" if study is None else f"{prefix}.md")
    page.write_text(report)
    for name, paths in list(figures.items()):  # a figure the page does not show is not kept
        if f"]({paths[0]})" not in report:
            (ROOT / "docs" / paths[0]).unlink()
            del figures[name]
    written = [str(page.relative_to(ROOT))]
    if study is None:
        readme = ROOT / "README.md"
        text = readme.read_text()
        head, _, rest = text.partition(START)
        _, _, tail = rest.partition(END)
        readme.write_text(head + readme_block(run, results) + tail)
        written.insert(0, "README.md")
    print(f"wrote {', '.join(written)} and {len(figures)} figures from {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
