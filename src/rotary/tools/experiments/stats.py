"""The statistics a report states: a value over seeds, a binomial interval, and the verdict rules.

A method trained with ``K`` seeds has ``K`` values of each measurement (:class:`Stat`: mean and half the
range). Two methods are compared on the per-seed differences (seed ``k`` against seed ``k``, which share the
training batches): a claim **agrees** when every seed's difference is on its side of the threshold, **does
not agree** when every one is on the other side, and is **within run-to-run spread** otherwise. Passkey
accuracies are judged against Wilson's score interval (:func:`wilson`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...errors import InputError

__all__ = [
    "AGREE",
    "DISAGREE",
    "NOT_MEASURED",
    "PARTLY",
    "WITHHELD",
    "WITHIN",
    "Stat",
    "at_least",
    "at_most",
    "combine",
    "interval_outcome",
    "wilson",
]

AGREE, DISAGREE, PARTLY, WITHIN, NOT_MEASURED = (
    "agrees",
    "does not agree",
    "partly",
    "within run-to-run spread",
    "not measured",
)

#: the verdict of every claim in a run whose models have not learned enough (:mod:`.caveats`)
WITHHELD = "withheld"


@dataclass(frozen=True)
class Stat:
    """One measurement over seeds.

    >>> s = Stat.of([1.0, 1.5])
    >>> s.mean, s.spread, s.low, s.high, s.n
    (1.25, 0.25, 1.0, 1.5, 2)
    """

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Stat:
        return cls(tuple(float(v) for v in values))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def finite(self) -> bool:
        return bool(self.values) and all(math.isfinite(v) for v in self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    @property
    def low(self) -> float:
        return min(self.values) if self.values else math.nan

    @property
    def high(self) -> float:
        return max(self.values) if self.values else math.nan

    @property
    def spread(self) -> float:
        """Half the range over the seeds (0 for one seed)."""
        return (self.high - self.low) / 2 if self.values else math.nan

    def minus(self, other: Stat) -> Stat:
        """Per-seed differences ``self[k] - other[k]`` (both over the same seeds).

        >>> Stat.of([3.0, 5.0]).minus(Stat.of([1.0, 4.0])).values
        (2.0, 1.0)
        """
        if self.n != other.n:
            raise InputError(f"{self.n} values against {other.n}: differences need the same seeds")
        return Stat(tuple(a - b for a, b in zip(self.values, other.values)))

    def map(self, fn) -> Stat:
        return Stat(tuple(fn(v) for v in self.values))


def at_most(stat: Stat | None, bound: float) -> str | None:
    """The verdict on "value <= bound" over the seeds (module docstring); None when not measured or not finite.

    >>> at_most(Stat.of([0.1, 0.2]), 0.3), at_most(Stat.of([0.4, 0.5]), 0.3), at_most(Stat.of([0.2, 0.4]), 0.3)
    ('agrees', 'does not agree', 'within run-to-run spread')
    """
    if stat is None or not stat.finite:
        return None
    if stat.high <= bound:
        return AGREE
    if stat.low > bound:
        return DISAGREE
    return WITHIN


def at_least(stat: Stat | None, bound: float) -> str | None:
    """The verdict on "value > bound", the mirror of :func:`at_most`."""
    outcome = at_most(stat, bound)
    return {AGREE: DISAGREE, DISAGREE: AGREE}.get(outcome, outcome)


def wilson(correct: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson's score interval (95% by default) for ``correct`` successes in ``trials``.

    >>> [round(v, 3) for v in wilson(0, 40)], [round(v, 3) for v in wilson(20, 40)]
    ([0.0, 0.088], [0.352, 0.648])
    """
    if trials <= 0:
        return (math.nan, math.nan)
    p = correct / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def interval_outcome(low: float, high: float, bound: float) -> str | None:
    """The verdict on "value >= bound" for a value in ``[low, high]``.

    >>> interval_outcome(0.6, 0.9, 0.5), interval_outcome(0.0, 0.1, 0.5), interval_outcome(0.3, 0.7, 0.5)
    ('agrees', 'does not agree', 'within run-to-run spread')
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    if low >= bound:
        return AGREE
    if high < bound:
        return DISAGREE
    return WITHIN


def combine(outcomes: Sequence[str | None]) -> str:
    """One verdict from a claim's items: all agree, none agrees, ``partly``, all within spread, or not measured.

    >>> combine([AGREE, AGREE]), combine([AGREE, WITHIN]), combine([DISAGREE, WITHIN]), combine([None])
    ('agrees', 'partly', 'does not agree', 'not measured')
    """
    told = [o for o in outcomes if o is not None]
    if not told:
        return NOT_MEASURED
    if all(o == WITHIN for o in told):
        return WITHIN
    agree, disagree = told.count(AGREE), told.count(DISAGREE)
    if agree == len(told):
        return AGREE
    if agree:
        return PARTLY
    return DISAGREE if disagree else WITHIN
