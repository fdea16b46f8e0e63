"""Arbitrary input to the public API of ``rotary.variants`` (and ``RoPE(learnable_frequencies=True)``):
the result is right (against the float64 reference forms in :mod:`rotary.reference`, or the plain 1-D
path where a variant reduces to it) or the error is a named ``ValueError``/``TypeError`` raised by
rotary itself, with a message — never a wrong tensor, never a bare internal exception (IndexError,
RuntimeError from inside torch, AssertionError, ZeroDivisionError, a TypeError from a builtin, ...).

The strategies mostly draw inputs that fit (so the results are checked) and sometimes anything:
wrong ranks, zero sizes, odd head dims, negative / huge / NaN / float / bool positions and
parameters, strings where bools or ints go, non-contiguous views, every dtype."""

from __future__ import annotations

import linecache
import math
import os

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary import AxialRoPE, reference
from rotary.rope_types import ConfigError
from rotary.variants import (
    MRoPE,
    RoPEMixed,
    XPos,
    default_no_rope_layers,
    multimodal_positions,
    nope_temperature,
    rope_layer_flags,
)

NAMED = (ValueError, TypeError)
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
    signature = isinstance(exc, TypeError) and ("unexpected keyword argument" in str(exc) or "multiple values for" in str(exc))
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


def _tol(x: torch.Tensor, max_angle: float = 0.0) -> float:
    """The tolerance for inputs like ``x`` (see TOL); angles of ``max_angle`` rad carry float64 rounding."""
    scale = max(1.0, float(x.double().abs().max())) if x.numel() else 1.0
    return (TOL[x.dtype] + 8 * EPS64 * max_angle) * scale


def assert_close(out: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, max_angle: float = 0.0) -> None:
    assert out.shape == x.shape and out.dtype == x.dtype
    if out.numel():
        err = float((out.detach().double() - ref).abs().max())
        assert err <= _tol(x, max_angle), f"off by {err} (tolerance {_tol(x, max_angle)})"


def to_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "bhsd" else x.transpose(1, 2)


# ================================================================================================
# AxialRoPE


def _grid_values(sizes, kind, offset):
    """Independent grid coordinates: integer indices + offset, or cell centres 2 (i + 0.5) / n - 1."""
    axes = []
    for n in sizes:
        i = torch.arange(n, dtype=torch.float64)
        axes.append(2 * (i + 0.5) / n - 1 if kind == "normalized" else i + offset)
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(sizes))


WILD = st.sampled_from([False, False, True])  # a third of the draws may put anything anywhere


def spoiled(draw, valid: dict, bad: dict) -> dict:
    """``valid`` with, in about a third of the draws, one or two of its entries (or extra keywords)
    replaced by a value from ``bad[name]``."""
    n = draw(st.sampled_from([0] * 7 + [1, 1, 2]))
    out = dict(valid)
    for name in draw(st.lists(st.sampled_from(sorted(bad)), min_size=n, max_size=n, unique=True)):
        out[name] = draw(st.sampled_from(bad[name]))
    return out


AXIAL_BAD = {
    "head_dim": [0, -4, 7, 2**40, "8", 8.0, True, None],
    "axes": [0, -1, True, "2", 2.0, 7],
    "split": [(3, 3), (0, 8), (True, True), "ab", 4, (2.0, 2.0), (2, 2, 2, 2), ()],
    "base": [1e300, 1.0, 0.5, 1e-300, 0.0, -10.0, math.nan, math.inf, "100", True],
    "coordinates": ["pixel", None, 0, ["grid"]],
    "max_freq": [10.0, 1.0, 1e300, 1e-300, 0.0, -1.0, math.nan, "10"],
    "interleaved": ["false", 1, None, 0.0],
    "block_order": [(True, False), (0, 0), 5, (1.0, 0.0), "10"],
    "frequency_scale": [2 * math.pi, 1e300, 1e-300, -1.0, 0.0, math.nan],
    "frequency_dtype": [torch.float64, torch.float16, "float32", None],
    "frequencies": ["alternating", "other", None],
    "grid_offset": [1.0, math.nan, 1e300, -1e300, "1", True],
    "reference_grid": [4, 2.0, True, (0, 3), "ab", (4, 4, 4), [4, 4]],
    "prefix_tokens": [1, 2, -1, 1.0, True],
    "suffix_tokens": [1, 1.0, "1"],
    "normalize_coords": ["max", "min", "avg"],
    "shift_coords": [0.5, -0.5, math.nan],
    "jitter_coords": [0.5, 2.0],
    "rescale_coords": ["2", 2.0],
    "generator": [0, "seed"],
    "nonsense": [1],
}


@st.composite
def axial_args(draw, wild=True):
    """Constructor arguments: mostly valid (then the rotation is checked), sometimes anything."""
    a = draw(st.integers(1, 3))
    split = [2 * draw(st.integers(1, 3)) for _ in range(a)]
    valid = dict(
        head_dim=sum(split) + 2 * draw(st.integers(0, 1)),
        axes=a,
        split=draw(st.sampled_from([tuple(split), tuple(split), None])) if len(set(split)) == 1 else tuple(split),
        rotary_dim=sum(split),
        base=draw(st.sampled_from([10000.0, 100.0, 10.0])),
        coordinates=draw(st.sampled_from(["grid", "grid", "normalized"])),
        max_freq=draw(st.sampled_from([None, None, None, 10.0])),
        interleaved=draw(st.booleans()),
        block_order=tuple(draw(st.permutations(range(a)))),
    )
    if valid["coordinates"] == "grid" and draw(st.booleans()):
        valid["grid_offset"] = draw(st.sampled_from([1.0, -0.5]))
    return spoiled(draw, valid, AXIAL_BAD) if wild else valid


@st.composite
def axial_positions(draw, rope: AxialRoPE, wild=True):
    """Positions for ``rope``: a grid, explicit coordinates, or (``wild``) something else."""
    kind = draw(st.sampled_from(["grid"] * 4 + ["explicit"] * 3 + ["explicit_batch"] * 2 + ["arbitrary"] * wild))
    a = rope.axes
    if kind == "grid":
        sizes = draw(st.lists(st.integers(1, 3), min_size=a, max_size=a))
        bad = None if not wild else draw(st.sampled_from([None] * 5 + [(0,) * a, (2,) * (a + 1), (2.0,) * a, ("2",) * a, (True,) * a]))
        prefix = draw(st.sampled_from([None, 0, 1, 2] + [-1, 1.0, True] * wild))
        return "grid", (sizes if bad is None else bad, prefix)
    if kind in ("explicit", "explicit_batch"):
        s = draw(st.integers(0, 5))
        shape = [draw(st.integers(1, 2)), s, a] if kind == "explicit_batch" else [s, a]
        dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.float64, torch.float32] + [torch.bfloat16, torch.int16] * wild))
        magnitude = draw(st.sampled_from([10, 10, 1e3, 1e6]))
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        values = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * magnitude
        special = draw(st.sampled_from([None] * 4 + [math.nan, math.inf, -math.inf, 1e300] * wild))
        if special is not None and values.numel() and dtype.is_floating_point:
            values.view(-1)[0] = special  # 1e300 becomes inf in fp32 / bf16
        values = values.to(dtype)
        identity = draw(st.sampled_from([None, None, "some", "all"] + ["int", "wrong"] * wild))
        if identity == "some":
            identity = torch.arange(s) % 2 == 0
        elif identity == "all":
            identity = torch.ones(shape[:-1], dtype=torch.bool)
        elif identity == "int":
            identity = torch.ones(s, dtype=torch.int64)
        elif identity == "wrong":
            identity = torch.zeros(s + 1, dtype=torch.bool)
        return "explicit", (values, identity)
    return "arbitrary", draw(
        st.one_of(tensors(max_size=3), st.just([[0, 1]]), st.just(None), st.just(rotary.positions.arange(3)), st.just(rotary.positions.grid(2, 2)))
    )


def _expected_nd(x_bhsd: torch.Tensor, coords: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The N-D oracle per batch row; ``coords`` ``[S, A]`` or ``[B, S, A]`` (identity rows already 0)."""
    out = torch.empty(x_bhsd.shape, dtype=torch.float64)
    for b in range(x_bhsd.shape[0]):
        c = coords if coords.dim() == 2 else coords[min(b, coords.shape[0] - 1)]
        out[b] = reference.rotate_matrix_nd(x_bhsd[b], c, inv_freq.detach().double(), interleaved=interleaved)
    return out


def _max_angle(coords: torch.Tensor, inv_freq: torch.Tensor) -> float:
    if not coords.numel():
        return 0.0
    return float(coords.abs().max()) * float(inv_freq.detach().double().abs().sum(-2).max())


@settings(max_examples=100, deadline=None)
@given(wild=WILD, data=st.data())
def test_axial_rope_is_right_or_a_named_error(wild, data):
    args = data.draw(axial_args(wild))
    rope, err = call(AxialRoPE, **args)
    if err is not None:
        return
    rope.eval()  # augmentation has its own test
    assert rope.head_dim == args["head_dim"] and rope.interleaved is args["interleaved"]
    inv_freq = rope.frequencies()
    assert inv_freq.dtype == torch.float64 and bool(torch.isfinite(inv_freq).all()) and bool((inv_freq >= 0).all())
    assert bool((inv_freq.ne(0).sum(0) == 1).all()), "each pair turns with exactly one axis"
    kind, pos = data.draw(axial_positions(rope, wild))
    identity = None
    if kind == "grid":
        sizes, prefix = pos
        coords, err = call(rope.grid, *sizes, prefix=prefix)
        if err is not None:
            return
        values = coords.values
        p = rope.prefix_tokens if prefix is None else prefix
        if rope.reference_grid is None and rope.normalize_coords == "separate":
            want = _grid_values(sizes, rope.coordinate_kind, rope.grid_offset)
            assert torch.equal(values[p : p + want.shape[0]], want)
        assert values.shape[0] == p + math.prod(sizes) + rope.suffix_tokens
        positions = coords
    elif kind == "explicit":
        positions, identity = pos
    else:
        positions = pos
    seq = data.draw(st.integers(0, 5))
    if isinstance(positions, rotary.variants.Coordinates):
        seq = positions.seq_len
    elif isinstance(positions, torch.Tensor) and positions.dim() >= 2:
        seq = positions.shape[-2]
    layout = data.draw(st.sampled_from(["bhsd", "bshd"] + ["sbhd", 3] * wild))
    heads, batch = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    if isinstance(positions, torch.Tensor) and positions.dim() == 3:
        batch = positions.shape[0] if data.draw(st.booleans()) else batch
    shape = [batch, heads, seq, rope.head_dim] if layout != "bshd" else [batch, seq, heads, rope.head_dim]
    fitting = tensors(shape=shape, dtype=data.draw(st.sampled_from(FLOATS)))
    q = data.draw(st.one_of(fitting, tensors(max_size=3)) if wild else fitting)
    k = data.draw(st.one_of(st.just(q.clone()), fitting, *[tensors(max_size=3)] * wild))
    inplace = data.draw(st.sampled_from([False, True] + ["yes"] * wild))
    q0, k0 = q.clone(), k.clone()
    out, err = call(rope, q, k, positions, identity=identity, layout=layout, inplace=inplace)
    if err is not None:
        return
    # it ran: every input was valid, so the result must be the rotation
    assert q.is_floating_point() and k.is_floating_point() and layout in ("bhsd", "bshd")
    coords = rope.coordinates(positions, identity=identity)
    values = coords.values
    if coords.identity is not None:
        values = values.masked_fill(coords.identity.unsqueeze(-1), 0.0)
    assert bool(torch.isfinite(values).all())
    angle = _max_angle(values, inv_freq)
    for got, x in zip(out, (q0, k0)):
        ref = _expected_nd(to_bhsd(x, layout), values, inv_freq, rope.interleaved)
        assert_close(got, to_bhsd(ref, layout) if layout == "bhsd" else ref.transpose(1, 2), x, angle)
    if inplace is True:
        assert out[0] is q


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["torchtune", "llama4_vision", "pixtral", "dinov3", "eva02", "flux", "cogvideox", "nope", ["dinov3"], None, 3]),
    head_dim=st.sampled_from([None, None, 32, 64, 48, 30, 0, -64, 64.0, True, "64", 128]),
    overrides=st.sampled_from([{}, {}, {"prefix_tokens": 2}, {"interleaved": "no"}, {"base": -1.0}, {"axes": 3}, {"bogus": 1}]),
)
def test_axial_presets_are_right_or_a_named_error(name, head_dim, overrides):
    rope, err = call(AxialRoPE.preset, name, head_dim, **overrides)
    if err is not None:
        return
    rope.eval()
    a = rope.axes
    coords = rope.grid(*([2] * a))
    q = torch.randn(1, 2, coords.seq_len, rope.head_dim)
    q_rot = rope.rotate(q, coords)
    values = coords.values.masked_fill(coords.identity.unsqueeze(-1), 0.0) if coords.identity is not None else coords.values
    assert_close(q_rot, _expected_nd(q, values, rope.frequencies(), rope.interleaved), q, _max_angle(values, rope.frequencies()))


@settings(max_examples=40, deadline=None)
@given(
    shift=st.sampled_from([None, 0.0, 0.5, 1e300, -0.5, math.nan, "0.5", True]),
    jitter=st.sampled_from([None, 1.0, 1.5, 1e300, 0.5, math.inf, "2"]),
    rescale=st.sampled_from([None, 1.0, 2.0, 1e300, 0.0, -2.0]),
    training=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_axial_augmentation_is_finite_or_a_named_error(shift, jitter, rescale, training, seed):
    rope, err = call(AxialRoPE, 16, shift_coords=shift, jitter_coords=jitter, rescale_coords=rescale, coordinates="normalized")
    if err is not None:
        return
    rope.train(training)
    coords = rope.grid(3, 3)
    tables, err = call(rope.tables, coords, generator=torch.Generator().manual_seed(seed))
    if err is not None:
        return
    assert bool(torch.isfinite(tables.cos).all() and torch.isfinite(tables.sin).all())
    if not training or not rope.augments:
        plain = AxialRoPE(16, coordinates="normalized").tables(coords)
        assert torch.equal(tables.cos, plain.cos) and torch.equal(tables.sin, plain.sin)


# ================================================================================================
# RoPEMixed


MIXED_BAD = {
    "head_dim": [12, 6, 0, 7, "8", 8.0],
    "num_heads": [0, -1, "2", 2.0, True],
    "base": [1e300, 1.0, 0.5, 1e-300, -1.0, math.nan, "10"],
    "rotate": ["yes", 1],
    "interleaved": ["true", None],
    "rotary_dim": [4, 2, 6, 0, 100],
    "prefix_tokens": [-1, 1.0],
    "axes": [3],
}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_rope_mixed_is_right_or_a_named_error(data):
    valid = dict(
        head_dim=data.draw(st.sampled_from([8, 16])), num_heads=data.draw(st.integers(1, 3)),
        base=data.draw(st.sampled_from([10.0, 100.0])), rotate=data.draw(st.booleans()), interleaved=data.draw(st.booleans()),
    )  # fmt: skip
    args = spoiled(data.draw, valid, MIXED_BAD)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    head_dim, num_heads = args.pop("head_dim"), args.pop("num_heads")
    rope, err = call(RoPEMixed, head_dim, num_heads, generator=g, **args)
    if err is not None:
        return
    rope.eval()
    inv_freq = rope.frequencies()
    assert inv_freq.shape == (num_heads, 2, rope.rotary_dim // 2) and bool(torch.isfinite(inv_freq).all())
    h, w = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    coords = rope.grid(h, w, prefix=data.draw(st.sampled_from([0, 1])))
    layout = data.draw(st.sampled_from(["bhsd", "bshd"]))
    kv_heads = data.draw(st.sampled_from([num_heads, num_heads, 1, num_heads + 1]))
    dtype = data.draw(st.sampled_from(FLOATS))
    s, d = coords.seq_len, rope.head_dim
    q = data.draw(tensors(shape=[2, num_heads, s, d] if layout == "bhsd" else [2, s, num_heads, d], dtype=dtype))
    k = data.draw(tensors(shape=[2, kv_heads, s, d] if layout == "bhsd" else [2, s, kv_heads, d], dtype=dtype))
    out, err = call(rope, q, k, coords, layout=layout)
    if err is not None:
        assert kv_heads != num_heads, "fitting q and k were refused"
        return
    assert kv_heads == num_heads, "per-head tables need q and k with the heads they were built for"
    values = coords.values.masked_fill(coords.identity.unsqueeze(-1), 0.0) if coords.identity is not None else coords.values
    angle = _max_angle(values, inv_freq)
    for got, x in zip(out, (q, k)):
        ref = _expected_nd(to_bhsd(x, layout), values, inv_freq, rope.interleaved)
        assert_close(got, ref if layout == "bhsd" else ref.transpose(1, 2), x, angle)


# ================================================================================================
# MRoPE


def _slot_axes(section, interleaved):
    """Independent of rotary: the axis of each frequency slot (chunked, or Qwen3-VL's cycle)."""
    if not interleaved:
        return [j % 3 for j, n in enumerate(section) for _ in range(n)]
    left, out = list(section), []
    for i in range(sum(section)):
        axis = i % 3
        if axis and left[axis] and 3 * left[axis] > 0 and i < 3 * section[axis]:
            out.append(axis)
            left[axis] -= 1
        else:
            out.append(0)
    return out


@st.composite
def mrope_args(draw, wild=True):
    head_dim = draw(st.sampled_from([16] * 8 + [24, 12, 8, 8, 0, 7, "16", 16.0]))
    d = head_dim if isinstance(head_dim, int) and head_dim > 0 else 16
    r = draw(st.sampled_from([d, d, d - 4 if d > 4 else d]))
    slots = r // 2
    interleaved_layout = draw(st.sampled_from([False] * 5 + [True] * 5 + ["true"]))
    hw = max(1, (slots - 1) // 3) if interleaved_layout is True else max(1, slots // 3)
    t = slots - 2 * hw
    section = draw(st.sampled_from([[t, hw, hw]] * 20 + [[slots], [t, hw, hw + 1], [0, slots, 0], [-1, 1, slots], "2,3,3", [], None, [t, hw, float(hw)], [True, hw, hw]]))
    scaling = draw(st.sampled_from([None] * 10 + [{"rope_type": "linear", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, {"rope_type": "dynamic", "factor": 2.0}, {"rope_type": "linear", "factor": -1.0}, "linear"]))
    args = dict(
        head_dim=head_dim, mrope_section=section, mrope_interleaved=interleaved_layout,
        base=draw(st.sampled_from([None] * 5 + [10000.0] * 5 + [1e6] * 5 + [0.5, -1.0, math.nan, "1e6"])), rotary_dim=r if r != d else None,
        scaling=scaling, interleaved=draw(st.sampled_from([False] * 5 + [True] * 5 + ["false"])),
    )  # fmt: skip
    if not wild:  # every argument valid
        args.update(head_dim=d, mrope_section=[t, hw, hw], mrope_interleaved=interleaved_layout is True, interleaved=args["interleaved"] is True)
        args.update(base=args["base"] if args["base"] in (None, 10000.0, 1e6) else None, scaling=scaling if scaling in (None, {"rope_type": "linear", "factor": 2.0}) else None)
    return args


@st.composite
def mrope_positions(draw, batch, seq, wild=True):
    kind = draw(st.sampled_from(["ids"] * 2 + ["text"] + ["arbitrary"] * wild))
    if kind == "arbitrary":
        return draw(st.one_of(tensors(max_size=3), st.just(torch.arange(seq)), st.just(torch.arange(seq).expand(batch, seq)), st.just([0, 1])))
    b = draw(st.sampled_from([batch, 1] + [batch + 1] * wild))
    values = draw(st.sampled_from([50, 50, 2**20, 2**40]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if kind == "text":
        ids = torch.randint(0, values, (1, b, seq), generator=g).expand(3, b, seq)
    else:
        ids = torch.randint(0, values, (3, b, seq), generator=g)
    special = draw(st.sampled_from([None, None, "int32"] + [-1, "float", "bool"] * wild))
    if special == -1 and ids.numel():
        ids = ids.clone()
        ids.view(-1)[0] = -1
    elif special == "float":
        ids = ids.float()
    elif special == "int32":
        ids = ids.int()
    elif special == "bool":
        ids = ids > 3
    return ids


@settings(max_examples=80, deadline=None)
@given(wild=WILD, data=st.data())
def test_mrope_is_right_or_a_named_error(wild, data):
    args = data.draw(mrope_args(wild))
    rope, err = call(MRoPE, strict=True, **args)
    if err is not None:
        return
    section, layout_interleaved = list(args["mrope_section"]), args["mrope_interleaved"]
    assert rope.axes.tolist() == _slot_axes(section, layout_interleaved)
    batch, seq, dtype = data.draw(st.integers(1, 2)), data.draw(st.integers(0, 4)), data.draw(st.sampled_from(FLOATS))
    layout = data.draw(st.sampled_from(["bhsd", "bshd"] + ["thd"] * wild))
    d = rope.head_dim
    shape_q = [batch, 2, seq, d] if layout != "bshd" else [batch, seq, 2, d]
    q = data.draw(st.one_of(tensors(shape=shape_q, dtype=dtype), *[tensors(max_size=3)] * wild))
    k = data.draw(tensors(shape=[batch, 1, seq, d] if layout != "bshd" else [batch, seq, 1, d], dtype=dtype))
    ids = data.draw(mrope_positions(batch, seq, wild))
    out, err = call(rope, q, k, position_ids=ids, layout=layout)
    if err is not None:
        return
    assert isinstance(ids, torch.Tensor) and ids.dtype in (torch.int64, torch.int32) and int(ids.min(), ) >= 0 if ids.numel() else True
    coords = ids.long().permute(1, 2, 0).double()  # [B, S, 3]
    slots = torch.arange(rope.rotary_dim // 2)
    inv = torch.zeros(3, slots.numel(), dtype=torch.float64)
    inv[torch.tensor(_slot_axes(section, layout_interleaved)), slots] = rope.freqs.inv_freq.double()
    angle = _max_angle(coords, inv)
    for got, x in zip(out, (q, k)):
        ref = _expected_nd(to_bhsd(x, layout), coords, inv, rope.interleaved)
        ref[..., : rope.rotary_dim] *= rope.attention_scaling  # the pass-through channels are not scaled
        assert_close(got, ref if layout == "bhsd" else ref.transpose(1, 2), x, angle)
    if ids.numel() and bool((ids == ids[:1]).all()):  # text: M-RoPE is the 1-D RoPE of the same config
        plain = rotary.RoPE(d, base=args["base"], rotary_dim=args["rotary_dim"], scaling=args["scaling"], interleaved=rope.interleaved)
        want = plain(q, k, position_ids=ids[0].expand(batch, seq), layout=layout)
        for got, w, x in zip(out, want, (q, k)):
            assert float((got.double() - w.double()).abs().max()) <= 2 * _tol(x, angle)


@settings(max_examples=60, deadline=None)
@given(
    model_type=st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llama", None, 3]),
    hidden=st.sampled_from([64, 64, 48, 0, -64, "64", 64.0]),
    heads=st.sampled_from([4, 4, 3, 0]),
    theta=st.sampled_from([1e6, 1e4, 0.0, -1.0, math.nan, "1e6", None]),
    section=st.sampled_from([[2, 3, 3], [2, 3, 3], [4, 2, 2], [3, 3, 3], [2, 3], "233", None, [2.0, 3, 3]]),
    block=st.sampled_from(["rope_scaling", "rope_scaling", "rope_parameters", "text_config"]),
)
def test_mrope_from_hf_config_is_right_or_a_named_error(model_type, hidden, heads, theta, section, block):
    cfg = {"model_type": model_type, "hidden_size": hidden, "num_attention_heads": heads}
    inner = {"type": "mrope", "rope_type": "default", "mrope_section": section}
    if block == "rope_parameters":
        inner = {"rope_type": "default", "mrope_section": section, "rope_theta": theta}
    else:
        cfg["rope_theta"] = theta
    cfg["rope_scaling" if block != "rope_parameters" else "rope_parameters"] = inner
    if block == "text_config":
        cfg = {"model_type": model_type, "text_config": cfg}
    try:
        rope = MRoPE.from_hf_config(cfg)
    except ConfigError as exc:
        assert str(exc)
        return
    except NAMED as exc:
        assert_named(exc)
        return
    assert model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl") and rope.mrope_interleaved is (model_type == "qwen3_vl")
    if model_type != "qwen3_vl":  # Qwen3-VL has transformers' defaults (head_dim 128, [24, 20, 20]) for what is missing
        assert rope.head_dim == hidden // heads and list(rope.mrope_section) == section
    if theta is not None:
        assert rope.freqs.base == theta


# ---- multimodal_positions ---------------------------------------------------------------------


@st.composite
def multimodal_batches(draw):
    """Token types with images / videos whose grids match, and the expected ids (written out here)."""
    merge = draw(st.sampled_from([1, 2]))
    rows, images, videos = [], [], []
    for _ in range(draw(st.integers(1, 2))):
        row = []
        for _ in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from([0, 0, 1, 2]))
            if kind == 0:
                row += [0] * draw(st.integers(1, 3))
                continue
            t, h, w = draw(st.integers(1, 2)), merge * draw(st.integers(1, 2)), merge * draw(st.integers(1, 2))
            (images if kind == 1 else videos).append([t, h, w])
            row += [kind] * (t * (h // merge) * (w // merge))
            row += [0]  # text after each vision run keeps runs apart
        rows.append(row)
    length = max(len(r) for r in rows)
    types = torch.tensor([r + [0] * (length - len(r)) for r in rows], dtype=torch.int64)
    mask = torch.tensor([[1] * len(r) + [0] * (length - len(r)) for r in rows], dtype=torch.int64)
    return types, mask, images, videos, merge


def _expected_positions(types, mask, images, videos, merge):
    """get_rope_index's ids ('grid' rule), written out token by token."""
    grids = {1: list(images), 2: list(videos)}
    out = torch.zeros(3, *types.shape, dtype=torch.int64)
    nxt = []
    for b in range(types.shape[0]):
        i, cur, top = 0, 0, -1
        n = int(mask[b].sum())
        while i < n:
            kind = int(types[b, i])
            if kind == 0:
                out[:, b, i] = cur
                top = max(top, cur)
                cur, i = cur + 1, i + 1
                continue
            t, h, w = grids[kind].pop(0)
            h, w = h // merge, w // merge
            for tt in range(t):
                for y in range(h):
                    for x in range(w):
                        out[:, b, i] = torch.tensor([cur + tt, cur + y, cur + x])
                        top = max(top, cur + tt, cur + y, cur + x)
                        i += 1
            cur += max(h, w)
        nxt.append(top + 1)
    return out, nxt


@settings(max_examples=60, deadline=None)
@given(case=multimodal_batches(), spoil=st.sampled_from([None] * 5 + ["odd_grid", "float_grid", "nan_seconds", "neg_seconds", "huge_tps", "tps_str", "types_3", "types_float", "mask_shape", "merge_0", "extra_grid", "grid_list"]))
def test_multimodal_positions_are_right_or_a_named_error(case, spoil):
    types, mask, images, videos, merge = case
    kwargs = dict(
        image_grid_thw=torch.tensor(images, dtype=torch.int64).reshape(-1, 3) if images else None,
        video_grid_thw=torch.tensor(videos, dtype=torch.int64).reshape(-1, 3) if videos else None,
        spatial_merge_size=merge, attention_mask=mask,
    )  # fmt: skip
    if spoil == "odd_grid" and images and merge == 2:
        kwargs["image_grid_thw"] = kwargs["image_grid_thw"] + torch.tensor([0, 1, 0])  # h not a multiple of the merge
    elif spoil == "float_grid" and images:
        kwargs["image_grid_thw"] = kwargs["image_grid_thw"].float()
    elif spoil == "nan_seconds" and videos:
        kwargs.update(tokens_per_second=2.0, second_per_grid_ts=[math.nan] * len(videos))
    elif spoil == "neg_seconds" and videos:
        kwargs.update(tokens_per_second=2.0, second_per_grid_ts=[-1.0] * len(videos))
    elif spoil == "huge_tps" and videos:
        kwargs.update(tokens_per_second=1e300)
    elif spoil == "tps_str":
        kwargs.update(tokens_per_second="2")
    elif spoil == "types_3" and types.numel():
        types = types.clone()
        types[0, 0] = 3
    elif spoil == "types_float":
        types = types.float()
    elif spoil == "mask_shape":
        kwargs["attention_mask"] = mask[:, :-1]
    elif spoil == "merge_0":
        kwargs["spatial_merge_size"] = 0
    elif spoil == "extra_grid":
        kwargs["image_grid_thw"] = torch.tensor([*images, [1, merge, merge]]).reshape(-1, 3)
    elif spoil == "grid_list":
        kwargs["image_grid_thw"] = images
    mp, err = call(multimodal_positions, types, **kwargs)
    if err is not None:
        return
    spoiled = spoil is not None and (
        (spoil == "odd_grid" and images and merge == 2) or spoil in ("float_grid", "grid_list") and images
        or spoil in ("nan_seconds", "neg_seconds") and videos or spoil == "huge_tps" and any(t > 1 for t, _, _ in videos)
        or spoil == "types_3" and types.numel() or spoil in ("tps_str", "types_float", "mask_shape", "merge_0", "extra_grid")
        and (spoil != "mask_shape" or types.shape[1] > 0)
    )  # fmt: skip
    assert not spoiled, f"spoiled input ({spoil}) was accepted"
    if kwargs.get("tokens_per_second") is not None:
        return  # time-aligned videos: checked in test_mrope.py against transformers
    want, nxt = _expected_positions(types, mask, images, videos, merge)
    assert torch.equal(mp.position_ids, want)
    assert mp.next_position.tolist() == nxt and mp.bound == max(nxt)
    assert mp.rope_deltas[:, 0].tolist() == [n - int(m.sum()) for n, m in zip(nxt, mask)]
    cont = mp.continuation(2)
    assert cont.position_ids[:, :, 0].tolist() == [nxt] * 3
    # the ids drive MRoPE: its tables equal those of the [3, B, S] ids given directly
    rope = MRoPE(16, mrope_section=[2, 3, 3])
    assert torch.equal(rope.tables(mp).cos, rope.tables(mp.position_ids).cos)


@settings(max_examples=40, deadline=None)
@given(
    head_dim=st.sampled_from([8, 8, 6, 0, 7, "8"]),
    floor_scale=st.sampled_from([8192, 4, 0, 4.0]),
    positions=st.one_of(
        st.lists(st.integers(0, 2**40), min_size=0, max_size=4).map(torch.tensor),
        st.lists(st.integers(-3, 20), min_size=1, max_size=4).map(torch.tensor),
        st.just(torch.tensor([1.0, 2.0])),
        st.just(torch.arange(6).reshape(2, 3)),
        st.just(torch.zeros(2, 2, 2, dtype=torch.int64)),
    ),
)
def test_nope_temperature_tables_are_right_or_a_named_error(head_dim, floor_scale, positions):
    module, err = call(rotary.variants.NoPETemperature, head_dim, floor_scale=floor_scale)
    if err is not None:
        return
    tables, err = call(module.tables, positions)
    if err is not None:
        return
    tau = torch.tensor([1.0 + 0.1 * math.log1p((n + 1) // floor_scale) for n in positions.reshape(-1).tolist()], dtype=torch.float64).reshape(positions.shape)
    assert torch.allclose(tables.cos.double(), tau.unsqueeze(-1).expand(*positions.shape, head_dim), rtol=2**-23, atol=0)
    assert not tables.sin.any() and bool((tables.k_cos == 1).all()) and not tables.k_sin.any()


# ================================================================================================
# XPos


def _xpos_reference(x_bhsd, pos, rope, key):
    """rotate_complex at ``pos`` times ζ_i^(±(n - c)/γ) on both channels of pair i, float64."""
    r = rope.rotary_dim
    i = torch.arange(r // 2, dtype=torch.float64)
    zeta = (2 * i + 0.4 * r) / (1.4 * r)
    out = torch.empty(x_bhsd.shape, dtype=torch.float64)
    for b in range(x_bhsd.shape[0]):
        p = pos if pos.dim() == 1 else pos[min(b, pos.shape[0] - 1)]
        rot = reference.rotate_complex(x_bhsd[b], p, rope.inv_freq.double(), interleaved=rope.interleaved)
        expo = (p.double() - rope.center) / rope.scale_base
        scale = zeta[None, :] ** (-expo if key else expo)[:, None]  # [S, r/2]
        scale = scale.repeat_interleave(2, -1) if rope.interleaved else torch.cat((scale, scale), -1)
        rot[..., :r] = rot[..., :r] * scale
        out[b] = rot
    return out


XPOS_BAD = {
    "head_dim": [6, 0, 7, "8", 8.0, 2**40],
    "scale_base": [1e300, 1e-300, 1e-3, 0.0, -1.0, math.nan, math.inf, "512", True],
    "rotary_dim": [4, 3, 0, 10, 4.0],
    "interleaved": ["no", 0],
    "max_position": [64, 0, -1, 2**40, 64.0],
    "center": [0, 30, 10**9, -1, 3.5, True, "0"],
    "base": [1.0, 1e-300, 1e300, math.nan, "10000"],
}


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_xpos_is_right_or_a_named_error(data):
    wild = data.draw(WILD)
    valid = dict(
        head_dim=data.draw(st.sampled_from([8, 16])), scale_base=data.draw(st.sampled_from([512.0, 8.0])),
        interleaved=data.draw(st.booleans()), center=data.draw(st.sampled_from([None, None, 0, 20])),
    )  # fmt: skip
    args = spoiled(data.draw, valid, XPOS_BAD) if wild else valid
    head_dim = args.pop("head_dim")
    rope, err = call(XPos, head_dim, **args)
    if err is not None:
        return
    assert 0 <= rope.center <= rope.max_distance
    batch, seq = data.draw(st.integers(1, 2)), data.draw(st.integers(0, 4))
    layout = data.draw(st.sampled_from(["bhsd", "bshd"] + ["bhds"] * wild))
    dtype = data.draw(st.sampled_from(FLOATS))
    shape = [batch, 2, seq, head_dim] if layout != "bshd" else [batch, seq, 2, head_dim]
    q = data.draw(st.one_of(tensors(shape=shape, dtype=dtype), *[tensors(max_size=3)] * wild))
    k = data.draw(tensors(shape=shape, dtype=dtype))
    pos = data.draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(0, 60), min_size=seq, max_size=seq).map(torch.tensor),
            st.just(torch.arange(seq).expand(batch, seq)),
            *[st.lists(st.integers(-2, 2**41), min_size=seq, max_size=seq).map(torch.tensor)] * wild,
            *[st.just(torch.arange(seq, dtype=torch.float32))] * wild,
        )
    )
    offset = data.draw(st.sampled_from([0, 7] + [-1, 2**40, 1.5, True] * wild))
    out, err = call(rope, q, k, position_ids=pos, offset=offset, layout=layout)
    if err is not None:
        return
    assert pos is None or offset == 0
    if pos is None:
        pos = torch.arange(offset, offset + seq)
    for got, x, key in zip(out, (q, k), (False, True)):
        ref = _xpos_reference(to_bhsd(x, layout), pos, rope, key)
        ref = ref if layout == "bhsd" else ref.transpose(1, 2)
        assert bool(torch.isfinite(ref).all())
        # the scales reach 2^±126: compare relative to the reference's magnitude per pair of channels
        rel = (got.double() - ref).abs() / ref.abs().amax(dim=-1, keepdim=True).clamp_min(1e-300)
        angle = float(pos.abs().max()) if pos.numel() else 0.0
        bound = TOL[x.dtype] * 4 + 8 * EPS64 * angle
        assert not rel.numel() or float(rel.max()) <= bound * max(1.0, float(x.double().abs().max()))


# ================================================================================================
# NoPE helpers


@settings(max_examples=80, deadline=None)
@given(
    positions=st.one_of(
        st.lists(st.integers(0, 2**40), min_size=0, max_size=5).map(torch.tensor),
        st.lists(st.integers(-20000, 2**62), min_size=1, max_size=4).map(torch.tensor),
        st.lists(st.integers(0, 100), min_size=1, max_size=4).map(lambda v: torch.tensor(v, dtype=torch.int32)),
        st.just(torch.tensor([1.5, 8191.0])),
        st.just(torch.tensor([True, False])),
        st.just(torch.tensor([2**63 - 1])),
        st.just([0, 8191]),
        st.just(8191),
    ),
    floor_scale=st.sampled_from([8192, 8192, 1, 3, 0, -8192, 8192.0, True, "8192"]),
    attn_scale=st.sampled_from([0.1, 0.1, 0.0, 1.0, 1e300, -0.1, math.nan, math.inf, True, "0.1"]),
)
def test_nope_temperature_is_right_or_a_named_error(positions, floor_scale, attn_scale):
    tau, err = call(nope_temperature, positions, floor_scale=floor_scale, attn_scale=attn_scale)
    if err is not None:
        return
    assert isinstance(positions, torch.Tensor) and not positions.is_floating_point() and positions.dtype != torch.bool
    assert tau.dtype == torch.float64 and tau.shape == positions.shape and bool(torch.isfinite(tau).all())
    for n, t in zip(positions.tolist(), tau.tolist()):
        assert n >= 0
        want = 1.0 + attn_scale * math.log1p((n + 1) // floor_scale)
        assert abs(t - want) <= 4 * EPS64 * abs(want)


@settings(max_examples=80, deadline=None)
@given(
    flags=st.one_of(
        st.none(),
        st.lists(st.sampled_from([0, 1]), min_size=0, max_size=6),
        st.lists(st.sampled_from([0, 1, 1, True, 2, -1, 0.0, 1.0, "1", None]), min_size=1, max_size=5),
        st.sampled_from(["1101", 1, (1, 0), torch.tensor([1, 0]), {0: 1}]),
    ),
    num_layers=st.sampled_from([0, 1, 3, 4, 6, -1, 2.0, True, "4", None]),
    interval=st.sampled_from([4, 4, 1, 2, 0, -4, 4.0, True, "4"]),
)
def test_nope_layer_helpers_are_right_or_a_named_error(flags, num_layers, interval):
    got, err = call(rope_layer_flags, flags, num_layers)
    if err is None:
        assert isinstance(num_layers, int) and not isinstance(num_layers, bool) and num_layers >= 0
        want = [True] * num_layers if flags is None else [int(v) == 1 for v in flags]
        assert got == want and len(got) == num_layers
        if flags is not None:
            assert all(type(v) is int and v in (0, 1) for v in flags), f"flags {flags!r} accepted"
    layers, err = call(default_no_rope_layers, num_layers, interval)
    if err is None:
        assert layers == [0 if (i + 1) % interval == 0 else 1 for i in range(num_layers)]
        assert rope_layer_flags(layers, num_layers) == [v == 1 for v in layers]


# ================================================================================================
# RoPE(learnable_frequencies=True)


@settings(max_examples=60, deadline=None)
@given(
    head_dim=st.sampled_from([4, 8, 8, 6]),
    learnable=st.sampled_from([True, True, True, "true", 1]),
    scaling=st.sampled_from([None, None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}]),
    interleaved=st.booleans(),
    alpha=st.sampled_from([0.0, 0.5, -3.0, "random"]),
    data=st.data(),
)
def test_learnable_frequencies_are_right_or_a_named_error(head_dim, learnable, scaling, interleaved, alpha, data):
    rope, err = call(rotary.RoPE, head_dim, base=100.0, scaling=scaling, interleaved=interleaved, learnable_frequencies=learnable)
    if err is not None:
        return
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    with torch.no_grad():
        if alpha == "random":
            rope.log_frequency_scale.copy_(torch.randn(head_dim // 2, generator=g))
        else:
            rope.log_frequency_scale.fill_(alpha)
    dtype = data.draw(st.sampled_from(FLOATS))
    seq = data.draw(st.integers(0, 5))
    layout = data.draw(st.sampled_from(["bhsd", "bshd"]))
    shape = [2, 2, seq, head_dim] if layout == "bhsd" else [2, seq, 2, head_dim]
    q = data.draw(tensors(shape=shape, dtype=dtype))
    k = data.draw(tensors(shape=shape, dtype=dtype))
    pos = data.draw(st.sampled_from([None, "ids", "big"]))
    ids = torch.arange(seq) if pos is None else torch.randint(0, 50 if pos == "ids" else 2**20, (seq,), generator=g)
    out, err = call(rope, q, k, position_ids=None if pos is None else ids, layout=layout)
    assert err is None, err
    inv64 = rope.original_freqs.inv_freq.double() * rope.log_frequency_scale.detach().double().exp()
    angle = float(ids.max()) * float(inv64.max()) if seq else 0.0
    for got, x in zip(out, (q, k)):
        xb = to_bhsd(x, layout).double()
        ref = torch.stack([reference.rotate_complex(xb[b], ids, inv64, interleaved=interleaved) for b in range(2)])
        # the learned frequency θ·exp(α) may be rounded to fp32 before the float64 angles: angle · 2^-23 more
        assert_close(got, to_bhsd(ref, layout), x, angle * 2**-23 / EPS64 / 8)
    # the gradient reaches α and equals the float64 reference's (rotate_complex is differentiable)
    if dtype in (torch.float32, torch.float64) and seq and pos != "big":
        qg = q.detach().double() if dtype == torch.float64 else q.detach()
        w = torch.randn(shape, generator=g, dtype=torch.float64)
        rope.zero_grad()
        (rope.rotate(qg, position_ids=ids, layout=layout).double() * w).sum().backward()
        a64 = rope.log_frequency_scale.detach().double().requires_grad_()
        f64 = rope.original_freqs.inv_freq.double() * a64.exp()
        xb = to_bhsd(qg, layout).double()
        ref = torch.stack([reference.rotate_complex(xb[b], ids, f64, interleaved=interleaved) for b in range(2)])
        (to_bhsd(ref, layout) * w).sum().backward()
        got_g, want_g = rope.log_frequency_scale.grad.double(), a64.grad
        assert float((got_g - want_g).abs().max()) <= 1e-3 * max(1.0, float(want_g.abs().max()))
