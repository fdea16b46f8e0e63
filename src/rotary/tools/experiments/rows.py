"""Results as typed rows: one dataclass per kind of measurement, whose fields are the CSV columns
(``results.csv``, ``positions.csv``, ``passkey.csv``, ``retrieval.csv``, ``tasks.csv``: docs/experiment.md).

Every row names the model (the same name over seeds), the seed, the RoPE scaling it was evaluated with and
its factor. A new metric is one field here; the CSV files, ``results.json`` and ``Results`` pick it up.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CSV_FILES",
    "Measurements",
    "PasskeyRow",
    "PerplexityRow",
    "PositionRow",
    "RetrievalRow",
    "Row",
    "TaskRow",
    "csv_text",
]


@dataclass(frozen=True)
class Row:
    """What every measurement is of: ``model`` (without its seed, e.g. ``rope-ft-yarn``), ``seed``, the
    ``scaling`` it was evaluated with (``none`` without RoPE) and its ``factor``.
    """

    model: str
    seed: int
    scaling: str
    factor: float


@dataclass(frozen=True)
class PerplexityRow(Row):
    """Next-byte loss on the held-out text at one length, ``mode`` ``windows`` (non-overlapping) or ``sliding``
    (``stride``); ``loss`` in nats per byte, ``perplexity`` its exp, ``bits_per_byte`` ``loss / ln 2``.
    """

    mode: str
    eval_length: int
    stride: int
    loss: float
    perplexity: float
    bits_per_byte: float
    predictions: int


@dataclass(frozen=True)
class PositionRow(Row):
    """The mean loss of queries at positions ``[start, end)`` of non-overlapping windows of ``eval_length``."""

    eval_length: int
    start: int
    end: int
    loss: float
    predictions: int


@dataclass(frozen=True)
class PasskeyRow(Row):
    """Passkey prompts of ``eval_length`` tokens with the key at ``depth``: exact answers of ``trials``."""

    eval_length: int
    depth: float
    correct: int
    trials: int


@dataclass(frozen=True)
class RetrievalRow(Row):
    """The retrieval probe at one ``distance``: loss (nats) and top-1 accuracy on the scored bytes of the copy
    and the control, and ``gain = control_loss - copy_loss``.
    """

    distance: int
    length: int
    span: int
    copy_loss: float
    control_loss: float
    gain: float
    copy_accuracy: float
    control_accuracy: float
    predictions: int


@dataclass(frozen=True)
class TaskRow(Row):
    """A task model on one ``task`` at one length: scored bytes right (``correct``) of ``predictions``, rows
    exactly right (``exact``) of ``trials``, and the mean ``loss`` on the scored bytes.
    """

    task: str
    eval_length: int
    correct: int
    predictions: int
    exact: int
    trials: int
    loss: float


#: results.json key -> (row type, CSV file)
CSV_FILES: dict[str, tuple[type, str]] = {
    "perplexity": (PerplexityRow, "results.csv"),
    "positions": (PositionRow, "positions.csv"),
    "passkey": (PasskeyRow, "passkey.csv"),
    "retrieval": (RetrievalRow, "retrieval.csv"),
    "tasks": (TaskRow, "tasks.csv"),
}


def csv_text(rows: list, row_type: type) -> str:
    """The CSV of ``rows``: a header of ``row_type``'s fields, one line per row.

    >>> print(csv_text([PasskeyRow("rope", 0, "none", 1.0, 128, 0.5, 3, 8)], PasskeyRow), end="")
    model,seed,scaling,factor,eval_length,depth,correct,trials
    rope,0,none,1.0,128,0.5,3,8
    """
    names = [f.name for f in dataclasses.fields(row_type)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow(
            ["" if isinstance(v, float) and not math.isfinite(v) else v for v in (getattr(row, n) for n in names)]
        )
    return out.getvalue()


def _from_dict(row_type: type, data: dict[str, Any]) -> Any:
    values = {}
    for f in dataclasses.fields(row_type):
        value = data[f.name]
        values[f.name] = math.nan if value is None and f.type == "float" else value  # JSON stores inf and nan as null
    return row_type(**values)


@dataclass
class Measurements:
    """Every row of a run, by kind."""

    perplexity: list[PerplexityRow] = field(default_factory=list)
    positions: list[PositionRow] = field(default_factory=list)
    passkey: list[PasskeyRow] = field(default_factory=list)
    retrieval: list[RetrievalRow] = field(default_factory=list)
    tasks: list[TaskRow] = field(default_factory=list)

    def extend(self, other: Measurements) -> Measurements:
        for name in CSV_FILES:
            getattr(self, name).extend(getattr(other, name))
        return self

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        return {name: [dataclasses.asdict(r) for r in getattr(self, name)] for name in CSV_FILES}

    @classmethod
    def from_json(cls, data: dict[str, list[dict[str, Any]]]) -> Measurements:
        return cls(
            **{name: [_from_dict(row_type, r) for r in data.get(name, [])] for name, (row_type, _) in CSV_FILES.items()}
        )

    def csv_files(self) -> dict[str, str]:
        """File name -> CSV text."""
        return {file: csv_text(getattr(self, name), row_type) for name, (row_type, file) in CSV_FILES.items()}
