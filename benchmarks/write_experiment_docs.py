"""Put a finished `rotary experiment` run into the documentation.

    python benchmarks/write_experiment_docs.py runs/experiment-<UTC time>

Writes the block between `<!-- experiment:start -->` and `<!-- experiment:end -->` in README.md (the
perplexity figure and the main table), docs/experiment_report.md (the run's report, rendered from its
results.json) and the
figures they show, as docs/figures/experiment_*.png. The numbers come from the run's results.json;
nothing is typed by hand.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from rotary.experiments.config import ExperimentConfig
from rotary.experiments.report import (
    ENCODING_LABELS,
    markdown_table,
    report_markdown,
    separation,
    spread,
    spread_by_length,
    summary_table,
)

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- experiment:start -->", "<!-- experiment:end -->"
FIGURES = {"perplexity": "experiment_perplexity", "position_buckets": "experiment_position_buckets", "passkey": "experiment_passkey"}


def spread_sentence(results: dict, config: ExperimentConfig) -> str:
    """One sentence of the README: the run-to-run spread at every length and what it means for the table."""
    limits = spread_by_length(results["results"], config)
    if not limits:
        return " Nothing was trained twice, so the run-to-run spread is unknown."
    L = config.train_length
    names = " and ".join(ENCODING_LABELS.get(e, e) for e in config.spread_encodings)
    return (
        f" {names} trained a second time (seed {config.seed + 1}) differs from the first run by "
        + ", ".join(f"{v:.3f} nats at {e / L:g}L" for e, v in sorted(limits.items()))
        + " (log-perplexity): differences between methods smaller than the spread at their length are within run-to-run spread."
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    run = Path(argv[0])
    results_path = run / "results.json"
    if not results_path.is_file():
        print(f"{run} has no results.json: not a finished run", file=sys.stderr)
        return 2
    results = json.loads(results_path.read_text())
    config = ExperimentConfig.from_dict(results["config"])
    # recomputed by this code: older runs lack the passkey columns and held every length to the spread at L
    results["spread"] = spread(results["results"], config)
    results["separation"] = separation(results["results"], config)
    for source, target in FIGURES.items():
        shutil.copyfile(run / "figures" / f"{source}.png", ROOT / "docs" / "figures" / f"{target}.png")
    # the report is rendered again from the run's numbers, by this code, with the figures' new names
    figures = {source.replace("position_", ""): [Path("figures") / f"{target}.png"] for source, target in FIGURES.items()}
    report = report_markdown(results, config, figures, ROOT / "docs")
    (ROOT / "docs" / "experiment_report.md").write_text(report)

    env = results["environment"]
    best_L = max(
        (r["passkey_accuracy"], r["model"], r["scaling"]) for r in results["results"]
        if r["eval_length"] == config.train_length and not r["model"].endswith("-2")
    )
    block = "\n".join([
        START,
        "![perplexity against evaluation length](docs/figures/experiment_perplexity.png)",
        "",
        markdown_table(*summary_table(results["results"], config)),
        "",
        f"Perplexity per byte on held-out text (lower is better) and passkey retrieval accuracy, for small "
        f"decoders trained at L = {config.train_length} bytes and evaluated at up to {max(config.eval_lengths)}. Made by "
        + ("`make demo`, i.e. " if config.preset == "default" else "")
        + f"`{results['command']}`, on {env['cpu']} with {env['threads']} torch threads in "
        f"{results['wall_seconds'] / 60:.1f} min ({results['finished']}"
        + (f"; load average {env['load_average_at_start'][0]:g} at the start, {env['load_average_at_end'][0]:g} at the end"
           if env.get("load_average_at_start") else "")
        + "). At L the best passkey accuracy is "
        f"{best_L[0]:.0%}."
        + "".join(
            f" {ENCODING_LABELS.get(s['encoding'], s['encoding'])} trained a second time (seed {config.seed + 1}) retrieves {s['passkey_b']:.0%} at L "
            f"against {s['passkey_a']:.0%}: passkey retrieval is learned abruptly at this budget, so read it as one draw."
            for s in results["spread"]
            if s["eval_length"] == config.train_length and s["passkey_a"] is not None and s["passkey_b"] is not None
            and abs(s["passkey_a"] - s["passkey_b"]) >= 0.25
        )
        + spread_sentence(results, config)
        + " The whole report, with the loss by position, the run-to-run spread and the comparison "
        "with the published findings: [docs/experiment_report.md](docs/experiment_report.md); what is measured and "
        "how: [docs/experiment.md](docs/experiment.md).",
        END,
    ])
    readme = ROOT / "README.md"
    text = readme.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    readme.write_text(head + block + tail)
    print(f"wrote README.md, docs/experiment_report.md and {len(FIGURES)} figures from {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
