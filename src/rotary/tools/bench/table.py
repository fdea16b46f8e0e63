"""The results of ``rotary bench`` as text or markdown: one table per group, the machine first."""

from __future__ import annotations

import math
from typing import Any

from .harness import Result

__all__ = ["DEVICE_HEADER", "GENERATION_HEADER", "device_row", "format_table", "generation_row", "group_table"]


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def _versus_hf(speedup: float) -> str:
    """``speedup`` = HF eager time / this time, as words: "2.0x faster", "5.1x slower", "same"."""
    if f"{speedup:.1f}" == "1.0":
        return "1.0x (same)"
    return f"{speedup:.1f}x faster" if speedup > 1 else f"{1 / speedup:.1f}x slower"


#: the columns of a GPU group (``rotary bench --device cuda``)
DEVICE_HEADER = ["method", "GPU µs/call (graph)", "x copy", "host µs/call (eager)", "note"]


def _micro(seconds: float | None) -> str:
    """Seconds as µs with one decimal, "—" for a row without a time (NaN or None)."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    return f"{seconds * 1e6:.1f}"


def device_row(r: Result, ratio: str = "x copy") -> list[str]:
    """A GPU row's cells (:data:`DEVICE_HEADER`; a time not from graph replay says how it was taken).

    >>> device_row(Result("g", "x", True, 1e-4, 9, host_s=5e-4, gpu_timing="eager", note="not capturable: E"))
    ['x (fwd+bwd)', '100.0 (eager)', '', '500.0', 'not capturable: E']
    """
    gpu = _micro(r.median_s)
    if gpu != "—" and r.gpu_timing != "graph":
        gpu += f" ({r.gpu_timing})"
    method = r.method + (" (fwd+bwd)" if r.backward and "fwd+bwd" not in r.method else "")
    return [method, gpu, f"{r.ratios[ratio]:.2f}" if ratio in r.ratios else "", _micro(r.host_s), r.note]


#: the columns of a generation group
GENERATION_HEADER = ["generation", "tokens/s", "ms per step", "first call (s)", "vs HF static", "same tokens", "note"]


def generation_row(r: Result) -> list[str]:
    """A generation row's cells (:data:`GENERATION_HEADER`); a failed row has its note and no figures.

    Example:
        >>> values = {"tokens/s": 5000.0, "ms per step": 1.6, "first call s": 9.1, "vs HF static": 0.9,
        ...           "same tokens": 1.0}
        >>> generation_row(Result("g", "rotary static", False, 0.2, 3, kind="generation", values=values))
        ['rotary static', '5,000', '1.60', '9.10', '0.90', 'yes', '']
    """
    v = r.values
    if "tokens/s" not in v:
        return [r.method, "—", "—", "—", "", "", r.note]
    same = v.get("same tokens", math.nan)
    same_text = "yes" if same == 1.0 else (f"{same:.0%} of ids" if math.isfinite(same) else "")
    versus = f"{v['vs HF static']:.2f}" if "vs HF static" in v else ""
    return [
        r.method,
        f"{v['tokens/s']:,.0f}",
        f"{v['ms per step']:.2f}",
        f"{v['first call s']:.2f}",
        versus,
        same_text,
        r.note,
    ]


def _fused_table(group: str, rows: list[Result], markdown: bool) -> list[str]:
    """A fused-op group: µs per call (GPU and host on a device), x traffic limit, note."""
    if any(r.gpu_timing for r in rows):
        header = [FUSED_RATIO if c == "x copy" else c for c in DEVICE_HEADER]
        return group_table(group, header, [device_row(r, FUSED_RATIO) for r in rows], markdown, left=(0, 4))
    table = [
        [r.method, _micro(r.median_s), f"{r.ratios[FUSED_RATIO]:.2f}" if FUSED_RATIO in r.ratios else "", r.note]
        for r in rows
    ]
    return group_table(group, ["method", "µs/call", FUSED_RATIO, "note"], table, markdown, left=(0, 3))


#: the ratio column of a fused-op group
FUSED_RATIO = "x traffic limit"


def _machine_line(machine: dict[str, Any]) -> list[str]:
    if "gpu" not in machine and "device" not in machine:
        return [
            f"machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']} "
            f"with {machine['torch_threads']} threads; fused CPU kernel {machine.get('fused_cpu_kernel', '?')}"
        ]
    gpu = machine.get("gpu", machine.get("device", "?"))
    baselines = ", ".join(f"{module} {version}" for module, version in machine.get("baselines", {}).items())
    return [
        f"machine: {gpu} (CUDA {machine.get('cuda', '?')}), torch {machine['torch']}, triton "
        f"{machine.get('triton', '?')}; host {machine['cpu']}, {machine['logical_cpus']} logical CPUs"
        + (f"; fused CPU kernel {machine['fused_cpu_kernel']}" if "fused_cpu_kernel" in machine else ""),
        f"baselines: {baselines or 'none'}",
    ]


def format_table(machine: dict[str, Any], results: list[Result], markdown: bool = False) -> str:
    """The results as text (or a markdown table), one block per group (GPU groups: :data:`DEVICE_HEADER`)."""
    lines = _machine_line(machine) if machine else []  # {}: the groups alone (a suite's progress)
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    for group, rows in groups.items():
        if rows[0].kind == "generation":
            lines.append("")
            lines.extend(
                group_table(group, GENERATION_HEADER, [generation_row(r) for r in rows], markdown, left=(0, 6))
            )
            continue
        if rows[0].kind == "fused":
            lines.append("")
            lines.extend(_fused_table(group, rows, markdown))
            continue
        if any(r.gpu_timing or r.host_s is not None for r in rows):
            lines.append("")
            lines.extend(group_table(group, DEVICE_HEADER, [device_row(r) for r in rows], markdown, left=(0, 4)))
            continue
        versus_hf = any("HF eager speedup" in r.ratios for r in rows)  # not without transformers
        steps = any("x fresh passes" in r.ratios for r in rows)
        header = ["method", "pass", "median", "x in-place pass", "x copy (fwd+bwd: two)"]
        header += ["x fresh passes (training step)"] * steps + ["vs HF eager"] * versus_hf + ["extra peak MiB"]
        table = []
        for r in rows:
            mem = "" if r.extra_peak_bytes is None else f"{r.extra_peak_bytes / 2**20:.1f}"
            row = [
                r.method + (f" ({r.note})" if r.note else ""),
                "fwd+bwd" if r.backward else "fwd",
                _fmt_time(r.median_s),
                f"{r.ratios['x in-place pass']:.2f}" if "x in-place pass" in r.ratios else "",
                f"{r.ratios['x copy']:.2f}" if "x copy" in r.ratios else "",
            ]
            if steps:
                row.append(f"{r.ratios['x fresh passes']:.2f}" if "x fresh passes" in r.ratios else "")
            if versus_hf:
                row.append(_versus_hf(r.ratios["HF eager speedup"]) if "HF eager speedup" in r.ratios else "")
            table.append([*row, mem])
        lines.append("")
        lines.extend(group_table(group, header, table, markdown, left=(0, 1)))
    return "\n".join(lines)


def group_table(
    group: str, header: list[str], table: list[list[str]], markdown: bool, left: tuple[int, ...]
) -> list[str]:
    """One group as a markdown table (``|`` in a cell escaped) or aligned text; ``left`` columns left-aligned."""
    if markdown:
        lines = [f"### {group}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "|".join("---" if j in left else "---:" for j in range(len(header))) + "|")
        lines.extend("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in table)
        return lines
    lines = [group]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    for row in [header, *table]:
        cells = [str(c).ljust(w) if j in left else str(c).rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines
