"""Registries whose registrations a block can scope: rotary's extension points are global tables filled by
decorators at import time; a test or script that registers an entry for a while uses ``with
ROPE_TYPES.scope():`` instead of saving and restoring the table by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

from rotary.errors import InputTypeError

__all__ = ["Registry", "scoped"]

V = TypeVar("V")


@contextlib.contextmanager
def scoped(*registries: dict | list) -> Iterator[None]:
    """Undo, on leaving the block (also by an exception), every change made inside it to ``registries``.

    Each dict or list is restored in place (the object importers hold); anything else is an InputTypeError.

    Example:
        >>> table = {"a": 1}
        >>> with scoped(table):
        ...     table["b"] = 2
        >>> table
        {'a': 1}
    """
    for registry in registries:
        if not isinstance(registry, (dict, list)):
            raise InputTypeError(f"scoped() restores dicts and lists, got {type(registry).__name__}")
    saved = [registry.copy() for registry in registries]
    try:
        yield
    finally:
        for registry, before in zip(registries, saved):
            if isinstance(registry, dict):
                registry.clear()
                registry.update(before)
            else:
                registry[:] = before


class Registry(dict[str, V]):
    """A name -> entry table (a ``dict``) whose changes a block can scope with :meth:`scope`.

    Example:
        >>> encodings = Registry(rope=1)
        >>> with encodings.scope():
        ...     encodings["mine"] = 2
        >>> sorted(encodings)
        ['rope']
    """

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Undo, on leaving the block, every registration, replacement and removal made inside it."""
        return scoped(self)
