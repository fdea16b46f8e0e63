"""The kernel contract, written once: :class:`Rotation`, what every backend is asked to do.

The C++ kernel (``cpu/rotary.h``), the Triton kernel and the pure-torch path (:mod:`.eager`) all take one
:class:`Rotation`:

- ``xs``: tensors viewed as ``[B, S, H, D]`` (any strides; the fused kernels want a unit stride over D), head
  counts may differ (GQA), the same B, S and D; ``outs``: same shapes, an ``out`` that *is* its ``x`` means in place;
- ``cos[i]``, ``sin[i]``: the tables of ``xs[i]`` (keys may have their own, xPos), ``[N, r]`` with a unit stride
  over r, or per head ``[N, H, r]``; fp32, or float64 for float64 inputs;
- ``positions``: int64 ``[B, S]`` (any strides) giving token (b, s)'s table row; or ``None``, the row is
  ``b * batch_rows + s`` (``batch_rows`` 0 for a shared table, S for per-batch tables ``[B * S, r]``);
- ``interleaved``: pairs (2i, 2i + 1) instead of (i, i + r/2); ``conjugate``: rotate by -θ (the backward);
- ``frequencies``: ``None``, or float64 ``[r/2 + 1]`` (:func:`rotary.tables.row_frequencies`): a token whose
  position is not a row of the table gets its row computed, as the cached rows were; without it every position
  must be a row (the caller's contract): a token outside reads nothing and comes out NaN (the C++ kernel raises).

Rotating pair (a, b) by θ gives (a cos - b sin, b cos + a sin); channels past ``r`` are copied (out of place) or
left alone (in place). The table gradient: for an output gradient ``g`` of ``xs[i]``, ``d cos[row] += Σ_heads g · x``
and ``d sin[row] += Σ_heads g · turn(x)``, ``turn`` the 90° turn (a, b) -> (-b, a) (negated for ``conjugate``),
per token from the backends, summed into rows by :func:`rotary.kernels.ops.table_grads`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

__all__ = ["INPUT_DTYPES", "Rotation"]

#: the input dtypes rotary rotates (and normalises): the CPU kernel's dispatch, and what every entry accepts
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class Rotation:
    """One call of a rotation kernel (see the module docstring for every field)."""

    xs: tuple[torch.Tensor, ...]
    outs: tuple[torch.Tensor, ...]
    cos: tuple[torch.Tensor, ...]
    sin: tuple[torch.Tensor, ...]
    positions: torch.Tensor | None
    batch_rows: int
    interleaved: bool
    conjugate: bool = False
    frequencies: torch.Tensor | None = None

    @property
    def rotary_dim(self) -> int:
        return self.cos[0].shape[-1]

    def cos_sin(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(cos, sin)`` table of ``xs[i]``."""
        return self.cos[i], self.sin[i]

    def replace(self, **changes: object) -> Rotation:
        """A copy with ``changes`` (as :func:`dataclasses.replace`, without re-running ``__init__``:
        a rotation is copied several times per call, and at decode shapes that cost shows)."""
        if torch.compiler.is_compiling():  # what dynamo traces: the plain dataclass way
            return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        new = object.__new__(Rotation)
        new.__dict__.update(self.__dict__)
        for name in changes:
            if name not in self.__dict__:
                raise TypeError(f"Rotation has no field {name!r}")
        new.__dict__.update(changes)
        return new

    def with_tensors(
        self, xs: tuple[torch.Tensor, ...], outs: tuple[torch.Tensor, ...], *, conjugate: bool | None = None
    ) -> Rotation:
        """The same rotation of other tensors (``conjugate=True`` flips the direction: a backward pass)."""
        flip = self.conjugate if conjugate is None else conjugate
        return self.replace(xs=tuple(xs), outs=tuple(outs), conjugate=flip)
