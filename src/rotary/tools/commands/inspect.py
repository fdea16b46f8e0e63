"""``rotary inspect``: what a RoPE configuration does to each pair of channels."""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch

from rotary.analysis import Inspection, inspect_rope
from rotary.frequencies import frequencies
from rotary.hf.config import read_hf_config
from rotary.rope_types import ROPE_TYPES
from rotary.variants import MRoPE, nope_temperature

from ...errors import InputError
from .argument_types import length_count
from .configuration import PRESET_REPLACES, Configuration, add_config_arguments, configurations, flags_given
from .output import add_output_argument
from .printing import console, print_json

__all__ = ["register", "inspect_configuration", "layer_details", "render"]


def inspect_configuration(configuration: Configuration, seq_len: int | None = None) -> Inspection:
    """The inspection of one configuration; length-dependent types at ``seq_len`` (default: the context).

    >>> from rotary.tools.commands.configuration import Configuration
    >>> info = inspect_configuration(Configuration(rotary.RoPE(64), 4096, "--max-position"))
    >>> info.context, len(info.pairs())
    (4096, 32)
    """
    rope, context = configuration.rope, configuration.context
    f = rope.freqs
    if seq_len is None and ROPE_TYPES[f.rope_type].length_dependent:
        seq_len = context  # what the model uses at its full context (LongRoPE: the long factors)
    if seq_len is None:
        return inspect_rope(rope, context=context)
    freqs = frequencies(f.head_dim, base=f.base, rotary_dim=f.rotary_dim, scaling=dict(f.scaling), seq_len=seq_len)
    info = inspect_rope(rope, freqs=freqs, context=context)
    info.seq_len = seq_len
    return info


def layer_details(path: str | None, layer_type: str | None, context: int) -> dict[str, Any]:
    """What the config at ``path`` says beyond one RoPE: multimodal RoPE's axis per slot, the layers without
    RoPE and Llama 4's NoPE query temperature at ``context - 1``; empty otherwise.

    >>> layer_details(None, None, 4096)
    {}
    """
    if path is None:
        return {}
    s = read_hf_config(path, layer_type=layer_type)
    out: dict[str, Any] = {}
    if s.mrope_section is not None:
        mrope = MRoPE(
            s.head_dim,
            mrope_section=s.mrope_section,
            mrope_layout=s.mrope_layout,
            base=s.base,
            rotary_dim=s.rotary_dim,
            scaling=s.scaling,
            interleaved=s.interleaved,
        )
        out["mrope"] = {
            "mrope_section": list(s.mrope_section),
            "layout": s.mrope_layout,
            "axes": mrope.slot_axes(),
        }
    if s.rope_layers is not None:
        out["nope_layers"] = [i for i, uses_rope in enumerate(s.rope_layers) if not uses_rope]
        out["num_layers"] = len(s.rope_layers)
        if s.nope_temperature is not None:
            last = nope_temperature(torch.tensor([context - 1]), **s.nope_temperature)
            out["nope_temperature"] = {**s.nope_temperature, "at_context": float(last)}
    return out


def _runs(axes: str) -> str:
    """``"TTHHHWWW"`` -> ``"T 0-1, H 2-4, W 5-7"``; an interleaved layout is shown as it is."""
    runs, start = [], 0
    for i in range(1, len(axes) + 1):
        if i == len(axes) or axes[i] != axes[start]:
            runs.append(f"{axes[start]} {start}" + (f"-{i - 1}" if i - 1 > start else ""))
            start = i
    return ", ".join(runs) if len(runs) <= 6 else axes


def _param(value: Any) -> str:
    """A scaling parameter for the header: a short sequence as a list, a long one by its length.

    >>> _param((16, 24, 24)), _param([1.0] * 48), _param(8.0)
    ('[16, 24, 24]', '[48 values]', '8.0')
    """
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(map(str, value))}]" if len(value) <= 4 else f"[{len(value)} values]"
    return str(value)


def _fmt(x: float, digits: int = 4) -> str:
    if not math.isfinite(x):
        return "∞"
    return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3e}"


def render(
    info: Inspection, context_source: str = "", layer_type: str | None = None, details: dict[str, Any] | None = None
) -> None:
    """Print ``info`` as rich tables, with how the context was chosen, its layer type and ``details``."""
    from rich.table import Table

    details = details or {}
    axes = details.get("mrope", {}).get("axes")
    out = console()
    if layer_type is not None:
        out.print(f"[bold]layer type {layer_type}[/]")
    scaled = any(k not in ("unchanged",) for k in info.profile.kind)
    params = ", ".join(f"{k}={_param(v)}" for k, v in info.scaling.items() if k not in ("rope_type", "type"))
    out.print(
        f"[bold]rope_type[/] {info.rope_type}  [bold]head_dim[/] {info.head_dim}  [bold]rotary_dim[/] "
        f"{info.rotary_dim}  [bold]base[/] {info.base:g}  [bold]pairing[/] "
        f"{'interleaved (2i, 2i+1)' if info.interleaved else 'half (i, i+d/2)'}"
    )
    out.print(f"[bold]context[/] {info.context}" + (f" (from {context_source})" if context_source else ""))
    out.print(
        f"[bold]attention_scaling[/] {info.attention_scaling:.6g}"
        + (f"   [bold]frequencies at sequence length[/] {info.seq_len}" if info.seq_len else "")
        + (f"   [bold]scaling[/] {params}" if params else "")
    )
    if axes:
        m = details["mrope"]
        out.print(
            f"[bold]multimodal RoPE[/] mrope_section {m['mrope_section']} ({m['layout']}): pairs by axis "
            f"({'T temporal, H height, W width' if 'T' in axes else 'XD-RoPE axis numbers'}) {_runs(axes)}"
        )
    if "nope_layers" in details:
        layers = details["nope_layers"]
        shown = ", ".join(map(str, layers)) if layers else "none"
        out.print(f"[bold]NoPE layers[/] (no rotation) {shown} of {details['num_layers']}")
        if "nope_temperature" in details:
            t = details["nope_temperature"]
            out.print(
                f"[bold]NoPE query temperature[/] 1 + {t['attn_scale']:g}·log(1 + ⌊(n+1)/{t['floor_scale']}⌋): "
                f"{t['at_context']:.5g} at position {info.context - 1}"
            )
    what = f"{info.rope_type} RoPE" + (f" ({layer_type} layers)" if layer_type else "")
    table = Table(title=f"pairs of {what}", title_justify="left")
    for col in ["pair", *(["axis"] if axes else []), "inv_freq θ", "wavelength (tokens)", f"turns in {info.context}"]:
        table.add_column(col, justify="right")
    if scaled:
        for col in ["original wavelength", "factor", "pair is"]:
            table.add_column(col, justify="right" if col != "pair is" else "left")
    for row in info.pairs():
        axis = [axes[row["pair"]]] if axes else []
        cells = [str(row["pair"]), *axis, f"{row['inv_freq']:.6g}", _fmt(row["wavelength"], 5), _fmt(row["turns"], 4)]
        if scaled:
            cells += [_fmt(row["original_wavelength"], 5), _fmt(row["factor"], 4), row["kind"]]
        table.add_row(*cells, style="yellow" if row["turns"] < 1 else None)
    out.print(table)
    prec = Table(title="position precision at this context", title_justify="left")
    for col in ["dtype", "exact positions below", "position rounding (tokens)", "pair-0 angle rounding (rad)"]:
        prec.add_column(col, justify="right")
    for p in info.precision:
        prec.add_row(p.dtype, str(p.exact_positions), f"{p.position_error:g}", f"{p.angle_error:.2g}")
    out.print(prec)
    for w in info.warnings:
        out.print(f"[bold yellow]warning:[/] {w}")


def _as_dict(configuration: Configuration, info: Inspection, details: dict[str, Any]) -> dict[str, Any]:
    return {
        "layer_type": configuration.layer_type,
        **info.to_dict(),
        "context_source": configuration.context_source,
        **details,
    }


def axial_details(preset: str, head_dim: int | None = None) -> dict[str, Any]:
    """The pairs of an axial RoPE preset: each pair's axis, frequency and wavelength in coordinate units.

    >>> d = axial_details("pixtral")
    >>> d["axes"], d["head_dim"], d["split"], d["pairs"][0]["axis"], d["pairs"][16]["axis"]
    (2, 64, [32, 32], 0, 1)
    """
    from rotary.variants import AxialRoPE

    rope = AxialRoPE.preset(preset, head_dim)
    slots = rope.slot_axes
    wavelengths = rope.wavelengths.tolist()
    pairs = [
        {"pair": i, "axis": int(a), "wavelength": w, "inv_freq": 2 * math.pi / w if w else math.inf}
        for i, (a, w) in enumerate(zip(slots, wavelengths))
    ]
    return {
        "preset": preset,
        "head_dim": rope.head_dim,
        "rotary_dim": rope.rotary_dim,
        "axes": rope.axes,
        "split": list(rope.split),
        "coordinates": rope.coordinate_kind,
        "interleaved": rope.interleaved,
        "pairs": pairs,
    }


def _inspect_axial(args: argparse.Namespace) -> int:
    if args.config is not None:
        raise InputError(f"--axial {args.axial!r} describes a preset, not CONFIG {args.config!r}; give one of them")
    given = flags_given(args, (*PRESET_REPLACES, "seq_len"))
    if given:  # as rotary verify --axial: the preset is the configuration; only its width may change
        raise InputError(
            f"--axial {args.axial} takes the preset's configuration; drop {', '.join(given)} (--head-dim may change)"
        )
    d = axial_details(args.axial, args.head_dim)
    if args.json:
        print_json(d)
        return 0
    from rich.table import Table

    out = console()
    out.print(
        f"[bold]axial RoPE preset[/] {d['preset']}  [bold]head_dim[/] {d['head_dim']}  [bold]rotary_dim[/] "
        f"{d['rotary_dim']}  [bold]axes[/] {d['axes']} (split {d['split']})  [bold]coordinates[/] {d['coordinates']}  "
        f"[bold]pairing[/] {'interleaved (2i, 2i+1)' if d['interleaved'] else 'half (i, i+d/2)'}"
    )
    table = Table(title=f"pairs of axial preset {d['preset']}: the axis each pair reads", title_justify="left")
    for col in ("pair", "axis", "frequency", "wavelength (coordinate units)"):
        table.add_column(col, justify="right")
    for p in d["pairs"]:
        table.add_row(str(p["pair"]), str(p["axis"]), f"{p['inv_freq']:.6g}", _fmt(p["wavelength"], 5))
    out.print(table)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    if getattr(args, "axial", None) is not None:
        return _inspect_axial(args)
    found = configurations(argparse.Namespace(**vars(args), all_layer_types=True))
    results = []
    for c in found:
        info = inspect_configuration(c, args.seq_len)
        results.append((c, info, layer_details(args.config, c.layer_type, info.context)))
    if args.json:
        if len(results) == 1:
            print_json(_as_dict(*results[0]))
        else:
            print_json({"layer_types": {c.layer_type: _as_dict(c, info, details) for c, info, details in results}})
        return 0
    for j, (c, info, details) in enumerate(results):
        if j:
            print()
        render(info, c.context_source, c.layer_type if len(results) > 1 or args.layer_type else None, details)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="per-pair frequencies, wavelengths and scaling of a configuration",
        description="For each pair: inv_freq, wavelength 2π/θ in tokens, full turns within the context, and for "
        "scaling methods the factor applied and whether the pair is interpolated, extrapolated or blended; "
        "the attention scaling; warnings for pairs that never turn and for position precision. The context is "
        "--max-position, else what the scaling block enables (factor × original_max_position_embeddings) or the "
        "config's max_position_embeddings, whichever is larger. A config with one RoPE block per layer type (Gemma-3) "
        "gives one table per layer type unless --layer-type picks one.",
    )
    add_config_arguments(p)
    p.add_argument(
        "--seq-len", type=length_count, help="sequence length for length-dependent rope_types (dynamic, longrope)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    from rotary.variants import PRESETS

    p.add_argument(
        "--axial",
        choices=sorted(PRESETS),
        metavar="PRESET",
        help="an axial RoPE preset instead of a config: the axis, frequency and wavelength of each pair "
        f"(--head-dim overrides its width; one of {', '.join(sorted(PRESETS))})",
    )
    add_output_argument(p, "file", None, "write the output to this file")
    p.set_defaults(func=_inspect)
