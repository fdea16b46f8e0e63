"""The figures of a run, drawn from its ``Results`` (PNG + SVG each).

Every line is the mean over seeds; with two seeds or more a band spans the lowest and highest seed. The
main comparison's figures have two panels: the encodings as trained, and the RoPE family.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

from .results import Method, Results

__all__ = ["draw_figures", "panels", "style"]

_SCALING_COLOURS = {"none": "#000000", "linear": "#999999", "ntk": "#7F3C8D", "dynamic": "#11A579", "yarn": "#E73F74"}
_SCALING_DASHES = {"none": "-", "linear": "--", "ntk": "-.", "dynamic": ":", "yarn": (0, (5, 1, 1, 1))}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panels(results: Results) -> list[tuple[str, list[Method]]]:
    """``[(title, methods), ...]``: the encodings as trained, then the RoPE family; a study has one panel."""
    methods = results.methods()
    if results.config.study is not None:
        return [("", methods)]
    trained = [m for m in methods if m.stage == "pretrain" and m.scaling == "none"]
    family = [m for m in methods if m.model == "rope" or m.stage in ("extend", "scratch")]
    return [
        (p, ms)
        for p, ms in (
            ("position encodings as trained", trained),
            ("RoPE: scalings, fine-tuning, training at E", family),
        )
        if ms
    ]


def style(results: Results, method: Method) -> dict:
    """Colour, dashes and marker of a method's line, the same in every figure."""
    from ..plots import PALETTE

    if method.stage == "extend":
        return dict(
            color=_SCALING_COLOURS.get(method.scaling, "#555555"),
            linestyle="-",
            marker="s",
            markersize=4,
            linewidth=1.8,
        )
    if method.stage == "scratch":
        return dict(color="#000000", linestyle=":", marker="D", markersize=4, linewidth=1.8)
    if method.scaling != "none":
        return dict(
            color=_SCALING_COLOURS.get(method.scaling, "#555555"),
            linestyle=_SCALING_DASHES.get(method.scaling, "--"),
            marker=None,
            linewidth=1.4,
        )
    order = list(dict.fromkeys(m.model for m in results.methods() if m.scaling == "none"))
    return dict(
        color=PALETTE[order.index(method.model) % len(PALETTE)], linestyle="-", marker="o", markersize=4, linewidth=1.8
    )


def _finite(v: float) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def _length_axis(ax, results: Results) -> None:
    L = results.config.train_length
    ax.set_xscale("log", base=2)
    ax.set_xticks(results.lengths, [f"{e}\n({e / L:g}L)" for e in results.lengths])
    ax.axvline(L, color="#444444", linewidth=1, linestyle="--")


def _perplexity_figure(results: Results, directory: Path) -> list[Path]:
    from ..plots import save

    plt = _plt()
    groups = panels(results)
    modes = results.modes or ["windows"]
    fig, axes = plt.subplots(
        len(modes), len(groups), figsize=(6.2 * len(groups), 3.9 * len(modes)), squeeze=False, sharey="row"
    )
    names = {"windows": "non-overlapping windows", "sliding": f"sliding windows (stride {results.config.stride})"}
    for i, mode in enumerate(modes):
        for j, (title, methods) in enumerate(groups):
            ax = axes[i][j]
            drawn = 0
            for m in methods:
                xs, ys, lows, highs = [], [], [], []
                for e in results.lengths:
                    stat = results.perplexity(m.model, m.scaling, e, mode)
                    if stat is not None and stat.finite and _finite(stat.mean):
                        (
                            xs.append(e),
                            ys.append(stat.mean),
                            lows.append(stat.mean - stat.low),
                            highs.append(stat.high - stat.mean),
                        )
                if xs:
                    ax.errorbar(xs, ys, yerr=[lows, highs], label=m.label, capsize=2, **style(results, m))
                    drawn += 1
            _length_axis(ax, results)
            if drawn:
                ax.set_yscale("log")
            ax.set_title(f"{title}: {names[mode]}" if title else names[mode], fontsize=10)
            if j == 0:
                ax.set_ylabel("perplexity per byte (log)")
            if drawn and i == 0:
                ax.legend(fontsize=7, ncol=1, loc="upper left")
    fig.suptitle(
        f"Train at L = {results.config.train_length}, test longer: held-out perplexity, mean over "
        f"{len(results.seeds)} seed(s), bars from the lowest to the highest seed",
        fontsize=11,
    )
    fig.tight_layout()
    return save(fig, directory / "perplexity")


def _positions_figure(results: Results, directory: Path, predicted: dict[str, float] | None = None) -> list[Path]:
    """Loss by query position on the longest windows; ``predicted``: model -> a position to mark."""
    from ..plots import save

    plt = _plt()
    groups = panels(results)
    fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 4.2), squeeze=False, sharey=True)
    L = results.config.train_length
    for j, (title, methods) in enumerate(groups):
        ax = axes[0][j]
        for m in methods:
            bins = results.profile(m.model, m.scaling)
            if not bins:
                continue
            xs = [(a + b) / 2 for a, b, _ in bins]
            stats = [v.stat for _, _, v in bins]
            look = style(results, m)
            ax.plot(
                xs,
                [s.mean if s.finite else math.nan for s in stats],
                label=m.label,
                **{k: v for k, v in look.items() if k != "marker"},
            )
            if len(results.seeds) > 1:
                ax.fill_between(
                    xs, [s.low for s in stats], [s.high for s in stats], color=look["color"], alpha=0.12, linewidth=0
                )
            if predicted and m.model in predicted and math.isfinite(predicted[m.model]):
                ax.axvline(predicted[m.model], color=look["color"], linestyle=(0, (2, 2)), linewidth=1)
        ax.axvline(L, color="#444444", linewidth=1, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"query position in windows of {results.config.longest} tokens (L = {L} dashed)")
        ax.set_title(title, fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("mean next-byte loss (nats)")
    fig.suptitle(
        "Loss by position: does the model break past L, or gain from the longer context?"
        + ("  (dotted: predicted limit)" if predicted else ""),
        fontsize=11,
    )
    fig.tight_layout()
    return save(fig, directory / "position_buckets")


def _passkey_figure(results: Results, directory: Path) -> list[Path]:
    from ..plots import save

    plt = _plt()
    methods = results.methods()
    L = results.config.train_length
    fig, ax = plt.subplots(figsize=(8.5, 0.42 * len(methods) + 1.8))
    grid = [[results.passkey_interval(m.model, m.scaling, e) for e in results.lengths] for m in methods]
    image = ax.imshow(
        [[math.nan if v is None else v[0] for v in row] for row in grid], cmap="viridis", vmin=0, vmax=1, aspect="auto"
    )
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v is not None:
                ax.text(
                    j,
                    i,
                    f"{v[0]:.0%} [{v[1]:.0%}, {v[2]:.0%}]",
                    ha="center",
                    va="center",
                    color="white" if v[0] < 0.6 else "black",
                    fontsize=7,
                )
    ax.set_xticks(range(len(results.lengths)), [f"{e} ({e / L:g}L)" for e in results.lengths])
    ax.set_yticks(range(len(methods)), [m.label for m in methods], fontsize=8)
    ax.grid(False)
    ax.set_xlabel("prompt length (tokens)")
    trials = results.config.passkey_trials * len(results.seeds)
    ax.set_title(
        f"Passkey retrieval: accuracy [Wilson 95% interval], {trials} trials per cell (all seeds)", fontsize=10
    )
    fig.colorbar(image, ax=ax, fraction=0.04)
    return save(fig, directory / "passkey")


def _retrieval_figure(results: Results, directory: Path) -> list[Path]:
    from ..plots import save

    plt = _plt()
    groups = panels(results)
    L = results.config.train_length
    fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 4.2), squeeze=False, sharey=True)
    for j, (title, methods) in enumerate(groups):
        ax = axes[0][j]
        for m in methods:
            xs, stats = [], []
            for d in results.distances:
                v = results.retrieval(m.model, m.scaling, d)
                if v is not None:
                    xs.append(d), stats.append(v.stat)
            if not xs:
                continue
            look = style(results, m)
            ax.plot(xs, [s.mean for s in stats], label=m.label, **look)
            if len(results.seeds) > 1:
                ax.fill_between(
                    xs, [s.low for s in stats], [s.high for s in stats], color=look["color"], alpha=0.12, linewidth=0
                )
        ax.axvline(L, color="#444444", linewidth=1, linestyle="--")
        ax.axhline(0, color="#888888", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(results.distances, [f"{d / L:.3g}L" for d in results.distances], fontsize=8)
        ax.set_xlabel(f"distance between the two copies (L = {L} dashed)")
        ax.set_title(title, fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("retrieval gain (nats per byte)")
    fig.suptitle(
        f"Retrieval: loss on a repeated {results.config.retrieval_span}-byte random span, control minus copy "
        "(0 = nothing retrieved)",
        fontsize=11,
    )
    fig.tight_layout()
    return save(fig, directory / "retrieval")


def _tasks_figure(results: Results, directory: Path) -> list[Path]:
    """Copy and recall accuracy against length, one panel per task, with Wilson bands and chance dotted."""
    from ..plots import save
    from .tasks import CHANCE

    plt = _plt()
    base = results.config.task_length
    lengths = results.task_lengths
    fig, axes = plt.subplots(1, len(results.tasks), figsize=(6.2 * len(results.tasks), 4.2), squeeze=False, sharey=True)
    for j, task in enumerate(results.tasks):
        ax = axes[0][j]
        for m in results.task_methods():
            found = [results.task_interval(m.model, m.scaling, task, e) for e in lengths]
            xs = [e for e, v in zip(lengths, found) if v is not None]
            if not xs:
                continue
            vs = [v for v in found if v is not None]
            look = style(results, dataclasses.replace(m, stage="pretrain", model=m.encoding))
            ax.plot(xs, [v[0] for v in vs], label=m.label, **look)
            ax.fill_between(xs, [v[1] for v in vs], [v[2] for v in vs], color=look["color"], alpha=0.12, linewidth=0)
        ax.axvline(base, color="#444444", linewidth=1, linestyle="--")
        ax.axhline(CHANCE[task], color="#888888", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{e} ({e / base:g}L)" for e in lengths], fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_xlabel(f"row length (trained at {base}, dashed; chance dotted)")
        ax.set_title("copy" if task == "copy" else "associative recall", fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("accuracy per answer byte")
    fig.suptitle("Synthetic tasks: accuracy with its Wilson 95% interval, all seeds pooled", fontsize=11)
    fig.tight_layout()
    return save(fig, directory / "tasks")


def draw_figures(results: Results, directory: Path, predicted: dict[str, float] | None = None) -> dict[str, list[Path]]:
    """Perplexity, loss by position, and where measured passkey, retrieval and the tasks:
    ``{"perplexity": [png, svg], ...}``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    figures = {
        "perplexity": _perplexity_figure(results, directory),
        "buckets": _positions_figure(results, directory, predicted),
    }
    if results.rows.passkey:
        figures["passkey"] = _passkey_figure(results, directory)
    if results.distances:
        figures["retrieval"] = _retrieval_figure(results, directory)
    if results.tasks:
        figures["tasks"] = _tasks_figure(results, directory)
    return figures


def loss_curves(
    models: Sequence[dict], directory: Path, name: str, title: str, offsets: dict[str, int] | None = None
) -> list[Path]:
    """Training loss against step per model name (seed mean, smoothed over 20 steps); ``offsets``: model ->
    the step its first logged step is.
    """
    from ..plots import PALETTE, save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    by_model: dict[str, list[list[float]]] = {}
    labels: dict[str, str] = {}
    for record in models:
        if record["losses"]:
            by_model.setdefault(record["model"], []).append(record["losses"])
            labels[record["model"]] = record["label"]
    for i, (model, runs) in enumerate(by_model.items()):
        steps = min(len(r) for r in runs)
        mean = [sum(r[s] for r in runs) / len(runs) for s in range(steps)]
        smooth = [sum(mean[max(0, s - 19) : s + 1]) / len(mean[max(0, s - 19) : s + 1]) for s in range(steps)]
        start = (offsets or {}).get(model, 0)
        ax.plot(
            range(start + 1, start + steps + 1),
            smooth,
            label=labels[model],
            color=PALETTE[i % len(PALETTE)],
            linewidth=1.6,
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (nats, 20-step mean)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, directory / name)
