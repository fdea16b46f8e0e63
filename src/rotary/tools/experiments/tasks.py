"""Synthetic retrieval tasks that small decoders learn in minutes: copying and associative recall, in bytes.

A model trained on natural text for the default budget learns no copying, so task models learn two synthetic
tasks (sources: docs/experiment.md): **copy** (random lowercase letters, a separator, the string again, an end
mark: ``qhvbz|qhvbz.`` scores the 5 letters after ``|``; evaluation strings are longer than any trained on) and
**induction** (16 filler letters with ``pairs`` uppercase keys each followed by a value in the first half; each
key again in the second half, the byte after it scored). Rows are right-padded with byte 0, unscored targets
are -100, draws are seeded from the run's seed. Accuracy is top-1 on the scored bytes under teacher forcing;
a trial is an **exact match** when every scored byte is right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import InputError
from .config import MIN_COPY, min_task_length
from .data import derived_seed

__all__ = [
    "CHANCE",
    "IGNORE",
    "KEYS",
    "LETTERS",
    "MIN_COPY",
    "TASKS",
    "TaskBatch",
    "copy_batch",
    "copy_range",
    "induction_batch",
    "make_batch",
    "min_task_length",
    "task_scores",
    "task_training_batch",
    "task_trials",
]

#: the tasks, in the order tables show them
TASKS = ("copy", "induction")
#: copy strings: lowercase letters
LETTERS = bytes(range(ord("a"), ord("z") + 1))
#: induction filler and values: 16 letters (Mamba's induction task has a vocabulary of 16)
VALUES = bytes(range(ord("a"), ord("a") + 16))
#: induction keys: uppercase letters, distinct within a sequence
KEYS = bytes(range(ord("A"), ord("Z") + 1))
SEPARATOR, END, PAD = ord("|"), ord("."), 0
#: targets nobody scores
IGNORE = -100
#: per-answer chance of a model that only knows the alphabet
CHANCE = {"copy": 1 / len(LETTERS), "induction": 1 / len(VALUES)}


@dataclass(frozen=True)
class TaskBatch:
    """Rows of one task: ``inputs`` and ``targets`` int64 ``[N, E]`` (targets: the next byte or :data:`IGNORE`)."""

    inputs: torch.Tensor
    targets: torch.Tensor

    @property
    def scored(self) -> torch.Tensor:
        """bool ``[N, E]``: the positions whose next byte is scored."""
        return self.targets != IGNORE


def copy_range(length: int, *, training: bool) -> tuple[int, int]:
    """The string lengths ``(lo, hi)`` of copy rows of ``length`` tokens; evaluation takes training's upper half.

    >>> copy_range(64, training=True), copy_range(64, training=False), copy_range(128, training=False)
    ((4, 31), (16, 31), (32, 63))
    """
    hi = (length - 1) // 2
    lo = MIN_COPY if training else max(MIN_COPY, (length - 1) // 4 + 1)
    if hi < lo:
        raise InputError(f"a copy row of {length} tokens holds no string of {lo} letters; use at least {2 * lo + 1}")
    return lo, hi


def _pick(n: int, count: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """int64 ``[n, k]``: per row, ``k`` distinct values of ``0 .. count - 1`` in random order."""
    return torch.rand(n, count, generator=generator).argsort(dim=1)[:, :k]


def copy_batch(n: int, length: int, generator: torch.Generator, *, training: bool = True) -> TaskBatch:
    """``n`` copy rows of ``length`` tokens.

    >>> b = copy_batch(2, 16, torch.Generator().manual_seed(0))
    >>> bytes(b.inputs[0].tolist()).rstrip(b"\\0"), int(b.scored[0].sum())
    (b'bqzr|bqzr.', 4)
    """
    lo, hi = copy_range(length, training=training)
    sizes = torch.randint(lo, hi + 1, (n, 1), generator=generator)  # [n, 1]
    letters = torch.tensor(list(LETTERS))[torch.randint(len(LETTERS), (n, hi), generator=generator)]  # [n, hi]
    p = torch.arange(length + 1).expand(n, -1)  # [n, length + 1]
    first, second = p < sizes, (p > sizes) & (p <= 2 * sizes)
    index = torch.where(first, p, p - sizes - 1).clamp(0, hi - 1)
    tokens = torch.where(first | second, torch.take_along_dim(letters, index, dim=1), PAD)
    tokens = torch.where(p == sizes, SEPARATOR, torch.where(p == 2 * sizes + 1, END, tokens))
    # the k-th copied letter sits at position size + 1 + k and is predicted at position size + k
    q = p[:, :-1]
    targets = torch.where((q >= sizes) & (q < 2 * sizes), tokens[:, 1:], IGNORE)
    return TaskBatch(tokens[:, :-1], targets)


def induction_batch(n: int, length: int, generator: torch.Generator, *, pairs: int = 4) -> TaskBatch:
    """``n`` associative-recall rows of ``length`` tokens with ``pairs`` keys each.

    >>> b = induction_batch(1, 24, torch.Generator().manual_seed(0), pairs=2)
    >>> bytes(b.inputs[0].tolist()), [chr(v) for v in b.targets[0].tolist() if v != IGNORE]
    (b'mpfadldhKbSjSjgiimKbghho', ['j', 'b'])
    """
    if pairs < 1 or pairs > len(KEYS) or length < 4 * pairs:
        raise InputError(
            f"an induction row of {length} tokens cannot hold {pairs} key-value pairs in each half; use 1 to "
            f"{len(KEYS)} pairs and a length of at least {4 * max(pairs, 1)}"
        )
    values = torch.tensor(list(VALUES))
    tokens = values[torch.randint(len(VALUES), (n, length + 1), generator=generator)]
    half = (length + 1) // 2
    keys = torch.tensor(list(KEYS))[_pick(n, len(KEYS), pairs, generator)]  # [n, pairs]
    answers = values[torch.randint(len(VALUES), (n, pairs), generator=generator)]
    writes = 2 * _pick(n, half // 2, pairs, generator)
    queries = half + 2 * _pick(n, (length + 1 - half) // 2, pairs, generator)
    order = _pick(n, pairs, pairs, generator)
    tokens.scatter_(1, writes, keys)
    tokens.scatter_(1, writes + 1, answers)
    tokens.scatter_(1, queries, torch.take_along_dim(keys, order, dim=1))
    tokens.scatter_(1, queries + 1, torch.take_along_dim(answers, order, dim=1))
    targets = torch.full((n, length), IGNORE, dtype=torch.int64).scatter_(
        1, queries, torch.take_along_dim(answers, order, dim=1)
    )
    return TaskBatch(tokens[:, :-1], targets)


def make_batch(
    task: str, n: int, length: int, generator: torch.Generator, *, pairs: int = 4, training: bool = True
) -> TaskBatch:
    """``n`` rows of ``task`` (one of :data:`TASKS`) of ``length`` tokens."""
    if task == "copy":
        return copy_batch(n, length, generator, training=training)
    if task == "induction":
        return induction_batch(n, length, generator, pairs=pairs)
    raise InputError(f"unknown task {task!r}; known: {', '.join(TASKS)}")


def task_training_batch(step: int, config: Any, seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A task model's training batch at ``step``: ``(inputs, targets)`` int64 ``[rows, task_length]``.

    >>> from rotary.tools.experiments.config import ExperimentConfig
    >>> x, y = task_training_batch(0, ExperimentConfig(task_length=32), 0, 4)
    >>> again, _ = task_training_batch(0, ExperimentConfig(task_length=32), 0, 4)
    >>> x.shape, bytes(x[0].tolist()).count(b"|"), torch.equal(x, again)
    (torch.Size([4, 32]), 1, True)
    """
    generator = torch.Generator().manual_seed(derived_seed(seed, "tasks", config.task_length, step))
    copy = copy_batch((rows + 1) // 2, config.task_length, generator)
    recall = induction_batch(rows // 2, config.task_length, generator, pairs=config.task_pairs)
    order = torch.tensor([k // 2 if k % 2 == 0 else (rows + 1) // 2 + k // 2 for k in range(rows)])
    return torch.cat((copy.inputs, recall.inputs))[order], torch.cat((copy.targets, recall.targets))[order]


def task_trials(task: str, length: int, config: Any) -> TaskBatch:
    """The ``config.task_trials`` evaluation rows of ``task`` at ``length``, the same for every model."""
    generator = torch.Generator().manual_seed(derived_seed(config.seed, "task trials", task, length))
    return make_batch(task, config.task_trials, length, generator, pairs=config.task_pairs, training=False)


@torch.no_grad()
def task_scores(logits_of: Callable[[torch.Tensor], torch.Tensor], batch: TaskBatch, *, batch_rows: int) -> dict:
    """``correct``/``predictions`` (scored bytes), ``exact``/``trials`` (rows) and ``loss`` (mean nats) on ``batch``,
    with ``logits_of``: ``inputs [b, E] -> logits [b, E, V]``.

    >>> b = copy_batch(3, 16, torch.Generator().manual_seed(0))
    >>> oracle = lambda x: F.one_hot(b.targets.clamp(min=0), 256).float()  # knows every answer
    >>> s = task_scores(oracle, b, batch_rows=3)
    >>> s["correct"] == s["predictions"], s["exact"], s["trials"]
    (True, 3, 3)
    """
    correct = predictions = exact = 0
    loss = 0.0
    for start in range(0, batch.inputs.shape[0], batch_rows):
        inputs = batch.inputs[start : start + batch_rows]
        targets = batch.targets[start : start + batch_rows]
        logits = logits_of(inputs).float().cpu()
        scored = targets != IGNORE
        right = (logits.argmax(-1) == targets) & scored
        correct += int(right.sum())
        predictions += int(scored.sum())
        exact += int((right.sum(1) == scored.sum(1)).sum())
        loss += float(F.cross_entropy(logits[scored], targets[scored], reduction="sum"))
    return {
        "correct": correct,
        "predictions": predictions,
        "exact": exact,
        "trials": batch.inputs.shape[0],
        "loss": loss / max(predictions, 1),
    }
