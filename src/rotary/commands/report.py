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
from rotary.module import RoPE

from . import plot
from .common import (
    add_config_arguments,
    add_output_argument,
    config_label,
    output_directory,
    print_json,
    rope_from_args,
    seq_len_count,
)

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


def write_report(rope: RoPE, out_dir: Path, *, title: str, context: int, seq_len: int = 64) -> tuple[list[Path], dict[str, Any]]:
    """Write figures, ``report.json`` and ``report.html`` into ``out_dir`` (created if missing); return (files, numbers)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    info = inspect_rope(rope, context=context)
    checks = verify(rope, seq_len=seq_len, offset=context)
    figures: dict[str, tuple[list[Path], dict[str, Any]]] = {}
    figures["decay"] = plot.make_decay(out_dir / "decay", rope.head_dim, rope.freqs.base, 256, measured=True, samples=64)
    trained = rope.freqs.scaling.get("original_max_position_embeddings") or context
    figures["frequencies"] = plot.make_frequencies(
        out_dir / "frequencies",
        {title: rope, f"default, base {rope.freqs.base:g}": RoPE(rope.head_dim, base=rope.freqs.base, rotary_dim=rope.rotary_dim)},
        trained,
    )
    figures["scaling"] = plot.make_scaling(out_dir / f"scaling_{rope.freqs.rope_type}", rope, context)
    figures["scores"] = plot.make_scores(out_dir / "scores", rope, min(seq_len, 128))
    figures["positions"] = plot.make_positions(out_dir / "positions", rope, 256)
    numbers = {
        "title": title,
        "inspect": info.to_dict(),
        "verify": {"passed": all(c.passed for c in checks), "checks": [c.to_dict() for c in checks]},
        "figures": {name: {"files": [str(p) for p in files], **nums} for name, (files, nums) in figures.items()},
    }
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps(jsonable(numbers), indent=1))

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>RoPE report: {html.escape(title)}</h1>"]
    d = info.to_dict()
    parts.append(_table(
        ["rope_type", "head_dim", "rotary_dim", "base", "context", "pairing", "attention_scaling"],
        [[d["rope_type"], d["head_dim"], d["rotary_dim"], _num(d["base"]), d["context"],
          "interleaved" if d["interleaved"] else "half", _num(d["attention_scaling"])]],
    ))
    if info.scaling:
        parts.append(f"<p>scaling: <code>{html.escape(json.dumps(jsonable(info.scaling)))}</code></p>")
    parts += [f"<p class='warn'>warning: {html.escape(w)}</p>" for w in info.warnings]
    verdict = "<span class='pass'>all checks passed</span>" if numbers["verify"]["passed"] else "<span class='fail'>FAILED</span>"
    parts.append(f"<h2>verify: {verdict}</h2>")
    parts.append(_table(["", "check", "worst error", "tolerance"], [
        ["PASS" if c.passed else "FAIL", c.name, f"{c.worst_error:.2e}", f"{c.tolerance:.1e}"] for c in checks]))
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
    parts.append(_table(
        ["pair", "inv_freq", "wavelength", f"turns in {info.context}", "original wavelength", "factor", "pair is"],
        [[r["pair"], f"{r['inv_freq']:.6g}", _num(r["wavelength"]), _num(r["turns"]), _num(r["original_wavelength"]),
          _num(r["factor"]), r["kind"]] for r in info.pairs()],
    ))
    parts.append(f"<p>numbers: <code>{json_path.name}</code></p></body></html>")
    html_path = out_dir / "report.html"
    html_path.write_text("\n".join(parts), encoding="utf-8")
    files = [p for fs, _ in figures.values() for p in fs] + [json_path, html_path]
    return files, numbers


def _report(args: argparse.Namespace) -> int:
    rope, context = rope_from_args(args)
    title = config_label(args.config) if args.config else repr(rope)
    if args.config and args.layer_type:
        title += f" ({args.layer_type})"
    out_dir = output_directory(args.out)
    files, numbers = write_report(rope, out_dir, title=title, context=context, seq_len=args.seq_len)
    if args.json:
        print_json({"files": [str(f) for f in files], "verify_passed": numbers["verify"]["passed"]})
    else:
        for f in files:
            print(f"wrote {f}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="inspect, verify and all figures as one self-contained HTML page")
    add_config_arguments(p)
    add_output_argument(p, "dir", "report", "directory for report.html, report.json and the figures")
    p.add_argument("--seq-len", type=seq_len_count, default=64, help="positions for verify and the scores figure")
    p.add_argument("--json", action="store_true", help="print the files written as JSON")
    p.set_defaults(func=_report)
