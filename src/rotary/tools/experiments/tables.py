"""The tables of a run's results: the main summary (also printed at the end of a run), perplexity per mode,
per-position buckets, retrieval gain, passkey, and the spread over seeds; :mod:`.report` arranges them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .claims import fmt, ppl
from .results import Results

__all__ = [
    "SUMMARY_TASK_LENGTHS",
    "bucket_table",
    "markdown_table",
    "mode_table",
    "passkey_table",
    "render_table",
    "retrieval_table",
    "spread_table",
    "summary_table",
    "task_table",
]


def markdown_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table (first column left-aligned, the others right-aligned).

    Example:
        >>> print(markdown_table(["method", "ppl"], [["RoPE", "4.2"]]))
        | method | ppl |
        |:---|---:|
        | RoPE | 4.2 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _percent_interval(found: tuple[float, float, float] | None) -> str:
    return "–" if found is None else f"{found[0]:.0%} [{found[1]:.0%}, {found[2]:.0%}]"


def _gain(results: Results, model: str, scaling: str, distances: Sequence[int], spread: bool = True) -> str:
    values = results.retrieval_mean(model, scaling, distances) if distances else None
    if values is None:
        return "–"
    stat = values.stat
    return f"{stat.mean:.2f}" if stat.n < 2 or not spread else f"{stat.mean:.2f} ± {stat.spread:.2f}"


#: the task lengths (multiples of the task models' L) the main table shows; the report shows them all
SUMMARY_TASK_LENGTHS = (1, 2)


def _task_cell(results: Results, method: Any, task: str, k: int, spread: bool) -> str:
    model = results.task_model(method.model)
    if model is None:
        return "–"
    found = results.task_interval(model, method.scaling, task, k * results.config.task_length)
    if found is None:
        return "–"
    return _percent_interval(found) if spread else f"{found[0]:.0%}"


def _informative(values: list[str]) -> bool:
    """Whether a column says anything: some cell is measured and not zero."""
    return any(v not in ("–", "0%", "0.00", "-0.00") and not v.startswith(("0% ", "0.00 ±", "-0.00 ±")) for v in values)


def summary_table(results: Results, spread: bool = True) -> tuple[list[str], list[list[str]]]:
    """The main table: headline measurements per method, mean ± half the range over seeds (``spread=False``:
    mean); a column no method measured above 0 is left out.
    """
    L = results.config.train_length
    longest = results.lengths[-1]
    inside = [d for d in results.distances if d <= L]
    past = [d for d in results.distances if d > L]
    sliding = [e for e in dict.fromkeys((L, longest)) if "sliding" in results.modes]  # one column when L is the longest
    tasks = [(t, k) for t in results.tasks for k in SUMMARY_TASK_LENGTHS]
    header = (
        ["method"]
        + [f"ppl {e / L:g}L" for e in results.lengths]
        + [f"sliding {e / L:g}L" for e in sliding]
        + [f"{'recall' if t == 'induction' else t} {k}L" for t, k in tasks]
        + ["retrieval ≤ L", "retrieval > L", "passkey 1L"]
    )

    def cell(model: str, scaling: str, e: int, mode: str) -> str:
        if spread:
            return ppl(results, model, scaling, e, mode)
        stat = results.perplexity(model, scaling, e, mode)
        return "–" if stat is None else fmt(stat.mean)

    body = []
    for m in results.methods():
        passkey = results.passkey_interval(m.model, m.scaling, L)
        body.append(
            [m.label]
            + [cell(m.model, m.scaling, e, "windows") for e in results.lengths]
            + [cell(m.model, m.scaling, e, "sliding") for e in sliding]
            + [_task_cell(results, m, t, k, spread) for t, k in tasks]
            + [
                _gain(results, m.model, m.scaling, inside, spread),
                _gain(results, m.model, m.scaling, past, spread),
                _percent_interval(passkey) if spread else ("–" if passkey is None else f"{passkey[0]:.0%}"),
            ]
        )
    first_optional = len(header) - 3  # retrieval and passkey: kept only where they say something
    keep = [i for i in range(len(header)) if i < first_optional or _informative([row[i] for row in body])]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in body]


def mode_table(results: Results, mode: str) -> str:
    L = results.config.train_length
    return markdown_table(
        ["method"] + [f"{e / L:g}L" for e in results.lengths],
        [[m.label] + [ppl(results, m.model, m.scaling, e, mode) for e in results.lengths] for m in results.methods()],
    )


def bucket_table(results: Results) -> str:
    edges = [0, *results.lengths]
    header = ["method"] + [f"[{a}, {b})" for a, b in zip(edges[:-1], edges[1:])]
    body = []
    for m in results.methods():
        cells = []
        for a, b in zip(edges[:-1], edges[1:]):
            v = results.bucket(m.model, m.scaling, a, b)
            cells.append(
                "–"
                if v is None
                else (fmt(v.stat.mean) if v.stat.n < 2 else f"{fmt(v.stat.mean)} ± {fmt(v.stat.spread, 2)}")
            )
        body.append([m.label] + cells)
    return markdown_table(header, body)


def retrieval_table(results: Results) -> str:
    L = results.config.train_length
    return markdown_table(
        ["method"] + [f"{d / L:.3g}L" for d in results.distances],
        [[m.label] + [_gain(results, m.model, m.scaling, [d]) for d in results.distances] for m in results.methods()],
    )


def passkey_table(results: Results) -> str:
    L = results.config.train_length
    return markdown_table(
        ["method"] + [f"{e / L:g}L" for e in results.lengths],
        [
            [m.label] + [_percent_interval(results.passkey_interval(m.model, m.scaling, e)) for e in results.lengths]
            for m in results.methods()
        ],
    )


def task_table(results: Results, task: str, *, exact: bool = False) -> str:
    """One task's accuracy per task model and scaling at every task length, per byte (or ``exact`` row),
    seeds pooled, with its Wilson 95% interval.
    """
    base = results.config.task_length
    return markdown_table(
        ["method"] + [f"{e / base:g}L ({e})" for e in results.task_lengths],
        [
            [m.label]
            + [
                _percent_interval(results.task_interval(m.model, m.scaling, task, e, exact=exact))
                for e in results.task_lengths
            ]
            for m in results.task_methods()
        ],
    )


def spread_table(results: Results, mode: str = "windows") -> tuple[list[str], list[list[str]]]:
    """Per method and length: half the range of the loss over seeds (nats)."""
    L = results.config.train_length
    body = []
    for m in results.methods():
        cells = []
        for e in results.lengths:
            v = results.loss(m.model, m.scaling, e, mode)
            cells.append("–" if v is None or not v.stat.finite else f"{v.stat.spread:.3f}")
        body.append([m.label] + cells)
    return ["method"] + [f"{e / L:g}L" for e in results.lengths], body


def render_table(results: Results, console: Any) -> None:
    """Print the main table with rich."""
    from rich.table import Table

    header, body = summary_table(results, spread=False)
    table = Table(
        title=f"perplexity (bytes) and task accuracy; trained at L = {results.config.train_length}; "
        f"mean over {len(results.seeds)} seed(s) (the spread is in report.md)",
        title_justify="left",
    )
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in body:
        table.add_row(*row)
    console.print(table)
