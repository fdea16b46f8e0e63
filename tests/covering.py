"""Covering arrays: the rows of a product of factors that hold every combination of any ``strength`` of them.

A kernel test that loops over ``itertools.product(dtypes, pairings, widths, positions, tables, ...)`` runs
every combination of every factor; under Triton's interpreter each row costs tens of milliseconds, and the
products reach hundreds of rows. :func:`covering` keeps, of that product, rows such that every choice of
``strength`` factors (3 by default) sees each combination of their values in at least one row: every
pairing with every dtype and every table kind, and so on. A fault that needs four factors at once to show
is the one it can miss; ``make fuzz`` sets ``ROTARY_FULL_PRODUCT=1`` and runs the whole product.

No heavy imports: the interpreter scripts of tests/ import it (``from covering import covering``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence


def full_product() -> bool:
    """Whether the whole product is asked for (``ROTARY_FULL_PRODUCT=1``, what ``make fuzz`` sets)."""
    return os.environ.get("ROTARY_FULL_PRODUCT") == "1"


def covering(*factors: Iterable, strength: int = 3) -> list[tuple]:
    """Rows of ``itertools.product(*factors)`` (in product order) holding every ``strength``-way combination.

    Greedy (each step takes the first row of the product that holds the most combinations not yet held), so
    the rows are the same on every run. With ``ROTARY_FULL_PRODUCT=1`` in the environment: the whole product.

    >>> rows = covering((0, 1), "ab", (True, False), strength=2)
    >>> len(rows) < 8 and all(any(r[0] == x and r[2] == z for r in rows) for x in (0, 1) for z in (True, False))
    True
    """
    levels: list[Sequence] = [tuple(f) for f in factors]
    product = list(itertools.product(*(range(len(f)) for f in levels)))
    if full_product() or strength >= len(levels):
        return [tuple(f[i] for f, i in zip(levels, row)) for row in product]
    groups = list(itertools.combinations(range(len(levels)), strength))
    missing = {(g, tuple(row[a] for a in g)) for row in product for g in groups}

    def held(row: tuple) -> set:
        return {(g, tuple(row[a] for a in g)) for g in groups} & missing

    chosen: list[tuple] = []
    while missing:
        best = max(product, key=lambda row: len(held(row)))  # the first of the best: product order breaks ties
        missing -= held(best)
        chosen.append(best)
    chosen.sort(key=product.index)
    return [tuple(f[i] for f, i in zip(levels, row)) for row in chosen]
