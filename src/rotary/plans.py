"""Decide once, run many times: a plan per call signature for the entries that rotate.

The first call with a given signature runs the general path (positions, tables, every check with its
named error, the backend choice) and records a :class:`Plan`; a later call with the same signature goes
from the signature to the kernel. The signature is strictly finer than what the plan depends on:

- per tensor: sizes, strides, storage offset, dtype, device, ``requires_grad``, inference-tensor-ness;
- per call: the layout, ``inplace``, ``kinds``, grad mode and inference mode, and, in place, whether the
  inputs share one storage (their overlap then follows from sizes, strides and offsets, all in the key);
- never planned (the general path every time): ``torch.compile`` tracing, tensor subclasses (fake
  tensors included), ``torch.func`` transforms, active torch function or dispatch modes.

Values a plan does not depend on are not in the signature: positions that are values on the device (any
int64 position is valid: a row the table does not hold is computed by the kernel), an ``offset`` (checked
against the plan's table per call, one comparison of host ints), the values of tables a producer made.
A value a plan does depend on is: a :class:`rotary.RoPE`'s frequency buffer (its identity and
``_version``).

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

__all__ = ["LIMIT", "Plan", "PlanCache", "general_path", "plannable", "tensor_key"]

#: the most plans one cache holds (a serving loop sees a handful of shapes; a sweep of lengths more)
LIMIT = 256

_state = threading.local()


def _enabled() -> bool:
    return not getattr(_state, "off", False)


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
    before = getattr(_state, "off", False)
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
        and not getattr(_state, "off", False)
        and _functorch.peek_interpreter_stack() is None
        and not torch._C._is_torch_function_mode_enabled()
        and torch._C._len_torch_dispatch_stack() == 0
    )


def tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What a plan may depend on in one plain tensor: sizes, strides, storage offset, dtype, device,
    ``requires_grad``, inference-tensor-ness.

    Example:
        >>> tensor_key(torch.zeros(2, 3))
        (torch.Size([2, 3]), (3, 1), 0, torch.float32, device(type='cpu'), False, False)
    """
    return (t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad, t.is_inference())


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype start in one storage (the base address of each storage, from the
    data pointer and the storage offset: no storage object made). Zero-sized tensors are in none."""
    size = a.element_size()
    return a.data_ptr() - a.storage_offset() * size == b.data_ptr() - b.storage_offset() * size


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
    """

    backend: str
    layout: int = 1
    interleaved: bool = False
    inplace: bool = False
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


GENERAL = Plan("general")


class PlanCache:
    """Plans by signature, at most :data:`LIMIT` (the oldest dropped first); safe to share between threads.

    Example:
        >>> cache = PlanCache()
        >>> cache.put(("k",), GENERAL)
        >>> cache.get(("k",)) is GENERAL, cache.get(("other",))
        (True, None)
    """

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._plans: dict[Any, Plan] = {}
        self._lock = threading.Lock()

    def get(self, key: Any) -> Plan | None:
        return self._plans.get(key)

    def put(self, key: Any, plan: Plan) -> None:
        with self._lock:
            while len(self._plans) >= self.limit:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def __deepcopy__(self, memo: dict) -> PlanCache:  # a copied module starts with no plans of its own
        return PlanCache(self.limit)

    def __getstate__(self) -> dict:
        return {"limit": self.limit}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["limit"])
