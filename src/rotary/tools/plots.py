"""Matplotlib figures drawn from :mod:`rotary.analysis` results (Agg backend: headless).

Each ``plot_*`` function returns a Figure; :func:`save` writes it as PNG and SVG. Colours are the
Okabe-Ito palette, which stays distinguishable under the common colour-vision deficiencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures are written to files, never shown

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from rotary.analysis import PairProfile  # noqa: E402

__all__ = [
    "PALETTE",
    "save",
    "plot_decay",
    "plot_frequencies",
    "plot_scaling",
    "plot_scores",
    "plot_positions",
    "plot_axial_scores",
    "plot_learned_frequencies",
    "plot_mrope",
    "plot_xpos",
    "plot_nope_layers",
]

#: Okabe & Ito (2008), colour-blind-safe qualitative palette
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
#: background shading for each pair kind in the scaling figure
KIND_COLOURS = {
    "extrapolated": "#56B4E9",
    "blended": "#F0E442",
    "interpolated": "#E69F00",
    "raised": "#CC79A7",
    "not rotated": "#999999",
}

plt.rcParams.update(
    {"font.size": 11, "axes.titlesize": 12, "axes.grid": True, "grid.alpha": 0.3, "svg.hashsalt": "rotary"}
)


def save(fig: Figure, path: str | Path) -> list[Path]:
    """Write ``fig`` as ``<path>.png`` (150 dpi) and ``<path>.svg``; returns both paths (OSError naming a file
    that cannot be written).
    """
    stem = Path(path)
    if stem.suffix.lower() in (".png", ".svg"):
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")]
    try:
        # the tight box once, drawn at the PNG's resolution (what bbox_inches="tight" draws for the PNG), for both
        # files: each "tight" save would draw the figure twice
        fig.set_dpi(150)
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
        engine = fig.get_layout_engine()
        if engine is not None:
            # a figure with a layout engine is laid out by every savefig, in a draw of its own before the real one;
            # lay it out once here instead (constrained layout places the axes: before the box is measured), and
            # keep that layout for both files. tight_layout() leaves a placeholder engine that lays out nothing.
            engine.execute(fig)
            with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
                fig.set_layout_engine(None)
        box = fig.get_tightbbox(canvas.get_renderer()).padded(matplotlib.rcParams["savefig.pad_inches"])
        fig.savefig(out[0], dpi=150, bbox_inches=box)
        fig.savefig(out[1], bbox_inches=box, metadata={"Date": None})
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write the figure ({exc.strerror})", exc.filename) from None
    finally:
        plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------------
# vision variants and learnable frequencies (docs/variants.md)


def plot_axial_scores(maps: Mapping[str, torch.Tensor], *, extent: int, title: str) -> Figure:
    """Attention score against the offset (Δh, Δw), one heatmap per panel of ``maps``
    (:func:`rotary.variants.relative_scores`, ``[2 extent + 1, 2 extent + 1]``), relative to the score at no offset.
    """
    n = len(maps)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.8 * cols + 1.0, 3.6 * rows + 0.6), squeeze=False, layout="constrained"
    )
    im = None
    for ax, (label, scores) in zip(axes.flat, maps.items()):
        s = scores.double()
        s = s / s[extent, extent]
        im = ax.imshow(
            s.numpy(),
            cmap="RdBu_r",
            vmin=-1,
            vmax=1,
            origin="lower",
            interpolation="nearest",
            extent=(-extent - 0.5, extent + 0.5, -extent - 0.5, extent + 0.5),
        )
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("Δw (patches)")
        ax.set_ylabel("Δh (patches)")
        ax.grid(False)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), label="score / score at Δ = 0", shrink=0.8)
    return fig


def plot_learned_frequencies(
    wavelengths: Mapping[str, Sequence[float]], losses: Sequence[float], *, title: str
) -> Figure:
    """Wavelength per pair of several frequency sets (left) and the training loss (right)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = "os^vD"
    for j, (label, series) in enumerate(wavelengths.items()):
        ax.plot(
            range(len(series)),
            list(series),
            color=PALETTE[j % len(PALETTE)],
            marker=markers[j % len(markers)],
            ms=5 - j,
            lw=1.2,
            label=label,
        )
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    ax.set_title("frequencies per pair")
    ax.legend(fontsize=8)
    ax2.plot(range(1, len(losses) + 1), list(losses), color=PALETTE[3], lw=1.4)
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_ylabel("mean squared score error")
    ax2.set_title("training loss")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_decay(
    distances: Sequence[int],
    bound: torch.Tensor,
    measured: Mapping[str, torch.Tensor] | None = None,
    *,
    title: str = "Long-range decay of RoPE (d = 128, base 10000)",
) -> Figure:
    """The RoFormer paper's long-term decay bound against distance (``distances``, ``bound`` ``[N]``), with
    optional ``measured`` curves ``label -> [N]``.

    >>> from rotary.analysis import decay_bound
    >>> fig = plot_decay(range(65), decay_bound(128, distances=range(65)))
    >>> float(fig.axes[0].get_lines()[0].get_ydata()[0])  # d = 128 at distance 0: (d/2 + 1) / 2
    32.5
    """
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = list(distances)
    ax.plot(x, bound.tolist(), color=PALETTE[0], lw=2, label=r"bound: $\frac{1}{d/2}\sum_j |S_j|$")
    ax.set_xlabel("relative distance m − n (tokens)")
    ax.set_ylabel(r"mean $|S_j|$", color=PALETTE[0])
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if measured:
        ax2 = ax.twinx()
        ax2.grid(False)
        for colour, (label, values) in zip(PALETTE[1:], measured.items()):
            ax2.plot(x, values.tolist(), color=colour, lw=1.2, ls="--", label=label)
        ax2.set_ylabel(r"measured mean $|\langle R_m q, R_n k\rangle|$")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper right", fontsize=9)
    fig.tight_layout()
    return fig


def plot_frequencies(series: Mapping[str, Sequence[float]], *, context: int | None = None) -> Figure:
    """Wavelength ``2π/θ_i`` per pair for several configurations (log scale)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    markers = "os^vD<>p"
    for j, (label, wavelengths) in enumerate(series.items()):
        ys = [w if math.isfinite(w) else float("nan") for w in wavelengths]
        ax.plot(
            range(len(ys)),
            ys,
            color=PALETTE[j % len(PALETTE)],
            marker=markers[j % len(markers)],
            ms=3,
            lw=1.2,
            label=label,
        )
    if context:
        ax.axhline(context, color="grey", ls=":", lw=1, label=f"context {context} tokens")
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    ax.set_title("Wavelength per rotation pair")
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def plot_scaling(profile: PairProfile, *, rope_type: str, context: int | None = None, note: str = "") -> Figure:
    """Original vs scaled wavelength per pair, shaded by kind, with the interpolation ramp."""
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    n = len(profile.wavelength)
    for i, kind in enumerate(profile.kind):
        if kind in KIND_COLOURS:
            ax.axvspan(i - 0.5, i + 0.5, color=KIND_COLOURS[kind], alpha=0.25, lw=0)
    nan = float("nan")
    scaled = [w if math.isfinite(w) else nan for w in profile.wavelength]
    ax.plot(range(n), profile.original_wavelength, color=PALETTE[0], lw=2, label="original (rope_type default)")
    ax.plot(range(n), scaled, color=PALETTE[3], lw=2, ls="--", label=f"scaled ({rope_type})")
    if context:
        ax.axhline(context, color="grey", ls=":", lw=1, label=f"original context {context}")
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    ax.set_title(f"{rope_type}: wavelength per pair{' — ' + note if note else ''}")
    ax2 = ax.twinx()
    ax2.grid(False)
    ramp = [r if math.isfinite(r) else nan for r in profile.ramp]
    ax2.plot(range(n), ramp, color=PALETTE[2], lw=1.2, label="interpolation ramp (0 = original, 1 = ÷ factor)")
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_ylabel("ramp")
    kinds = [k for k in KIND_COLOURS if k in profile.kind]
    patches = [Patch(color=KIND_COLOURS[k], alpha=0.4, label=k) for k in kinds]
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2 + patches, l1 + l2 + kinds, loc="lower right", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    return fig


def plot_scores(scores: torch.Tensor, *, title: str = "Attention logits ⟨R_m q, R_n k⟩ of rotated q, k") -> Figure:
    """Heatmap of logits over (query m, key n) and the logit against relative distance m − n."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1, 1.2]})
    s = scores.double()
    lim = float(s.abs().max()) or 1.0
    im = ax.imshow(s.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, origin="upper", interpolation="nearest")
    ax.set_xlabel("key position n")
    ax.set_ylabel("query position m")
    ax.set_title("logit by query and key position")
    fig.suptitle(title)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="logit")
    # every (m, n) with the same m − n has the same logit; the first column gives m − n = 0 .. S-1
    ax2.plot(range(s.shape[0]), s[:, 0].tolist(), color=PALETTE[0], lw=1.5)
    ax2.set_xlabel("relative distance m − n (tokens)")
    ax2.set_ylabel("logit")
    ax2.set_title("logit against relative distance")
    fig.tight_layout()
    return fig


def plot_positions(coords: torch.Tensor, explained: torch.Tensor) -> Figure:
    """2-D PCA of the position tables, coloured by position."""
    fig, ax = plt.subplots(figsize=(6, 5))
    c = coords.double()
    sc = ax.scatter(c[:, 0].tolist(), c[:, 1].tolist(), c=list(range(c.shape[0])), cmap="viridis", s=14)
    ax.plot(c[:, 0].tolist(), c[:, 1].tolist(), color="grey", lw=0.4, alpha=0.6)
    fig.colorbar(sc, ax=ax, label="position")
    ev = [f"{100 * float(v):.1f}%" for v in explained]
    ax.set_xlabel(f"PC 1 ({ev[0]} of variance)")
    ax.set_ylabel(f"PC 2 ({ev[1]} of variance)")
    ax.set_title("Position tables [cos, sin] projected by PCA")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# text variants (docs/variants.md)

#: one colour per M-RoPE axis
AXIS_COLOURS = {"T": PALETTE[0], "H": PALETTE[1], "W": PALETTE[2]}
AXIS_NAMES = {"T": "temporal", "H": "height", "W": "width"}


def plot_mrope(layouts: Mapping[str, tuple[str, Sequence[float]]]) -> Figure:
    """Wavelength of each frequency slot, coloured by its axis; ``layouts``: title -> (``"TTHHWW"``, wavelengths)."""
    fig, axes = plt.subplots(len(layouts), 1, figsize=(8, 2.6 * len(layouts)), sharex=True, squeeze=False)
    for ax, (title, (letters, wavelength)) in zip(axes[:, 0], layouts.items()):
        for axis, colour in AXIS_COLOURS.items():
            slots = [i for i, a in enumerate(letters) if a == axis]
            ax.scatter(
                slots,
                [wavelength[i] for i in slots],
                color=colour,
                s=14,
                label=f"{AXIS_NAMES[axis]} ({len(slots)} slots)",
            )
        ax.set_yscale("log")
        ax.set_ylabel("wavelength (steps)")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("frequency slot i (θ_i = base^(−2i/r))")
    fig.tight_layout()
    return fig


def plot_xpos(
    distances: Sequence[int],
    factors: Mapping[str, Sequence[float]],
    scores: Mapping[str, Sequence[float]],
    *,
    scale_base: float,
) -> Figure:
    """xPos: the per-pair factor ζ_i^(Δ/γ) (left) and ``|⟨q, k⟩|`` of all-ones q, k (right) against distance."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = list(distances)
    for j, (label, values) in enumerate(factors.items()):
        ax.plot(x, list(values), color=PALETTE[j % len(PALETTE)], lw=1.6, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("distance Δ = n − m (tokens)")
    ax.set_ylabel("factor ζ_i^(Δ/γ)")
    ax.set_title(f"xPos factor per pair (γ = {scale_base:g})")
    ax.legend(fontsize=8)
    for j, (label, values) in enumerate(scores.items()):
        ax2.plot(
            x,
            [abs(v) for v in values],
            color=PALETTE[(j + 3) % len(PALETTE)],
            lw=1.0 if j else 1.8,
            label=label,
            zorder=3 - j,
        )
    ax2.set_yscale("log")
    ax2.set_xlabel("distance Δ = n − m (tokens)")
    ax2.set_ylabel("|⟨q, k⟩| after rotation")
    ax2.set_title("score of q = k = all ones")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_nope_layers(
    wavelengths: Mapping[str, Sequence[float]],
    positions: Sequence[int],
    temperature: Sequence[float],
    *,
    floor_scale: int,
    attn_scale: float,
) -> Figure:
    """p-RoPE's wavelength per pair (left) and Llama 4's NoPE query temperature against position (right)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    finite = [w for series in wavelengths.values() for w in series if math.isfinite(w)]
    top = max(finite) * 8
    for j, (label, series) in enumerate(wavelengths.items()):
        ys = [w if math.isfinite(w) else top for w in series]
        ax.plot(range(len(ys)), ys, color=PALETTE[j % len(PALETTE)], marker="os^v"[j % 4], ms=3, lw=1.2, label=label)
    ax.axhline(top, color="grey", ls=":", lw=1)
    ax.text(len(ys) - 1, top / 2.2, "never turns (no position)", fontsize=8, color="grey", ha="right")
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    ax.set_title("p-RoPE: only the fastest pairs rotate")
    ax.legend(fontsize=8, loc="lower right")
    ax2.step(list(positions), list(temperature), where="post", color=PALETTE[3], lw=1.6)
    for k in range(1, int(max(positions)) // floor_scale + 1):
        ax2.axvline(k * floor_scale - 1, color="grey", lw=0.5, ls=":")
    ax2.set_xlabel("query position n")
    ax2.set_ylabel("query scale τ(n)")
    ax2.set_title(f"Llama 4 NoPE layers: τ = 1 + {attn_scale:g}·log(1 + ⌊(n+1)/{floor_scale}⌋)")
    fig.tight_layout()
    return fig
