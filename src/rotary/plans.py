"""Decide once, run many times: a plan per call signature for the entries that rotate.

The first call with a given signature runs the general path (positions, tables, every check with its named
error, the backend choice) and records a :class:`Plan`; a later call with the same signature goes from the
signature to the kernel. The signature (each tensor's metadata, the call's flags, grad and inference mode, a
``RoPE``'s frequency buffer) is checked in two parts: a key of host values looked up here, and the tensors'
metadata compared in the compiled kernel's entry (``rope_layout``), which does nothing when they differ.
Values (positions, an ``offset``, the tables' values) are not in it. Never planned: ``torch.compile`` tracing,
tensor subclasses, ``torch.func`` transforms, torch function or dispatch modes. Caches are bounded
(:data:`LIMIT`) and thread-safe; a plan's call that fails raises, it never falls back. What is in the
signature and why: docs/core.md, "Plans: check once, run fast".
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.forward_ad as _fwad

__all__ = ["GENERAL", "LIMIT", "Plan", "PlanCache", "general_path", "plannable"]

#: the most plans one cache holds (a serving loop sees a handful of shapes; a sweep of lengths more)
LIMIT = 256


class _State(threading.local):
    off = False  # a class default: reading it costs no AttributeError in a thread that never set it


_state = _State()


def _enabled() -> bool:
    return not _state.off


@contextlib.contextmanager
def general_path() -> Iterator[None]:
    """Within this block (in this thread) every call takes the general path and records nothing.

    Example:
        >>> import rotary
        >>> rope, q = rotary.RoPE(8), torch.randn(1, 2, 3, 8)
        >>> with general_path():
        ...     slow = rope.rotate(q)
        >>> torch.equal(slow, rope.rotate(q))
        True
    """
    before = _state.off
    _state.off = True
    try:
        yield
    finally:
        _state.off = before


_functorch = torch._C._functorch


def plannable() -> bool:
    """Whether this call may use a plan: plans on, not traced by ``torch.compile``, no ``torch.func``
    transform and no torch function or dispatch mode active (each of those the general path handles)."""
    return (
        not torch.compiler.is_compiling()  # first: nothing below is traced
        and not _state.off
        and _functorch.peek_interpreter_stack() is None
        and not torch._C._is_torch_function_mode_enabled()
        and torch._C._len_torch_dispatch_stack() == 0
        and _fwad._current_level < 0  # no forward-AD level: dual tensors are not in a signature
    )


@dataclass(frozen=True)
class Plan:
    """What the general path decided for one signature, replayed by a later call.

    Attributes:
        backend: ``"cpu"`` (the compiled extension's ``rope_layout``), or ``"general"``: the general path runs
            at every call of this signature (recorded so the decision is not made again).
        layout: 0 packed ``[T, H, D]``, 1 ``[B, S, H, D]``, 2 ``[B, H, S, D]``.
        interleaved, inplace: the pairing; write into the inputs.
        tables: a :class:`rotary.RoPE`'s cached ``(cos, sin)`` ``[N, r]`` and the frequencies past them, or ``None``.
        signature: the compiled kernel's record of the call's tensors, compared with each later call's in C++.
        guard: for a :class:`rotary.RoPE`'s plan, its frequency buffer and that buffer's ``_version``.
        run: the compiled kernel's call of this plan, what does not change between its calls bound
            (``RopePlan.with_offset`` or ``with_tables`` of the extension), or ``None``.
    """

    backend: str
    layout: int = 1
    interleaved: bool = False
    inplace: bool = False
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    signature: Any = None
    guard: tuple[torch.Tensor, int] | None = None
    run: Any = None


GENERAL = Plan("general")


class PlanCache(dict):
    """Plans by signature, at most :data:`LIMIT` (the oldest dropped first); safe to share between threads.

    A dictionary (``get`` is the dictionary's own: a lookup per call costs no Python frame); :meth:`put` adds.

    Example:
        >>> cache = PlanCache()
        >>> cache.put(("k",), GENERAL)
        >>> cache.get(("k",)) is GENERAL, cache.get(("other",))
        (True, None)
    """

    def __init__(self, limit: int = LIMIT) -> None:
        super().__init__()
        self.limit = limit
        self._lock = threading.Lock()

    def put(self, key: Any, plan: Plan) -> None:
        with self._lock:
            while len(self) >= self.limit:
                self.pop(next(iter(self)))
            self[key] = plan

    def clear(self) -> None:
        with self._lock:
            super().clear()

    def __deepcopy__(self, memo: dict) -> PlanCache:  # a copied module starts with no plans of its own
        return PlanCache(self.limit)

    def __copy__(self) -> PlanCache:
        return PlanCache(self.limit)

    def __reduce__(self) -> tuple:  # pickled without its plans (compiled kernels' objects)
        return PlanCache, (self.limit,)
