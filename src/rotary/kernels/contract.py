"""The kernel contract, written once: :class:`Rotation`, what every backend is asked to do.

The C++ kernel (``cpu/rotary.h``), the Triton kernel and the pure-torch path (:mod:`.eager`) all
take one :class:`Rotation`:

- ``xs``: tensors viewed as ``[B, S, H, D]`` (any strides; the fused kernels want a unit stride over
  D), possibly different head counts (GQA), the same B, S and D;
- ``outs``: where each rotation goes, same shapes; an ``out`` that *is* its ``x`` means in place;
- ``cos[i]``, ``sin[i]``: the tables of ``xs[i]`` (keys may have their own, as xPos needs; usually
  the same tensors for all). A table is ``[N, r]``: rows of ``r`` channels with a unit stride over
  r; or per head ``[N, H, r]`` (RoPE-Mixed). fp32, or float64 for float64 inputs;
- ``positions``: int64 ``[B, S]`` (any strides, e.g. an expanded ``[S]``) giving the table row of
  token (b, s); or ``None``, when the row is ``b * batch_rows + s`` (``batch_rows`` is 0 for one
  table shared by the batch, S for per-batch tables stacked as ``[B * S, r]``);
- ``interleaved``: pairs (2i, 2i + 1) instead of (i, i + r/2); ``conjugate``: rotate by -θ (the
  backward of a rotation);
- ``frequencies``: ``None``, or float64 ``[r/2 + 1]`` (:func:`rotary.tables.row_frequencies`: the
  frequencies every table of the call was made from, then its attention scaling), with ``positions``:
  a token whose position is not a row of the table (past its end, or negative) gets its row computed
  from the position, ``cos(position * inv_freq)`` in float64 times the scaling, rounded once to the
  table dtype (a cached row is the same number). Without ``frequencies``, every position must be a row
  of the table (the caller's contract): a token outside reads nothing outside the table and comes out
  NaN (the C++ kernel, on CPU memory, raises instead).

Rotating pair (a, b) by θ gives (a cos - b sin, b cos + a sin); channels past ``r`` are copied (out of
place) or left alone (in place).

The gradient with respect to the tables is part of the contract too: for an output gradient ``g``
of ``xs[i]``, ``d cos[row] += Σ_heads g · x`` and ``d sin[row] += Σ_heads g · turn(x)`` per channel,
where ``turn`` is the 90° turn of each pair, (a, b) -> (-b, a) (negated for ``conjugate``). Backends
compute it per token; :func:`rotary.kernels.ops.table_grads` sums tokens into table rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

__all__ = ["Rotation"]


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
