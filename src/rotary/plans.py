"""Decide once, run many times: a plan per call signature for the entries that rotate.

The first call with a given signature runs the general path (positions, tables, every check with its
named error, the backend choice) and records a :class:`Plan`; a later call with the same signature goes
from the signature to the kernel. The signature is strictly finer than what the plan depends on:

- per tensor (the inputs, the tables, the position ids): rank, sizes, strides, storage offset, dtype,
  device, ``requires_grad``, inference-tensor-ness;
- per call: the layout, ``inplace`` (and in place, whether the inputs share one storage: their overlap
  then follows from sizes, strides and offsets), ``kinds``, the tables' pairing and form, grad mode and
  inference mode; for a :class:`rotary.RoPE`, the identity and ``_version`` of its frequency buffer;
- never planned (the general path every time): ``torch.compile`` tracing, tensor subclasses (fake
  tensors included), ``torch.func`` transforms, active torch function or dispatch modes.

It is checked in two parts, each in one place: a key of host values in Python (the layout, the flags,
the input shapes: a dictionary lookup picks the plan), and the rest where it is cheapest, in the compiled
kernel's entry (``rope_layout``), which compares the call's tensors with the plan's recorded
:class:`Signature` in one statement, as SGLang's ``TensorMatcher`` does, and does nothing when they differ:
the general path then runs, and records the plan of the new signature.

Values a plan does not depend on are not in the signature: positions that are values on the device (any
int64 position is valid: a row the table does not hold is computed by the kernel), an ``offset`` (checked
against the plan's table per call, one comparison of host ints), the values of the tables.

Caches are bounded (:data:`LIMIT` plans each, the oldest dropped first) and safe to share between
threads (a lookup is one dictionary read; a plan is immutable once recorded). A plan is recorded only
after the general path succeeded; a plan's call that fails raises (the kernel's error), it never falls
back to another path. :func:`general_path` turns plans off, to compare a plan with the general path.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

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
    )


@dataclass(frozen=True)
class Plan:
    """What the general path decided for one signature, replayed by a later call.

    Attributes:
        backend: ``"cpu"`` (the compiled extension's ``rope_layout``), or ``"general"``: the general path
            runs at every call of this signature (autograd, key or per-head tables, backends without a
            replay); recorded so the decision is not made again.
        layout: 0 packed ``[T, H, D]``, 1 ``[B, S, H, D]``, 2 ``[B, H, S, D]``.
        interleaved: the pairing.
        inplace: write into the inputs.
        tables: for a :class:`rotary.RoPE`'s plan, its cached ``(cos, sin)`` ``[N, r]`` and the frequencies
            of rows past them, else ``None`` (the call's tables are used).
        signature: the compiled kernel's record of the call's tensors (``signature`` of the extension),
            compared with each later call's in C++.
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
