"""Results as typed rows: one dataclass per kind of measurement, whose fields are the CSV columns.

Every row names the model (the same name over seeds: ``rope``, ``rope-ft-yarn``), the seed, and the
RoPE scaling it was evaluated with and its factor. A new metric is one field here; the CSV files,
``results.json`` and :class:`~rotary.tools.experiments.results.Results` pick it up.

=================  ===================================  ==================================================
file               row                                  one row per
=================  ===================================  ==================================================
``results.csv``    :class:`PerplexityRow`               model x seed x scaling x length x mode
``positions.csv``  :class:`PositionRow`                 ... x range of query positions in the longest windows
``passkey.csv``    :class:`PasskeyRow`                  ... x length x depth of the key
``retrieval.csv``  :class:`RetrievalRow`                ... x distance between the two copies
``tasks.csv``      :class:`TaskRow`                     task model x seed x scaling x task x length
=================  ===================================  ==================================================
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
    """What every measurement is of.

    Attributes:
        model: the trained model, without its seed (``rope``, ``rope-ft-yarn``, ``rope-base100``).
        seed: the seed it was trained with.
        scaling: the RoPE scaling it was evaluated with (``none`` for models without RoPE).
        factor: that scaling's factor (``E / L`` at inference time, fixed for a fine-tuned scaling).
    """

    model: str
    seed: int
    scaling: str
    factor: float


@dataclass(frozen=True)
class PerplexityRow(Row):
    """Next-byte loss on the held-out text at one length, in one mode.

    Attributes:
        mode: ``windows`` (non-overlapping windows of ``eval_length``) or ``sliding`` (every scored token sees at
            least ``eval_length - stride`` tokens).
        eval_length, stride: ``E``; the stride (``E`` for ``windows``).
        loss, perplexity, bits_per_byte: mean cross-entropy in nats per byte; ``exp(loss)``; ``loss / ln 2``.
        predictions: scored bytes.
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
    """The retrieval probe (:mod:`rotary.tools.experiments.retrieval`) at one distance.

    Attributes:
        distance, length, span: between the two copies; tokens per trial; bytes per span.
        copy_loss, control_loss, gain: mean loss on the scored bytes (nats); ``control_loss - copy_loss``.
        copy_accuracy, control_accuracy, predictions: top-1 accuracy on the same bytes; scored bytes per kind.
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
    """A task model (:mod:`rotary.tools.experiments.tasks`) on one task at one length.

    Attributes:
        task: ``copy`` or ``induction``.
        eval_length: tokens per row.
        correct, predictions: scored bytes predicted right (top-1, teacher forcing), and scored.
        exact, trials: rows whose every scored byte is right, and rows.
        loss: mean loss on the scored bytes, nats.
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

    Example:
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
