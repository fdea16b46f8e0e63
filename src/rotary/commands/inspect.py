"""``rotary inspect``: what a RoPE configuration does to each pair of channels."""

from __future__ import annotations

import argparse
import math

from rotary.analysis import Inspection, inspect_rope
from rotary.frequencies import frequencies
from rotary.rope_types import ROPE_TYPES

from .common import add_config_arguments, console, positive_int, print_json, rope_from_args

__all__ = ["register", "inspection_from_args", "render"]


def inspection_from_args(args: argparse.Namespace) -> Inspection:
    rope, context = rope_from_args(args)
    f = rope.freqs
    seq_len = getattr(args, "seq_len", None)
    if seq_len is None and ROPE_TYPES[f.rope_type].length_dependent:
        seq_len = context  # what the model uses at its full context (LongRoPE: the long factors)
    if seq_len is None:
        return inspect_rope(rope, context=context)
    freqs = frequencies(f.head_dim, base=f.base, rotary_dim=f.rotary_dim, scaling=dict(f.scaling), seq_len=seq_len)
    info = inspect_rope(rope, freqs=freqs, context=context)
    info.seq_len = seq_len
    return info


def _fmt(x: float, digits: int = 4) -> str:
    if not math.isfinite(x):
        return "∞"
    return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3e}"


def render(info: Inspection) -> None:
    """Print ``info`` as rich tables."""
    from rich.table import Table

    out = console()
    scaled = any(k not in ("unchanged",) for k in info.profile.kind)
    params = ", ".join(f"{k}={v}" for k, v in info.scaling.items() if k not in ("rope_type", "type") and not isinstance(v, list))
    out.print(
        f"[bold]rope_type[/] {info.rope_type}  [bold]head_dim[/] {info.head_dim}  [bold]rotary_dim[/] {info.rotary_dim}  "
        f"[bold]base[/] {info.base:g}  [bold]context[/] {info.context}  [bold]pairing[/] "
        f"{'interleaved (2i, 2i+1)' if info.interleaved else 'half (i, i+d/2)'}"
    )
    out.print(
        f"[bold]attention_scaling[/] {info.attention_scaling:.6g}"
        + (f"   [bold]frequencies at sequence length[/] {info.seq_len}" if info.seq_len else "")
        + (f"   [bold]scaling[/] {params}" if params else "")
    )
    table = Table(title=f"pairs of {info.rope_type} RoPE", title_justify="left")
    for col in ["pair", "inv_freq θ", "wavelength (tokens)", f"turns in {info.context}"]:
        table.add_column(col, justify="right")
    if scaled:
        for col in ["original wavelength", "factor", "pair is"]:
            table.add_column(col, justify="right" if col != "pair is" else "left")
    for row in info.pairs():
        cells = [str(row["pair"]), f"{row['inv_freq']:.6g}", _fmt(row["wavelength"], 5), _fmt(row["turns"], 4)]
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


def _inspect(args: argparse.Namespace) -> int:
    info = inspection_from_args(args)
    if args.json:
        print_json(info.to_dict())
    else:
        render(info)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="per-pair frequencies, wavelengths and scaling of a configuration",
        description="For each pair: inv_freq, wavelength 2π/θ in tokens, full turns within the context, and for "
        "scaling methods the factor applied and whether the pair is interpolated, extrapolated or blended; "
        "the attention scaling; warnings for pairs that never turn and for position precision.",
    )
    add_config_arguments(p)
    p.add_argument("--seq-len", type=positive_int, help="sequence length for length-dependent rope_types (dynamic, longrope)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=_inspect)
