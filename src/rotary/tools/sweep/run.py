"""``rotary sweep``: every scaling at every length of one checkpoint, written as it goes.

Every input (the checkpoint and its RoPE, the scalings it admits, the memory the longest length needs, the
text) is checked before ``--out`` is created. Then for each (scaling, length), a *unit*, transformers builds a
model from the config edited for that scaling at factor ``length / original``, its tables are checked against
rotary's, and it measures perplexity and passkey retrieval. Each unit's rows are appended to the CSV files and
``sweep.json`` is rewritten atomically; a sweep started again with the same settings into the same ``--out``
skips the units it finds there. ``report.md`` and the figures come last.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError
from ...rope import RoPE
from ..experiments.stats import wilson
from ..io import write_atomic
from .checkpoint import (
    ALL_SCALINGS,
    Checkpoint,
    build_model,
    check_tables,
    factor_for,
    open_checkpoint,
    scaled_config,
    transformers_config,
)
from .data import Documents, load_documents
from .measure import bootstrap, passkey_length, passkey_prompts, passkey_scores, perplexity

__all__ = ["SweepSettings", "check_memory", "default_lengths", "prepare", "run_sweep", "write_report"]

FORMAT = 1
PERPLEXITY_FIELDS = (
    "scaling",
    "factor",
    "length",
    "mode",
    "stride",
    "documents",
    "tokens",
    "loss",
    "perplexity",
    "low",
    "high",
)
PASSKEY_FIELDS = ("scaling", "factor", "length", "depth", "correct", "trials", "accuracy", "low", "high")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PASS_ACCURACY = 0.8


@dataclass
class SweepSettings:
    """What a sweep measures (kept in ``sweep.json``; a resumed sweep must match).

    ``model``: checkpoint directory or hub id; ``lengths`` (None: :func:`default_lengths`), ``scalings`` (None:
    every one the checkpoint admits), ``data`` (None: the built-in text); ``stride`` (None: a quarter of the
    length); ``trials`` per (length, depth), 0: no passkey; ``patch``: through ``rotary.hf.patch``;
    ``full_attention``: sliding-window attention off.
    """

    model: str
    lengths: list[int] | None = None
    scalings: list[str] | None = None
    data: list[str] | None = None
    documents: int = 4
    stride: int | None = None
    max_windows: int = 4
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    trials: int = 4
    original_length: int | None = None
    patch: bool = False
    full_attention: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    device_map: str | None = None


def default_lengths(original: int) -> list[int]:
    """Powers of two from half the original context to 8x it (the original itself when it is not one).

    >>> default_lengths(128), default_lengths(4096)[:2]
    ([64, 128, 256, 512, 1024], [2048, 4096])
    """
    low, high = original // 2, original * 8
    lengths = [2**k for k in range(1, 64) if low <= 2**k <= high]
    return sorted(set(lengths + [original]))


def _available_bytes(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def memory_needed(checkpoint: Checkpoint, length: int, dtype: torch.dtype, rows: int = 1) -> dict[str, int]:
    """Bytes one forward of ``rows`` windows of ``length`` tokens needs, by part (an estimate, on the high side):
    scores (eager) or one boolean mask (SDPA), a passkey prompt's KV cache, activations, logits.
    """
    from .measure import LOGIT_BUDGET

    c = checkpoint.config
    hidden = int(c.get("hidden_size") or 0)
    heads = int(c.get("num_attention_heads") or 1)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    itemsize = torch.finfo(dtype).bits // 8
    eager = (c.get("attn_implementation") or c.get("_attn_implementation")) == "eager"
    weights = checkpoint.weights_bytes * itemsize // 4 if checkpoint.weights_bytes else 0
    return {
        "weights": weights,
        "attention scores": rows * length * length * (heads * 4 if eager else 1),
        "KV cache": rows * 2 * checkpoint.num_layers * length * kv_heads * head_dim * itemsize,
        "activations": rows * length * max(hidden, 1) * 12 * 4,
        "logits": min(LOGIT_BUDGET, rows * length * max(checkpoint.vocab_size, 1)) * 4,
    }


def check_memory(checkpoint: Checkpoint, settings: SweepSettings, lengths: Sequence[int]) -> None:
    """Raise InputError when the longest length needs more than the device's free memory, saying how much."""
    if settings.device_map is not None:
        return  # accelerate spreads the model; its own planning decides
    longest = max(lengths)
    parts = memory_needed(checkpoint, longest, DTYPES[settings.dtype])
    needed, available = sum(parts.values()), _available_bytes(settings.device)
    if needed > available:
        detail = ", ".join(f"{k} {v / 2**30:.3g}" for k, v in parts.items() if v)
        raise InputError(
            f"--lengths {longest}: one window of {longest} tokens needs about {needed / 2**30:.3g} GiB ({detail} GiB) "
            f"and {settings.device} has {available / 2**30:.3g} GiB free; give shorter --lengths, a smaller --dtype, "
            "or --device-map auto"
        )


@dataclass
class Prepared:
    """Everything checked, before anything is written."""

    settings: SweepSettings
    checkpoint: Checkpoint
    lengths: list[int]
    scalings: list[str]
    documents: Documents
    tokenizer: Any
    passkey_from: int | None = None


def prepare(settings: SweepSettings) -> Prepared:
    """Check every input of a sweep (nothing is written); InputError naming the bad one."""
    quiet_transformers()
    checkpoint = open_checkpoint(settings.model, original_length=settings.original_length)
    if settings.device_map is not None:
        import accelerate  # noqa: F401  (from_pretrained's device_map needs it; the CLI names the package to install)
    refused = refused_scalings(checkpoint)
    admitted = [s for s in ALL_SCALINGS if s not in refused]
    scalings = list(settings.scalings) if settings.scalings else admitted
    for s in scalings:
        if s not in ALL_SCALINGS:
            raise InputError(f"--scalings: unknown scaling {s!r}; known: {', '.join(ALL_SCALINGS)}")
        if s in refused:
            raise InputError(
                f"--scalings {s}: this {checkpoint.model_type} checkpoint does not admit it ({refused[s]}); it admits "
                f"{', '.join(admitted)}"
            )
    lengths = sorted(set(settings.lengths or default_lengths(checkpoint.original_length)))
    if lengths[0] < 4:
        raise InputError(f"--lengths must be at least 4 tokens, got {lengths[0]}")
    stride_bad = settings.stride is not None and settings.stride >= lengths[0]
    if stride_bad:
        raise InputError(f"--stride {settings.stride} must be shorter than the shortest length {lengths[0]}")
    if settings.dtype not in DTYPES:
        raise InputError(f"--dtype {settings.dtype!r}: choose one of {', '.join(DTYPES)}")
    check_memory(checkpoint, settings, lengths)
    tokenizer = _tokenizer(checkpoint)
    documents = load_documents(settings.data, tokenizer, longest=max(lengths), limit=settings.documents)
    passkey_from = None
    if settings.trials:
        passkey_from = passkey_length(tokenizer)
        if passkey_from > lengths[-1]:
            raise InputError(
                f"--lengths: a passkey prompt needs at least {passkey_from} tokens with this tokenizer, longer than "
                f"the longest length {lengths[-1]}; give longer --lengths or --no-passkey"
            )
    return Prepared(settings, checkpoint, lengths, scalings, documents, tokenizer, passkey_from)


def quiet_transformers() -> None:
    """transformers' progress bars and config warnings off (the sweep checks each model's tables itself)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def refused_scalings(checkpoint: Checkpoint, window: int | None = None) -> dict[str, str]:
    """The scalings the checkpoint's family does not admit, and why (LongRoPE without the model's factors,
    blocks transformers' config class refuses).
    """
    refused = {}
    for scaling in ALL_SCALINGS:
        if scaling == "longrope" and not checkpoint.has_longrope_factors:
            refused[scaling] = "LongRoPE needs the model's own short_factor and long_factor"
            continue
        config = scaled_config(checkpoint, scaling, 2.0)
        try:
            transformers_config(checkpoint, config, window=window)
        except Exception as exc:  # transformers' config validation: ValueError or its own error classes
            reason = str(exc).strip().splitlines()[-1].strip() if str(exc).strip() else type(exc).__name__
            refused[scaling] = f"transformers' {checkpoint.model_type} config refuses it: {reason}"
            continue
        try:  # the tables every model is checked against: read here, before anything is written
            for kind in checkpoint.layer_types:
                RoPE.from_hf_config(config, layer_type=kind)
        except InputError as exc:
            refused[scaling] = f"rotary cannot read the edited config: {exc}"
    return refused


def _tokenizer(checkpoint: Checkpoint):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(checkpoint.source)
    except Exception as exc:  # no tokenizer files, an unknown tokenizer class: one line
        raise InputError(
            f"{checkpoint.source}: no tokenizer transformers can load ({type(exc).__name__}); save the model's "
            "tokenizer beside it (tokenizer.save_pretrained)"
        ) from None


def _unit_key(scaling: str, length: int) -> str:
    return f"{scaling}@{length}"


def _settings_record(p: Prepared) -> dict[str, Any]:
    return {
        **dataclasses.asdict(p.settings),
        "lengths": p.lengths,
        "scalings": p.scalings,
        "original_length": p.checkpoint.original_length,
        "data_sha256": p.documents.sha256,
    }


def _write_json(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=1, allow_nan=True) + "\n")


def _write_csv(path: Path, fields: Sequence[str], rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _append_csv(path: Path, fields: Sequence[str], rows: list[dict]) -> None:
    with open(path, "a", newline="", encoding="utf-8") as f:
        csv.DictWriter(f, fieldnames=fields).writerows(rows)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def full_window(p: Prepared) -> int:
    """The sliding window ``--full-attention`` sets: longer than any sequence the sweep runs."""
    return max(p.lengths) + 64


#: tokens per forward: windows of a length are batched up to it (one window when longer)
BATCH_TOKENS = 4096


def rows_for(length: int) -> int:
    """Windows of ``length`` tokens per forward (:data:`BATCH_TOKENS`).

    >>> rows_for(128), rows_for(8192)
    (32, 1)
    """
    return max(1, BATCH_TOKENS // length)


def measure_unit(p: Prepared, scaling: str, length: int, model=None) -> tuple[list[dict], list[dict], Any]:
    """The perplexity and passkey rows of one (scaling, length), on a fresh model (returned too)."""
    s = p.settings
    factor = factor_for(length, p.checkpoint.original_length)
    config = scaled_config(p.checkpoint, scaling, factor)
    if model is None:
        model = build_model(
            p.checkpoint,
            config,
            device=s.device,
            dtype=DTYPES[s.dtype],
            device_map=s.device_map,
            window=full_window(p) if s.full_attention else None,
            patch=s.patch,
        )
    check_tables(model, p.checkpoint, config, length)
    stride = s.stride or max(1, length // 4)
    ppl_rows = []
    for mode in ("first", "sliding"):
        losses = perplexity(
            model, p.documents.tokens, length, mode, stride=stride, max_windows=s.max_windows, rows=rows_for(length)
        )
        low, high = bootstrap(losses)
        loss = losses.loss
        ppl_rows.append(
            {
                "scaling": scaling,
                "factor": factor,
                "length": length,
                "mode": mode,
                "stride": length if mode == "first" else stride,
                "documents": losses.counts.numel(),
                "tokens": int(losses.counts.sum()),
                "loss": loss,
                "perplexity": math.inf if loss > 700 else math.exp(loss),
                "low": low,
                "high": high,
            }
        )
    passkey_rows = []
    if s.trials and length >= (p.passkey_from or 0):
        prompts = passkey_prompts(p.tokenizer, length, s.depths, s.trials)
        for depth, (correct, trials) in passkey_scores(model, p.tokenizer, prompts, rows=rows_for(length)).items():
            low, high = wilson(correct, trials)
            passkey_rows.append(
                {
                    "scaling": scaling,
                    "factor": factor,
                    "length": length,
                    "depth": depth,
                    "correct": correct,
                    "trials": trials,
                    "accuracy": correct / trials,
                    "low": low,
                    "high": high,
                }
            )
    return ppl_rows, passkey_rows, model


def run_sweep(settings: SweepSettings, out: str | os.PathLike, *, log=None) -> dict[str, Any]:
    """Run (or resume) a sweep into ``out``; returns what ``sweep.json`` holds. InputError for bad input (nothing
    is written) or an ``out`` holding a sweep of other settings.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    p = prepare(settings)
    record = _settings_record(p)
    directory = Path(out)
    state_file = directory / "sweep.json"
    state: dict[str, Any] = {"format": FORMAT, "settings": record, "done": [], "perplexity": [], "passkey": []}
    if state_file.exists():
        try:
            found = json.loads(state_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            found = None
        if not isinstance(found, dict) or found.get("settings") != record:
            raise InputError(
                f"--out {out}: holds a sweep of other settings (or an unreadable sweep.json); choose another --out "
                "or delete it"
            )
        state = found
        state["status"] = "running"
    elif directory.exists() and any(directory.iterdir()):
        raise InputError(f"--out {out}: exists and holds no sweep.json; choose a new or empty directory")
    directory.mkdir(parents=True, exist_ok=True)
    ck = p.checkpoint
    state["model"] = {
        "model_type": ck.model_type,
        "config_form": ck.form,
        "original_length": ck.original_length,
        "rope": {str(k): v for k, v in ck.blocks.items()},
        "layer_types_scaled": [str(k) for k in ck.layer_types],
        "sliding_window": ck.sliding_window,
        "sliding_window_off": settings.full_attention,
        "nope_layers": list(ck.nope_layers),
        "backend": "rotary.hf.patch" if settings.patch else "transformers",
        "documents": p.documents.names,
        "data": p.documents.source,
        "passkey_from": p.passkey_from,
    }
    _write_csv(directory / "perplexity.csv", PERPLEXITY_FIELDS, state["perplexity"])
    _write_csv(directory / "passkey.csv", PASSKEY_FIELDS, state["passkey"])
    _write_json(state_file, state)

    if ck.sliding_window is not None:
        if settings.full_attention:
            log(
                f"sliding-window attention ({ck.sliding_window} tokens) switched off: every "
                "layer attends to the whole window"
            )
        elif ck.sliding_window < max(p.lengths):
            log(
                f"note: this {ck.model_type} attends within {ck.sliding_window} tokens (sliding window); past it "
                "perplexity stays flat whatever the scaling. --full-attention measures the RoPE's own reach"
            )
    if p.passkey_from is not None and p.passkey_from > p.lengths[0]:
        log(f"passkey prompts need {p.passkey_from} tokens with this tokenizer: passkey from that length on")
    units = [(s, L) for s in p.scalings for L in p.lengths]
    done = set(state["done"])
    todo = [u for u in units if _unit_key(*u) not in done]
    if len(todo) < len(units):
        log(f"resuming {out}: {len(units) - len(todo)} of {len(units)} measurements already there")
    cost_total = sum(L for _, L in todo)
    cost_done, started = 0, time.perf_counter()
    for i, (scaling, length) in enumerate(todo, 1):
        ppl_rows, passkey_rows, model = measure_unit(p, scaling, length)
        del model
        state["perplexity"] += ppl_rows
        state["passkey"] += passkey_rows
        state["done"].append(_unit_key(scaling, length))
        _append_csv(directory / "perplexity.csv", PERPLEXITY_FIELDS, ppl_rows)
        _append_csv(directory / "passkey.csv", PASSKEY_FIELDS, passkey_rows)
        _write_json(state_file, state)
        cost_done += length
        elapsed = time.perf_counter() - started
        eta = elapsed * (cost_total - cost_done) / cost_done
        first, slid = ppl_rows
        key = ""
        if passkey_rows:
            correct = sum(r["correct"] for r in passkey_rows)
            trials = sum(r["trials"] for r in passkey_rows)
            key = f", passkey {correct}/{trials}"
        log(
            f"[{len(units) - len(todo) + i}/{len(units)}] {scaling:<8} L={length:<7} ppl {first['perplexity']:.4g} "
            f"(first L), {slid['perplexity']:.4g} (sliding){key} | {_duration(elapsed)} elapsed, ETA {_duration(eta)}"
        )
    state["status"] = "finished"
    state["summary"] = summary(state)
    _write_json(state_file, state)
    write_report(state, directory)
    return state


def longest_passing(rows: list[dict], scaling: str) -> int | None:
    """The longest length up to which ``scaling``'s passkey accuracy (all depths) stays at or above 80%."""
    by_length: dict[int, list[int]] = {}
    for r in rows:
        if r["scaling"] == scaling:
            c = by_length.setdefault(r["length"], [0, 0])
            c[0] += r["correct"]
            c[1] += r["trials"]
    best = None
    for length in sorted(by_length):
        correct, trials = by_length[length]
        if correct / trials < PASS_ACCURACY:
            break
        best = length
    return best


def summary(state: dict[str, Any]) -> dict[str, Any]:
    """Per scaling: the longest passing passkey length and its accuracy (with Wilson interval) at each length."""
    out: dict[str, Any] = {}
    for scaling in state["settings"]["scalings"]:
        per_length = {}
        for length in state["settings"]["lengths"]:
            rows = [r for r in state["passkey"] if r["scaling"] == scaling and r["length"] == length]
            if rows:
                correct, trials = sum(r["correct"] for r in rows), sum(r["trials"] for r in rows)
                per_length[str(length)] = {"accuracy": correct / trials, "interval": list(wilson(correct, trials))}
        out[scaling] = {"longest_passkey_length": longest_passing(state["passkey"], scaling), "passkey": per_length}
    return out


def _figures(state: dict[str, Any], directory: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = directory / "figures"
    figures.mkdir(exist_ok=True)
    settings = state["settings"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, mode in zip(axes, ("first", "sliding")):
        for scaling in settings["scalings"]:
            rows = sorted(
                (r for r in state["perplexity"] if r["scaling"] == scaling and r["mode"] == mode),
                key=lambda r: r["length"],
            )
            if rows:
                xs = [r["length"] for r in rows]
                ax.plot(xs, [r["perplexity"] for r in rows], marker="o", label=scaling)
                ax.fill_between(xs, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.15)
        ax.axvline(settings["original_length"], color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("length (tokens)")
        ax.set_title("first L tokens of each document" if mode == "first" else "sliding windows")
    axes[0].set_ylabel("perplexity")
    axes[0].legend()
    fig.savefig(figures / "perplexity.png", dpi=100)
    plt.close(fig)
    names = ["figures/perplexity.png"]
    if state["passkey"]:
        depths = sorted({r["depth"] for r in state["passkey"]})
        lengths = settings["lengths"]
        scalings = settings["scalings"]
        fig, axes = plt.subplots(1, len(scalings), figsize=(2.2 * len(scalings) + 1.5, 3.2), squeeze=False, sharey=True)
        fig.subplots_adjust(bottom=0.25, wspace=0.08, left=0.08, right=0.86)
        for ax, scaling in zip(axes[0], scalings):
            grid = [[math.nan] * len(lengths) for _ in depths]
            for r in state["passkey"]:
                if r["scaling"] == scaling:
                    grid[depths.index(r["depth"])][lengths.index(r["length"])] = r["accuracy"]
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
            ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], rotation=45)
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
            ax.set_title(scaling)
            ax.set_xlabel("length")
        axes[0][0].set_ylabel("depth")
        fig.colorbar(image, cax=fig.add_axes((0.88, 0.25, 0.015, 0.65)), label="passkey accuracy")
        fig.savefig(figures / "passkey.png", dpi=100)
        plt.close(fig)
        names.append("figures/passkey.png")
    return names


def _fmt(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.4g}"


def write_report(state: dict[str, Any], directory: Path) -> Path:
    """``report.md`` (and, with matplotlib, the figures) from a sweep's state."""
    settings, model = state["settings"], state["model"]
    lines = [
        f"# rotary sweep: {settings['model']}",
        "",
        f"{model['model_type']} ({model['config_form']} config), original context {settings['original_length']} "
        "tokens, RoPE "
        + "; ".join(f"{k if k != 'None' else 'every layer'}: {v}" for k, v in model["rope"].items())
        + f"; backend {model['backend']}; {settings['dtype']} on {settings['device']}.",
        f"Text: {model['data']} ({len(model['documents'])} documents, sha256 {settings['data_sha256'][:12]}).",
    ]
    if model["sliding_window"] is not None:
        off = " (switched off for this sweep)" if model["sliding_window_off"] else ""
        lines.append(f"Sliding-window attention: {model['sliding_window']} tokens{off}.")
    if model["nope_layers"]:
        lines.append(f"Layers without RoPE: {model['nope_layers']}.")
    lines += [
        "",
        "Each model is built by transformers from the config edited for the scaling at factor max(1, length / "
        "original); its tables matched rotary's. Perplexity: token-weighted mean, 95% interval from resampling "
        "documents.",
        "",
    ]
    try:
        figures = _figures(state, directory)
    except ImportError:
        figures = []
        lines += [
            "Figures not drawn: matplotlib is not installed (rotary's [plot] extra: pip install -e '.[plot]').",
            "",
        ]
    for mode, title in (("first", "first L tokens of each document"), ("sliding", "sliding windows")):
        lines += [
            f"## Perplexity, {title}",
            "",
            "| scaling | " + " | ".join(str(L) for L in settings["lengths"]) + " |",
        ]
        lines.append("|---" * (len(settings["lengths"]) + 1) + "|")
        for scaling in settings["scalings"]:
            cells = []
            for length in settings["lengths"]:
                r = next(
                    (
                        r
                        for r in state["perplexity"]
                        if r["scaling"] == scaling and r["length"] == length and r["mode"] == mode
                    ),
                    None,
                )
                cells.append("" if r is None else f"{_fmt(r['perplexity'])} [{_fmt(r['low'])}, {_fmt(r['high'])}]")
            lines.append(f"| {scaling} | " + " | ".join(cells) + " |")
        lines.append("")
    if "figures/perplexity.png" in figures:
        lines += ["![perplexity against length](figures/perplexity.png)", ""]
    if state["passkey"]:
        lines += [
            "## Passkey retrieval",
            "",
            "Accuracy over all depths, 95% Wilson interval; last column: the longest "
            f"length up to which accuracy stays at or above {PASS_ACCURACY:.0%}.",
            "",
        ]
        lines.append("| scaling | " + " | ".join(str(L) for L in settings["lengths"]) + " | longest passing |")
        lines.append("|---" * (len(settings["lengths"]) + 2) + "|")
        for scaling in settings["scalings"]:
            s = state.get("summary", summary(state))[scaling]
            cells = []
            for length in settings["lengths"]:
                v = s["passkey"].get(str(length))
                cells.append(
                    "" if v is None else f"{v['accuracy']:.0%} [{v['interval'][0]:.0%}, {v['interval'][1]:.0%}]"
                )
            passing = s["longest_passkey_length"]
            lines.append(f"| {scaling} | " + " | ".join(cells) + f" | {passing if passing else 'none'} |")
        lines.append("")
        if "figures/passkey.png" in figures:
            lines += ["![passkey accuracy by length and depth](figures/passkey.png)", ""]
    path = directory / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
