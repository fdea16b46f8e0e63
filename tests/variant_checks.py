"""The harness of the variants' property tests (importable as ``variant_checks``).

Arbitrary input to the public API of ``rotary.variants`` (and ``RoPE(learnable_frequencies=True)``) must
give the right result (against the float64 reference forms in :mod:`rotary.reference`, or the plain 1-D
path where a variant reduces to it) or a named ``ValueError``/``TypeError`` raised by rotary itself, with
a message — never a wrong tensor, never a bare internal exception (IndexError, RuntimeError from inside
torch, AssertionError, ZeroDivisionError, a TypeError from a builtin, ...). The strategies mostly draw
inputs that fit (so the results are checked) and sometimes anything (:data:`WILD`, :func:`spoiled`).
Each test decides up front, from the documented contract and without calling rotary, whether a draw is
valid: a valid draw must not be refused (its result is checked), an invalid one must be (:func:`expect`).

- :func:`call` and :func:`assert_named`: a result, or an error raised by one of rotary's own ``raise``;
- :func:`expect`: the result of a call the test classified as valid, or the named error of an invalid one;
- :func:`is_int`, :func:`is_number`, :func:`is_bool`, :func:`valid_ids`: the contract's argument kinds, for
  those classifications;
- :func:`tensors`: tensors of a shape (or a drawn one), any dtype, sometimes non-contiguous views;
- :func:`assert_close`, :func:`tolerance`, :data:`TOL`: the result against the float64 oracle;
- :func:`expected_nd`, :func:`largest_angle`: the N-D oracle per batch row, and the angles it reaches.
"""

import linecache
import math
import os

import torch
from hypothesis import strategies as st

import rotary
from helpers import NAMED
from rotary import reference

SRC = os.path.dirname(rotary.__file__)
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DTYPES = [*FLOATS, torch.int64, torch.bool]
# the output error against the float64 oracle, relative to max(1, |x|): the tables are float64
# angles rounded once to fp32 (float64 for float64 inputs), the kernel computes in fp32 and the
# result is rounded to the input's dtype: a few ulp of fp32, and the rounding of bf16 (2^-8) / fp16 (2^-11)
# on sums of two products
TOL = {torch.float32: 2e-5, torch.float64: 1e-9, torch.bfloat16: 2e-2, torch.float16: 3e-3}
EPS64 = 2**-52


def assert_named(exc: BaseException) -> None:
    """A ValueError/TypeError raised by a ``raise`` statement in rotary's own code, with a message."""
    assert isinstance(exc, NAMED), exc
    assert str(exc), "an error must say what is wrong"
    tb = exc.__traceback__
    assert tb is not None
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = tb.tb_frame.f_code.co_filename
    line = linecache.getline(path, tb.tb_lineno).strip()
    # Python's own signature errors name the keyword; any other error must be one of rotary's raise statements
    signature = isinstance(exc, TypeError) and (
        "unexpected keyword argument" in str(exc) or "multiple values for" in str(exc)
    )
    assert path.startswith(SRC) and (line.startswith("raise") or signature), (
        f"not rotary's own error: {path}:{tb.tb_lineno}: {line}: {exc!r}"
    )


def call(fn, *args, **kwargs):
    """``(result, None)`` or ``(None, error)`` for a named error; anything else propagates."""
    try:
        return fn(*args, **kwargs), None
    except NAMED as exc:
        assert_named(exc)
        return None, exc


def expect(valid: bool, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` for a draw the test classified up front: a valid one must return (its result is
    returned, for the caller to check), an invalid one must raise a named error (``None`` is returned)."""
    out, err = call(fn, *args, **kwargs)
    if valid:
        assert err is None, f"a valid input was refused: {err!r} (args {args!r}, kwargs {kwargs!r})"
        return out
    assert err is not None, f"an invalid input was accepted (args {args!r}, kwargs {kwargs!r})"
    return None


def is_int(v) -> bool:
    """An int as rotary's arguments take one: not a bool, a float or a string (NumPy/torch integer scalars too)."""
    return not isinstance(v, bool) and (isinstance(v, int) or type(v).__name__ in ("int32", "int64"))


def is_number(v) -> bool:
    """A finite real number: an int (as :func:`is_int`) or a float, not a bool."""
    return (is_int(v) or isinstance(v, float)) and -math.inf < v < math.inf


def is_bool(v) -> bool:
    return isinstance(v, bool)


def valid_ids(ids, ranks=(1, 2), top=2**53) -> bool:
    """Positions as rotary.positions documents them: an int64/int32 tensor of one of ``ranks`` (any rank for
    ``None``), every value in ``[0, top]`` (rotations: ``from_ids`` up to 2**53; ``top=None``: no bound, as
    ``integer_positions``)."""
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
        return False
    if ranks is not None and ids.dim() not in ranks:
        return False
    return not ids.numel() or (int(ids.min()) >= 0 and (top is None or int(ids.max()) <= top))


@st.composite
def tensors(draw, shape=None, rank=None, dtype=None, max_size=4, last=None):
    """A tensor of ``shape`` (or a drawn one), any dtype, sometimes a non-contiguous view."""
    if shape is None:
        rank = draw(st.integers(0, 5)) if rank is None else rank
        shape = draw(st.lists(st.integers(0, max_size), min_size=rank, max_size=rank))
        if last is not None and rank:
            shape[-1] = last
    shape = list(shape)
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    kind = draw(st.sampled_from(["plain", "plain", "transposed", "sliced", "expanded"]))
    if kind == "transposed" and len(shape) >= 2 and shape[0] == shape[1]:
        x = torch.randn(shape, generator=g).transpose(0, 1)
    elif kind == "sliced" and len(shape) >= 1:
        x = torch.randn([2 * shape[0], *shape[1:]], generator=g)[::2]
    elif kind == "expanded" and len(shape) >= 2:
        x = torch.randn([shape[0], 1, *shape[2:]], generator=g).expand(shape)
    else:
        x = torch.randn(shape, generator=g)
    return x.to(dtype) if dtype != torch.bool else x > 0


def tolerance(x: torch.Tensor, max_angle: float = 0.0) -> float:
    """The tolerance for inputs like ``x`` (see TOL); angles of ``max_angle`` rad carry float64 rounding."""
    scale = max(1.0, float(x.double().abs().max())) if x.numel() else 1.0
    return (TOL[x.dtype] + 8 * EPS64 * max_angle) * scale


def assert_close(out: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, max_angle: float = 0.0) -> None:
    assert out.shape == x.shape and out.dtype == x.dtype
    if out.numel():
        err = float((out.detach().double() - ref).abs().max())
        assert err <= tolerance(x, max_angle), f"off by {err} (tolerance {tolerance(x, max_angle)})"


def to_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "bhsd" else x.transpose(1, 2)


WILD = st.sampled_from([False, False, True])  # a third of the draws may put anything anywhere


def spoiled(draw, valid: dict, bad: dict) -> dict:
    """``valid`` with, in about a third of the draws, one or two of its entries (or extra keywords)
    replaced by a value from ``bad[name]``. Some of those values are valid with some of the other
    arguments: the test's own predicate says whether the draw is valid."""
    n = draw(st.sampled_from([0] * 7 + [1, 1, 2]))
    out = dict(valid)
    for name in draw(st.lists(st.sampled_from(sorted(bad)), min_size=n, max_size=n, unique=True)):
        out[name] = draw(st.sampled_from(bad[name]))
    return out


def expected_nd(x_bhsd: torch.Tensor, coords: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The N-D oracle per batch row; ``coords`` ``[S, A]`` or ``[B, S, A]`` (identity rows already 0)."""
    out = torch.empty(x_bhsd.shape, dtype=torch.float64)
    for b in range(x_bhsd.shape[0]):
        c = coords if coords.dim() == 2 else coords[min(b, coords.shape[0] - 1)]
        out[b] = reference.rotate_matrix_nd(x_bhsd[b], c, inv_freq.detach().double(), interleaved=interleaved)
    return out


def largest_angle(coords: torch.Tensor, inv_freq: torch.Tensor) -> float:
    if not coords.numel():
        return 0.0
    return float(coords.abs().max()) * float(inv_freq.detach().double().abs().sum(-2).max())
