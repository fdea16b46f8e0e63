"""The rows of a run, looked up by method, length and mode, over seeds.

A *method* is a trained model with the scaling it is evaluated with: ``("rope", "yarn")`` is the pretrained
RoPE model with YaRN at inference, ``("rope-ft-yarn", "yarn")`` the one fine-tuned with YaRN. Lookups return
:class:`Values`, one value per seed, so that seed ``k`` of one method pairs with seed ``k`` of another.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .config import ExperimentConfig
from .plan import SCALING_LABELS, TASK_PREFIX, ModelSpec
from .rows import Measurements
from .stats import Stat, wilson

__all__ = ["Method", "Results", "Values", "perplexity"]


def perplexity(loss: float) -> float:
    """``exp(loss)``, inf past 700 nats (where ``exp`` overflows)."""
    return math.inf if loss > 700 else math.exp(loss)


class Values(dict):
    """seed -> value.

    >>> a, b = Values({0: 2.0, 1: 3.0}), Values({0: 1.0, 1: 1.5, 2: 9.0})
    >>> a.minus(b), a.stat.mean
    ({0: 1.0, 1: 1.5}, 2.5)
    """

    @property
    def stat(self) -> Stat:
        return Stat.of(self[k] for k in sorted(self))

    def minus(self, other: Values) -> Values:
        """Per-seed differences over the seeds both have."""
        return Values({k: self[k] - other[k] for k in sorted(set(self) & set(other))})

    def map(self, fn) -> Values:
        return Values({k: fn(v) for k, v in self.items()})


@dataclass(frozen=True)
class Method:
    """One line of the tables and figures: a trained model evaluated with a scaling."""

    model: str
    scaling: str
    label: str
    stage: str
    encoding: str


class Results:
    """Every row of a run, indexed; ``specs`` are the run's models (or their ``asdict``) in training order."""

    def __init__(
        self, measurements: Measurements, specs: Iterable[ModelSpec | dict[str, Any]], config: ExperimentConfig
    ) -> None:
        self.rows = measurements
        self.config = config
        self.specs: dict[str, ModelSpec] = {}
        for s in specs:
            spec = s if isinstance(s, ModelSpec) else ModelSpec(**s)
            self.specs.setdefault(spec.model, spec)
        self._perplexity = {(r.model, r.scaling, r.eval_length, r.mode, r.seed): r for r in measurements.perplexity}
        self.lengths = sorted({r.eval_length for r in measurements.perplexity}) or sorted(config.eval_lengths)
        self.seeds = sorted({r.seed for r in measurements.perplexity})
        self.modes = [m for m in ("windows", "sliding") if any(r.mode == m for r in measurements.perplexity)]
        self.distances = sorted({r.distance for r in measurements.retrieval})
        self.task_lengths = sorted({r.eval_length for r in measurements.tasks})
        self.tasks = [t for t in ("copy", "induction") if any(r.task == t for r in measurements.tasks)]
        self._tasks: dict[tuple[str, str, str, int], list] = {}
        for r in measurements.tasks:
            self._tasks.setdefault((r.model, r.scaling, r.task, r.eval_length), []).append(r)

    # ------------------------------------------------------------------------------------------------
    def methods(self) -> list[Method]:
        """The methods in the order their rows first appear (training order, scalings in order)."""
        seen: dict[tuple[str, str], Method] = {}
        for r in self.rows.perplexity:
            if (r.model, r.scaling) not in seen:
                seen[(r.model, r.scaling)] = Method(
                    r.model, r.scaling, self.label(r.model, r.scaling), *self._stage(r.model)
                )
        return list(seen.values())

    def _stage(self, model: str) -> tuple[str, str]:
        spec = self.specs.get(model)
        return (spec.stage, spec.encoding) if spec else ("pretrain", model)

    def label(self, model: str, scaling: str = "none") -> str:
        """``"RoPE + YaRN"`` (inference scaling), ``"RoPE + YaRN, fine-tuned at 4L"`` (its own scaling).

        Example:
            >>> from rotary.tools.experiments.plan import ModelSpec
            >>> r = Results(Measurements(), [ModelSpec("rope", "rope", 0, "RoPE")], ExperimentConfig())
            >>> r.label("rope", "yarn"), r.label("rope", "none"), r.label("alibi")
            ('RoPE + YaRN', 'RoPE', 'alibi')
        """
        spec = self.specs.get(model)
        label = spec.label if spec else model
        if scaling != "none" and (spec is None or spec.scaling != scaling):
            label += " + " + SCALING_LABELS.get(scaling, scaling)
        return label

    def has(self, model: str, scaling: str = "none") -> bool:
        return any(k[0] == model and k[1] == scaling for k in self._perplexity)

    # ------------------------------------------------------------------------------------------------
    def loss(self, model: str, scaling: str, length: int, mode: str = "windows") -> Values | None:
        """Loss (nats) per seed; None when not measured."""
        found = Values(
            {
                s: self._perplexity[(model, scaling, length, mode, s)].loss
                for s in self.seeds
                if (model, scaling, length, mode, s) in self._perplexity
            }
        )
        return found or None

    def perplexity(self, model: str, scaling: str, length: int, mode: str = "windows") -> Stat | None:
        """Perplexity over seeds (the mean is over the seeds' perplexities)."""
        loss = self.loss(model, scaling, length, mode)
        return None if loss is None else loss.map(perplexity).stat

    def change(self, model: str, scaling: str, length: int, base: int, mode: str = "windows") -> Values | None:
        """``loss(length) - loss(base)`` per seed."""
        a, b = self.loss(model, scaling, length, mode), self.loss(model, scaling, base, mode)
        return None if a is None or b is None else a.minus(b)

    def bucket(self, model: str, scaling: str, start: int, end: int) -> Values | None:
        """Mean loss of queries at positions ``[start, end)`` of the longest windows, per seed."""
        sums: dict[int, list[float]] = {}
        for r in self.rows.positions:
            if r.model == model and r.scaling == scaling and start <= r.start and r.end <= end:
                total = sums.setdefault(r.seed, [0.0, 0])
                total[0] += r.loss * r.predictions
                total[1] += r.predictions
        return Values({s: t / n for s, (t, n) in sums.items() if n}) or None

    def profile(self, model: str, scaling: str) -> list[tuple[int, int, Values]]:
        """``(start, end, loss per seed)`` for every position bin of the longest windows."""
        bins: dict[tuple[int, int], Values] = {}
        for r in self.rows.positions:
            if r.model == model and r.scaling == scaling:
                bins.setdefault((r.start, r.end), Values())[r.seed] = r.loss
        return [(a, b, v) for (a, b), v in sorted(bins.items())]

    def passkey(self, model: str, scaling: str, length: int) -> tuple[int, int] | None:
        """``(correct, trials)`` at ``length``, summed over depths and seeds."""
        rows = [r for r in self.rows.passkey if r.model == model and r.scaling == scaling and r.eval_length == length]
        return (sum(r.correct for r in rows), sum(r.trials for r in rows)) if rows else None

    def passkey_interval(self, model: str, scaling: str, length: int) -> tuple[float, float, float] | None:
        """``(accuracy, low, high)``: the pooled accuracy and its Wilson 95% interval."""
        counts = self.passkey(model, scaling, length)
        if counts is None or not counts[1]:
            return None
        return (counts[0] / counts[1], *wilson(*counts))

    def task_model(self, model: str) -> str | None:
        """``task-<encoding>`` beside a pretrained text model when the run has it, else None."""
        spec = self.specs.get(model)
        if spec is None or spec.stage != "pretrain":
            return None
        name = TASK_PREFIX + spec.encoding
        return name if any(k[0] == name for k in self._tasks) else None

    def task(self, model: str, scaling: str, task: str, length: int, *, exact: bool = False) -> tuple[int, int] | None:
        """``(correct, total)`` of task model ``model`` on ``task`` at ``length``, seeds pooled: scored bytes, or
        (``exact``) rows.
        """
        rows = self._tasks.get((model, scaling, task, length))
        if not rows:
            return None
        if exact:
            return sum(r.exact for r in rows), sum(r.trials for r in rows)
        return sum(r.correct for r in rows), sum(r.predictions for r in rows)

    def task_interval(
        self, model: str, scaling: str, task: str, length: int, *, exact: bool = False
    ) -> tuple[float, float, float] | None:
        """``(accuracy, low, high)``: pooled accuracy (per byte, or ``exact`` per row) and its Wilson interval."""
        counts = self.task(model, scaling, task, length, exact=exact)
        if counts is None or not counts[1]:
            return None
        return (counts[0] / counts[1], *wilson(*counts))

    def task_by_seed(self, model: str, scaling: str, task: str, length: int) -> Values | None:
        """Per-byte accuracy per seed."""
        rows = self._tasks.get((model, scaling, task, length)) or []
        return Values({r.seed: r.correct / r.predictions for r in rows if r.predictions}) or None

    def task_methods(self) -> list[Method]:
        """The task models with their scalings, in the order their rows first appear."""
        seen: dict[tuple[str, str], Method] = {}
        for r in self.rows.tasks:
            if (r.model, r.scaling) not in seen:
                seen[(r.model, r.scaling)] = Method(
                    r.model, r.scaling, self.label(r.model, r.scaling), *self._stage(r.model)
                )
        return list(seen.values())

    def retrieval(self, model: str, scaling: str, distance: int, field: str = "gain") -> Values | None:
        found = Values(
            {
                r.seed: getattr(r, field)
                for r in self.rows.retrieval
                if r.model == model and r.scaling == scaling and r.distance == distance
            }
        )
        return found or None

    def retrieval_mean(self, model: str, scaling: str, distances: Sequence[int], field: str = "gain") -> Values | None:
        """The mean over ``distances`` of a retrieval field, per seed."""
        per = [self.retrieval(model, scaling, d, field) for d in distances]
        if not per or any(v is None for v in per):
            return None
        seeds = set.intersection(*(set(v) for v in per))
        return Values({s: sum(v[s] for v in per) / len(per) for s in sorted(seeds)}) or None
