"""``rotary report``: inspect + verify + every figure for one configuration, as one self-contained
HTML page (figures embedded), the PNG/SVG files and a JSON of the numbers."""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from rotary.analysis import inspect_rope, jsonable, verify
from rotary.rope import RoPE

from ...errors import InputTypeError
from . import plot
from .argument_types import seq_len_count
from .configuration import add_config_arguments, config_label, every_layer_type
from .output import add_output_argument, output_directory
from .printing import print_json

__all__ = ["register", "write_report"]


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _num(x: float) -> str:
    return "∞" if not math.isfinite(x) else f"{x:.6g}"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
    "text-align:right}th{background:#f0f0f0}img{max-width:100%;border:1px solid #eee}.warn{color:#a15c00}"
    ".fail{color:#b00;font-weight:bold}.pass{color:#060}"
)


def _section(
    rope: RoPE, out_dir: Path, *, title: str, context: int, seq_len: int, suffix: str = ""
) -> tuple[dict[str, tuple[list[Path], dict[str, Any]]], dict[str, Any], list[str]]:
    """The figures (named ``<figure><suffix>``), numbers and HTML of one RoPE of the report."""
    info = inspect_rope(rope, context=context)
    checks = verify(rope, seq_len=seq_len, offset=context)
    figures: dict[str, tuple[list[Path], dict[str, Any]]] = {}
    figures["decay"] = plot.make_decay(
        out_dir / f"decay{suffix}", rope.head_dim, rope.freqs.base, 256, measured=True, samples=64
    )
    trained = rope.freqs.scaling.get("original_max_position_embeddings") or context
    figures["frequencies"] = plot.make_frequencies(
        out_dir / f"frequencies{suffix}",
        {
            title: rope,
            f"default, base {rope.freqs.base:g}": RoPE(rope.head_dim, base=rope.freqs.base, rotary_dim=rope.rotary_dim),
        },
        trained,
    )
    figures["scaling"] = plot.make_scaling(out_dir / f"scaling_{rope.freqs.rope_type}{suffix}", rope, context)
    figures["scores"] = plot.make_scores(out_dir / f"scores{suffix}", rope, min(seq_len, 128))
    figures["positions"] = plot.make_positions(out_dir / f"positions{suffix}", rope, 256)
    numbers = {
        "inspect": info.to_dict(),
        "verify": {"passed": all(c.passed for c in checks), "checks": [c.to_dict() for c in checks]},
        "figures": {name: {"files": [str(p) for p in files], **nums} for name, (files, nums) in figures.items()},
    }
    parts: list[str] = []
    d = info.to_dict()
    parts.append(
        _table(
            ["rope_type", "head_dim", "rotary_dim", "base", "context", "pairing", "attention_scaling"],
            [
                [
                    d["rope_type"],
                    d["head_dim"],
                    d["rotary_dim"],
                    _num(d["base"]),
                    d["context"],
                    "interleaved" if d["interleaved"] else "half",
                    _num(d["attention_scaling"]),
                ]
            ],
        )
    )
    if info.scaling:
        parts.append(f"<p>scaling: <code>{html.escape(json.dumps(jsonable(info.scaling)))}</code></p>")
    parts += [f"<p class='warn'>warning: {html.escape(w)}</p>" for w in info.warnings]
    verdict = (
        "<span class='pass'>all checks passed</span>"
        if numbers["verify"]["passed"]
        else "<span class='fail'>FAILED</span>"
    )
    parts.append(f"<h2>verify: {verdict}</h2>")
    parts.append(
        _table(
            ["", "check", "worst error", "tolerance"],
            [["PASS" if c.passed else "FAIL", c.name, f"{c.worst_error:.2e}", f"{c.tolerance:.1e}"] for c in checks],
        )
    )
    captions = {
        "decay": "Long-term decay bound (RoFormer paper) with measured mean |⟨R_m q, R_n k⟩|",
        "frequencies": "Wavelength per pair",
        "scaling": "Original vs configured wavelength per pair",
        "scores": "Attention logits of rotated q, k",
        "positions": "PCA of the position tables",
    }
    for name, (files, _) in figures.items():
        png = base64.b64encode(files[0].read_bytes()).decode("ascii")
        parts.append(f"<h2>{captions[name]}</h2><img alt='{name}' src='data:image/png;base64,{png}'>")
    parts.append("<h2>pairs</h2>")
    parts.append(
        _table(
            ["pair", "inv_freq", "wavelength", f"turns in {info.context}", "original wavelength", "factor", "pair is"],
            [
                [
                    r["pair"],
                    f"{r['inv_freq']:.6g}",
                    _num(r["wavelength"]),
                    _num(r["turns"]),
                    _num(r["original_wavelength"]),
                    _num(r["factor"]),
                    r["kind"],
                ]
                for r in info.pairs()
            ],
        )
    )
    return figures, numbers, parts


def write_report(
    rope: RoPE | dict[str, tuple[RoPE, int]],
    out_dir: Path,
    *,
    title: str,
    context: int | None = None,
    seq_len: int = 64,
) -> tuple[list[Path], dict[str, Any]]:
    """Write the figures, ``report.json`` and ``report.html`` into ``out_dir``; return (files, numbers).

    ``rope`` is one RoPE (with ``context``), or ``{layer type: (RoPE, context)}`` for a per-layer-type config
    (Gemma-3): one section per layer type, figures named ``<figure>_<layer type>``, ``numbers["layer_types"]``.

    >>> import tempfile
    >>> files, numbers = write_report(RoPE(8), Path(tempfile.mkdtemp()), title="d=8", context=64, seq_len=8)
    >>> numbers["verify"]["passed"], sorted(p.name for p in files if p.stem == "report")
    (True, ['report.html', 'report.json'])
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(rope, RoPE):
        if context is None:
            raise InputTypeError("write_report(rope, ...) needs context=, the context length the report describes")
        sections: dict[str | None, tuple[RoPE, int]] = {None: (rope, context)}
    else:
        sections = dict(rope)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body><h1>RoPE report: {html.escape(title)}</h1>",
    ]
    if len(sections) > 1:
        names = ", ".join(f"<a href='#{html.escape(str(t))}'>{html.escape(str(t))}</a>" for t in sections)
        parts.append(f"<p>This config has one RoPE block per layer type: {names}.</p>")
    files: list[Path] = []
    per_type: dict[str | None, dict[str, Any]] = {}
    for layer_type, (r, ctx) in sections.items():
        label = title if layer_type is None else f"{title} ({layer_type})"
        suffix = f"_{layer_type}" if len(sections) > 1 else ""
        if len(sections) > 1:
            parts.append(f"<h1 id='{html.escape(str(layer_type))}'>layer type {html.escape(str(layer_type))}</h1>")
        figures, nums, html_parts = _section(r, out_dir, title=label, context=ctx, seq_len=seq_len, suffix=suffix)
        files += [p for fs, _ in figures.values() for p in fs]
        per_type[layer_type] = nums
        parts += html_parts
    if len(sections) == 1:
        numbers: dict[str, Any] = {"title": title, **next(iter(per_type.values()))}
    else:
        passed = all(n["verify"]["passed"] for n in per_type.values())
        numbers = {"title": title, "verify": {"passed": passed}, "layer_types": per_type}
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps(jsonable(numbers), indent=1))
    parts.append(f"<p>numbers: <code>{json_path.name}</code></p></body></html>")
    html_path = out_dir / "report.html"
    html_path.write_text("\n".join(parts), encoding="utf-8")
    return files + [json_path, html_path], numbers


def _report(args: argparse.Namespace) -> int:
    found = every_layer_type(args)
    title = config_label(args.config) if args.config else repr(found[0].rope)
    if args.config and args.layer_type:
        title += f" ({args.layer_type})"
    out_dir = output_directory(args.out)
    if len(found) == 1:
        files, numbers = write_report(
            found[0].rope, out_dir, title=title, context=found[0].context, seq_len=args.seq_len
        )
    else:
        sections = {str(c.layer_type): (c.rope, c.context) for c in found}
        files, numbers = write_report(sections, out_dir, title=title, seq_len=args.seq_len)
    if args.json:
        print_json({"files": [str(f) for f in files], "verify_passed": numbers["verify"]["passed"]})
    else:
        for f in files:
            print(f"wrote {f}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="inspect, verify and all figures as one self-contained HTML page",
        description="Writes report.html (figures embedded), report.json and the figures (PNG and SVG) into -o DIR: "
        "the inspect table, the verify checks, and the decay, frequencies, scaling, scores and positions figures. "
        "A config with one RoPE block per layer type (Gemma-3) gets one section per layer type (figures named "
        "<figure>_<layer type>) unless --layer-type picks one.",
    )
    add_config_arguments(p)
    add_output_argument(p, "dir", "report", "directory for report.html, report.json and the figures")
    p.add_argument("--seq-len", type=seq_len_count, default=64, help="positions for verify and the scores figure")
    p.add_argument("--json", action="store_true", help="print the files written as JSON")
    p.set_defaults(func=_report)
