"""Compiled equals eager, gradients included, for every public rotation entry point.

Each case runs eagerly and under ``torch.compile`` (AOT autograd with the eager backend, where
functionalization and the compiled autograd graph live; Inductor for a subset), with ``fullgraph=True``
and ``dynamic`` False and True, in place and out of place, on views (slices of a packed qkv tensor,
transposed and strided tensors) and contiguous tensors. Forward outputs and the gradients of every
input and parameter must equal eager's bit for bit (the same kernels run in both), and, for the
rotations, eager's must match a float64 oracle built from :mod:`rotary.reference` (forward and
gradient, by autograd through the oracle), so the compiled ones do too.

``fullgraph=False`` is compiled only where it differs: where ``fullgraph=True`` succeeds, dynamo traces
the very same graph without it (``fullgraph`` only turns a graph break into an error), so compiling both
would run the same check twice. The cases refused by name under ``fullgraph=True`` (in place with learned
tables) are also compiled with ``fullgraph=False``, where dynamo runs the refused frame eagerly.

Compiled in-place rotation of packed-qkv views once gave gradients off by up to 5.7 (issue 24):
``test_packed_qkv_views_in_place_compiled_gradient_is_the_formula`` is that report's case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

import rotary
from covering import full_product
from rotary import reference
from rotary.models import Decoder, DecoderConfig
from rotary.nn import RotaryAttention

B, S, H, HK, D = 2, 6, 2, 1, 16
T = 12  # table rows for the position-indexed forms

ROPE = rotary.RoPE(D)
ROPE_I = rotary.RoPE(D, interleaved=True, rotary_dim=12)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def oracle(x: torch.Tensor, positions: torch.Tensor, rope: rotary.RoPE, layout: str) -> torch.Tensor:
    """float64 rotation of ``x`` (``[B, H, S, D]`` / ``[B, S, H, D]``) at ``positions`` ``[S]`` or ``[B, S]``."""
    x = x.double()
    x = x.transpose(1, 2) if layout == "bshd" else x  # [B, H, S, D]
    positions = positions.expand(x.shape[0], x.shape[2])
    out = torch.stack(
        [
            reference.rotate_complex(x[b], positions[b], rope.inv_freq, interleaved=rope.interleaved)
            for b in range(x.shape[0])
        ]
    )
    return out.transpose(1, 2) if layout == "bshd" else out


def packed_oracle(x: torch.Tensor, positions: torch.Tensor, rope: rotary.RoPE) -> torch.Tensor:
    """``oracle`` for packed ``[T, H, D]`` with per-token ``positions`` ``[T]``."""
    return oracle(x.unsqueeze(0), positions, rope, "bshd")[0]


@dataclass
class Case:
    """``run(*inputs, inplace=...)`` -> outputs; ``inputs()`` makes fresh non-leaf inputs from ``leaves``.

    ``expected(*leaves)``: the float64 oracle's outputs (``None``: compared with eager only);
    ``modules``: whose parameters' gradients are compared too; ``learned_tables``: the tables require
    grad, and an in-place rotation under ``torch.compile`` is refused by name (Inductor drops the copy
    of the input the tables' gradient needs; see ``test_inductor_clone_of_a_mutated_input``).
    """

    name: str
    shapes: list[tuple[int, ...]]
    run: Callable[..., tuple[torch.Tensor, ...]]
    expected: Callable[..., tuple[torch.Tensor, ...]] | None = None
    inplace: tuple[bool, ...] = (False, True)
    modules: list[torch.nn.Module] = field(default_factory=list)
    learned_tables: bool = False
    inputs: Callable[..., tuple[torch.Tensor, ...]] = lambda *leaves: tuple(t * 1 for t in leaves)


def _rope_pair(q, k, *, inplace):
    return ROPE(q, k, inplace=inplace)


def _qkv_views(x, *, inplace):
    # q and k as slices of one packed projection output [B, S, 3, H, D]
    q, k = ROPE(x[:, :, 0], x[:, :, 1], layout="bshd", inplace=inplace)
    return (x,) if inplace else (torch.stack((q, k, x[:, :, 2]), dim=2),)


def _qkv_views_expected(x):
    q, k = (oracle(x[:, :, i], torch.arange(S), ROPE, "bshd") for i in (0, 1))
    return (torch.stack((q, k, x[:, :, 2].double()), dim=2),)


IDS = torch.tensor([[3, 0, 7, 1, 1, 11], [5, 6, 7, 8, 9, 10]])


def _strided_ids(q, k, *, inplace):
    # [B, H, S, D] views of [B, S, H, D] storage, per-batch position ids, interleaved, partial
    return ROPE_I(q.transpose(1, 2), k.transpose(1, 2), position_ids=IDS, inplace=inplace)


def _offset(q, k, *, inplace):
    return ROPE(q, k, offset=3, layout="bshd", inplace=inplace)


def _tables(q, k, *, inplace):
    tables = ROPE.tables(torch.arange(S))
    return tuple(rotary.rotate([q, k], tables, inplace=inplace, kinds=("q", "k")))


def _cos_sin(rope, n):
    return rope.cos_sin(torch.arange(n))


def _apply_strided(x, *, inplace):
    cos, sin = _cos_sin(ROPE, S)
    view = x[:, :, ::2]  # [B, S, H, D] every other head: strided
    out = rotary.apply_rotary(view, cos, sin, layout="bshd", inplace=inplace)
    return (x,) if inplace else (torch.stack((out, x[:, :, 1::2]), dim=3).flatten(2, 3),)


def _apply_strided_expected(x):
    rotated = oracle(x[:, :, ::2], torch.arange(S), ROPE, "bshd")
    out = x.double().clone()
    out[:, :, ::2] = rotated
    return (out,)


def _apply_ids(x, *, inplace):
    cos, sin = _cos_sin(ROPE_I, T)
    return (rotary.apply_rotary(x, cos, sin, interleaved=True, position_ids=IDS, inplace=inplace),)


OFFSETS = torch.tensor([2, 5])


def _apply_offsets(x, *, inplace):
    cos, sin = _cos_sin(ROPE, T)
    return (rotary.apply_rotary(x, cos, sin, layout="bshd", seqlen_offsets=OFFSETS, inplace=inplace),)


def _offset_ids() -> torch.Tensor:
    return OFFSETS[:, None] + torch.arange(S)


CU_SEQLENS = torch.tensor([0, 4, 9])
PACKED_POSITIONS = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4])


def _apply_packed(x, *, inplace):
    cos, sin = _cos_sin(ROPE, T)
    return (rotary.apply_rotary(x, cos, sin, cu_seqlens=CU_SEQLENS, max_seqlen=5, inplace=inplace),)


def _qkv_(x, *, inplace):
    cos, sin = _cos_sin(ROPE, S)
    return (rotary.apply_rotary_qkv_(x, cos, sin),)


def _qkv_gqa_(x, *, inplace):
    # [B, S, Hq + 2 * Hk, D] with Hq = 2, Hk = 1, offsets per sequence
    cos, sin = _cos_sin(ROPE, T)
    return (rotary.apply_rotary_qkv_(x, cos, sin, num_heads_q=2, seqlen_offsets=OFFSETS),)


def _qkv_gqa_expected(x):
    positions = _offset_ids()
    q, k = oracle(x[:, :, :2], positions, ROPE, "bshd"), oracle(x[:, :, 2:3], positions, ROPE, "bshd")
    return (torch.cat((q, k, x[:, :, 3:].double()), dim=2),)


def _qkv_packed_(x, *, inplace):
    cos, sin = _cos_sin(ROPE, T)
    return (rotary.apply_rotary_qkv_(x, cos, sin, cu_seqlens=CU_SEQLENS, max_seqlen=5),)


def _qkv_packed_expected(x):
    q, k = (packed_oracle(x[:, i], PACKED_POSITIONS, ROPE) for i in (0, 1))
    return (torch.stack((q, k, x[:, 2].double()), dim=1),)


def _kv_(x, *, inplace):
    cos, sin = _cos_sin(ROPE, S)
    return (rotary.apply_rotary_kv_(x, cos, sin),)


def _kv_expected(x):
    k = oracle(x[:, :, 0], torch.arange(S), ROPE, "bshd")
    return (torch.stack((k, x[:, :, 1].double()), dim=2),)


LEARNABLE = rotary.RoPE(D, learnable_frequencies=True)
XPOS = rotary.XPos(D)
MROPE = rotary.MRoPE(D, mrope_section=[2, 3, 3])
AXIAL = rotary.AxialRoPE(D)
MIXED = rotary.RoPEMixed(D, num_heads=H, generator=torch.Generator().manual_seed(0))
MROPE_IDS = torch.stack(
    [torch.arange(S).expand(B, S), torch.arange(S).flip(0).expand(B, S), torch.arange(S).expand(B, S) % 3]
)


def _learnable(q, k, *, inplace):
    return tuple(LEARNABLE(q, k, inplace=inplace))


def _xpos(q, k, *, inplace):
    return tuple(XPOS(q, k))


def _mrope(q, k, *, inplace):
    return tuple(MROPE(q, k, position_ids=MROPE_IDS))


def _axial(q, k, *, inplace):
    return tuple(AXIAL(q, k, AXIAL.grid(2, 3), inplace=inplace))


def _mixed(q, k, *, inplace):
    return tuple(MIXED(q, k, MIXED.grid(2, 3), inplace=inplace))


# eval mode: training differs only in passing the (zero) dropout to SDPA, a float that dynamic=True makes symbolic
# and that dynamo then specializes by tracing again from the start; the Decoder's layers, in training mode, do that
ATTENTION = RotaryAttention(2 * D, 2, num_kv_heads=1, causal=True, inplace_rope=False).eval()
ATTENTION_INPLACE = RotaryAttention(2 * D, 2, num_kv_heads=1, causal=True, inplace_rope=True).eval()
ATTENTION_INPLACE.load_state_dict(ATTENTION.state_dict())
# one layer: its tables come from the model's forward, as every layer's do, and a second layer runs the same code
# (dynamo and AOT autograd trace each layer: a second doubled the most expensive compile here)
DECODER = Decoder(
    DecoderConfig(vocab_size=32, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, max_position=64)
)


def _attention(h, *, inplace):
    return ((ATTENTION_INPLACE if inplace else ATTENTION)(h),)


TOKENS = torch.randint(0, 32, (B, S), generator=torch.Generator().manual_seed(3))


def _decoder(h, *, inplace):
    # the embedding is the decoder's; h only carries a gradient into the logits
    return (DECODER(TOKENS) + h.sum(),)


QK = [(B, H, S, D), (B, HK, S, D)]
QK_BSHD = [(B, S, H, D), (B, S, HK, D)]

CASES = [
    Case("rope(q, k)", QK, _rope_pair, lambda q, k: tuple(oracle(t, torch.arange(S), ROPE, "bhsd") for t in (q, k))),
    Case("rope on views of packed qkv", [(B, S, 3, H, D)], _qkv_views, _qkv_views_expected),
    Case(
        "rope strided, position_ids, interleaved partial",
        QK_BSHD,
        _strided_ids,
        lambda q, k: tuple(oracle(t.transpose(1, 2), IDS, ROPE_I, "bhsd") for t in (q, k)),
    ),
    Case(
        "rope offset",
        QK_BSHD,
        _offset,
        lambda q, k: tuple(oracle(t, torch.arange(3, 3 + S), ROPE, "bshd") for t in (q, k)),
    ),
    Case("rotate(tables)", QK, _tables, lambda q, k: tuple(oracle(t, torch.arange(S), ROPE, "bhsd") for t in (q, k))),
    Case("apply_rotary strided view", [(B, S, 2 * H, D)], _apply_strided, _apply_strided_expected),
    Case("apply_rotary position_ids", [(B, H, S, D)], _apply_ids, lambda x: (oracle(x, IDS, ROPE_I, "bhsd"),)),
    Case(
        "apply_rotary seqlen_offsets",
        [(B, S, H, D)],
        _apply_offsets,
        lambda x: (oracle(x, _offset_ids(), ROPE, "bshd"),),
    ),
    Case("apply_rotary cu_seqlens", [(9, H, D)], _apply_packed, lambda x: (packed_oracle(x, PACKED_POSITIONS, ROPE),)),
    Case("apply_rotary_qkv_ packed 5-D", [(B, S, 3, H, D)], _qkv_, _qkv_views_expected, inplace=(True,)),
    Case("apply_rotary_qkv_ GQA 4-D, seqlen_offsets", [(B, S, 4, D)], _qkv_gqa_, _qkv_gqa_expected, inplace=(True,)),
    Case("apply_rotary_qkv_ cu_seqlens", [(9, 3, H, D)], _qkv_packed_, _qkv_packed_expected, inplace=(True,)),
    Case("apply_rotary_kv_", [(B, S, 2, H, D)], _kv_, _kv_expected, inplace=(True,)),
    Case("learnable frequencies", QK, _learnable, modules=[LEARNABLE], learned_tables=True),
    Case("XPos", QK, _xpos, inplace=(False,)),
    Case("MRoPE", QK, _mrope, inplace=(False,)),
    Case("AxialRoPE", QK, _axial),
    Case("RoPEMixed (learned frequencies)", [(B, H, S, D), (B, H, S, D)], _mixed, modules=[MIXED], learned_tables=True),
    Case("RotaryAttention", [(B, S, 2 * D)], _attention, modules=[ATTENTION], inplace=(False,)),
    Case("RotaryAttention, rope in place", [(B, S, 2 * D)], _attention, modules=[ATTENTION_INPLACE], inplace=(True,)),
    Case("Decoder", [(1,)], _decoder, modules=[DECODER], inplace=(False,)),
]


def _outputs_and_grads(case: Case, inplace: bool, fn: Callable[..., tuple[torch.Tensor, ...]]):
    leaves = [_randn(*shape, seed=i).requires_grad_() for i, shape in enumerate(case.shapes)]
    params = [p for m in case.modules for p in m.parameters() if p.requires_grad]
    outs = fn(*case.inputs(*leaves), inplace=inplace)
    loss = sum((o.double() * _randn(*o.shape, seed=10 + i).double()).sum() for i, o in enumerate(outs))
    grads = torch.autograd.grad(loss, [*leaves, *params], allow_unused=True)
    return leaves, [o.detach() for o in outs], grads


def _compiled(run: Callable, backend: str, fullgraph: bool, dynamic: bool) -> Callable:
    torch._dynamo.reset()
    return torch.compile(run, backend=backend, fullgraph=fullgraph, dynamic=dynamic)


def _modes(index: int, case: Case) -> list[tuple[bool, bool]]:
    """(inplace, dynamic) for ``case``: each of its in-place modes, and static and dynamic shapes, at least once.

    A case with both in-place modes takes two of the four pairs, alternating from one case to the next, so that
    every (inplace, dynamic) pair is compiled for many cases: a covering of the three factors two at a time
    (tests/covering.py), half the compiles of their product. ``ROTARY_FULL_PRODUCT=1`` compiles all four.
    """
    if full_product() or len(case.inplace) == 1:
        return [(i, d) for i in case.inplace for d in (False, True)]
    return [(True, index % 2 == 0), (False, index % 2 == 1)]


PARAMS = [
    pytest.param(
        case, inplace, dynamic, id=f"{case.name}-{'inplace' if inplace else 'out'}-{'dynamic' if dynamic else 'static'}"
    )
    for index, case in enumerate(CASES)
    for inplace, dynamic in _modes(index, case)
]


def _assert_equal(got_outs, got_grads, eager_outs, eager_grads, n_inputs: int) -> None:
    assert len(got_outs) == len(eager_outs)
    for got, want in zip(got_outs, eager_outs):
        assert torch.equal(got, want), "forward"
    for i, (got, want) in enumerate(zip(got_grads, eager_grads)):
        assert (got is None) == (want is None), f"gradient {i}"
        if got is not None:
            assert torch.equal(got, want), f"gradient {i} (of {n_inputs} inputs, then parameters)"


@pytest.mark.parametrize(("case", "inplace", "dynamic"), PARAMS)
def test_compiled_equals_eager_forward_and_gradients(case, inplace, dynamic):
    _, eager_outs, eager_grads = _outputs_and_grads(case, inplace, case.run)
    if inplace and case.learned_tables:
        # refused by name under fullgraph; without it, dynamo runs the refused frame eagerly (compared below)
        with pytest.raises((ValueError, RuntimeError), match="not supported under torch.compile.*Pass inplace=False"):
            _outputs_and_grads(case, inplace, _compiled(case.run, "aot_eager", True, dynamic))
        compiled = _compiled(case.run, "aot_eager", False, dynamic)
    else:
        compiled = _compiled(case.run, "aot_eager", True, dynamic)
    _, outs, grads = _outputs_and_grads(case, inplace, compiled)
    _assert_equal(outs, grads, eager_outs, eager_grads, len(case.shapes))


ORACLE_PARAMS = [
    pytest.param(case, inplace, id=f"{case.name}-{'inplace' if inplace else 'out'}")
    for case in CASES
    if case.expected is not None
    for inplace in case.inplace
]


@pytest.mark.parametrize(("case", "inplace"), ORACLE_PARAMS)
def test_eager_and_compiled_match_the_float64_oracle(case, inplace):
    # forward and gradient against autograd through rotary.reference's complex form, in float64. Eager's
    # are checked here; the compiled ones (fullgraph, static and dynamic shapes) equal eager's bit for bit
    # in test_compiled_equals_eager_forward_and_gradients, for these same inputs, so they match it too
    assert not (inplace and case.learned_tables)  # no oracle case is refused under compile
    leaves = [_randn(*shape, seed=i).double().requires_grad_() for i, shape in enumerate(case.shapes)]
    want = case.expected(*leaves)
    loss = sum((o * _randn(*o.shape, seed=10 + i).double()).sum() for i, o in enumerate(want))
    want_grads = torch.autograd.grad(loss, leaves)
    _, outs, grads = _outputs_and_grads(case, inplace, case.run)
    for got, w in zip(outs, want):
        torch.testing.assert_close(got.double(), w.detach(), rtol=2e-6, atol=2e-6)
    for got, w in zip(grads, want_grads):
        torch.testing.assert_close(got.double(), w, rtol=2e-6, atol=2e-6)


INDUCTOR = ["rope on views of packed qkv", "apply_rotary_qkv_ packed 5-D", "rope(q, k)", "learnable frequencies"]


@pytest.mark.parametrize(
    ("case", "inplace"),
    [pytest.param(c, i, id=f"{c.name}-{i}") for c in CASES if c.name in INDUCTOR for i in c.inplace],
)
def test_inductor_equals_eager(case, inplace):
    if inplace and case.learned_tables:
        with pytest.raises((ValueError, RuntimeError), match="not supported under torch.compile"):
            _outputs_and_grads(case, inplace, _compiled(case.run, "inductor", True, False))
        return
    _, eager_outs, eager_grads = _outputs_and_grads(case, inplace, case.run)
    _, outs, grads = _outputs_and_grads(case, inplace, _compiled(case.run, "inductor", True, False))
    for got, want in zip([*outs, *grads], [*eager_outs, *eager_grads]):
        # Inductor may fuse the elementwise ops around the kernel (the `* 1` making the inputs)
        torch.testing.assert_close(got, want, rtol=1.3e-6, atol=1e-5)


def test_packed_qkv_views_in_place_compiled_gradient_is_the_formula():
    # issue 24's report: a compiled in-place rotation of qkv[:, :, 0] and qkv[:, :, 1] returned
    # the incoming gradient unrotated for those slices
    qkv = torch.randn(2, 16, 3, 2, 32, requires_grad=True)
    cos, sin = rotary.RoPE(32).cos_sin(torch.arange(16))
    g = torch.randn(2, 16, 3, 2, 32)

    def f(x):
        rotary.apply_rotary(x[:, :, 0], cos, sin, layout="bshd", inplace=True)
        rotary.apply_rotary(x[:, :, 1], cos, sin, layout="bshd", inplace=True)
        return x

    torch._dynamo.reset()
    out = torch.compile(f)(qkv.clone())
    out.backward(g)
    back = [rotary.apply_rotary(g[:, :, i], cos, -sin, layout="bshd") for i in (0, 1)]
    want = torch.stack((*back, g[:, :, 2]), dim=2)
    torch.testing.assert_close(qkv.grad, want, rtol=1.3e-6, atol=1e-5)


def test_inductor_clone_of_a_mutated_input():
    # why in place with learned tables is refused under compile: in plain torch, Inductor (2.13) drops
    # the copy of a graph input that is saved for the backward and then overwritten through a view,
    # and the gradient that needs the copy comes out wrong. If this starts failing, PyTorch fixed it:
    # lift the refusal in rotary.kernels.dispatch.rotate
    def f(x, w):
        v = x.transpose(1, 2)
        saved = v.clone(memory_format=torch.contiguous_format)
        v.copy_(saved * w)
        return x

    x, w, c = _randn(2, 3, 4, seed=0).requires_grad_(), _randn(3, seed=1).requires_grad_(), _randn(2, 3, 4, seed=2)
    grads = []
    for fn in (f, _compiled(f, "inductor", False, False)):
        y = fn(x * 1, w * 1)
        grads.append(torch.autograd.grad((y * c).sum(), w)[0])
    assert not torch.allclose(grads[0], grads[1])


@pytest.mark.parametrize("call", ["rope", "decoder"])
def test_a_fresh_module_is_traced_once(call: str) -> None:
    """The first call of a compiled RoPE (or a model holding one) traces once and later calls reuse the
    graph: the per-device copy of inv_freq exists before tracing, so no trace changes what it guards on
    (it used to be made during the first trace, and the second call traced again)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    if call == "rope":
        rope = rotary.RoPE(D)
        fn = torch.compile(lambda q, k, ids: rope(q, k, position_ids=ids), backend=counter, fullgraph=True)
        args = (_randn(B, H, S, D, seed=1), _randn(B, HK, S, D, seed=2), torch.arange(S).expand(B, S))
    else:
        model = Decoder(DecoderConfig(vocab_size=32, hidden_size=32, num_layers=1, num_heads=2)).eval()
        fn = torch.compile(model, backend=counter, fullgraph=True)
        args = (torch.randint(32, (B, S), generator=torch.Generator().manual_seed(3)),)
    with torch.no_grad():
        first = fn(*args)
        for _ in range(3):
            again = fn(*args)
    assert counter.frame_count == 1
    torch.testing.assert_close(again, first, rtol=0, atol=0)


@pytest.mark.parametrize("form", ["offset", "position_ids"])
def test_a_decoding_loop_compiles_whole_with_dynamic_shapes(form: str) -> None:
    """``torch.compile(..., dynamic=True, fullgraph=True)`` of ``rope(q, k, offset=off)`` (the offset a
    symbolic int: no message is formatted unless a check fails) and of ``rope(q, k, position_ids=ids)``
    equals eager over varying lengths and offsets, past the table cache too, and for negative ids (the
    rotation by the negative angle, compiled and eager)."""
    torch._dynamo.reset()
    rope = rotary.RoPE(D, max_position=16)
    if form == "offset":
        fn = torch.compile(lambda q, k, off: rope(q, k, offset=off), backend="aot_eager", dynamic=True, fullgraph=True)
    else:
        fn = torch.compile(
            lambda q, k, ids: rope(q, k, position_ids=ids), backend="aot_eager", dynamic=True, fullgraph=True
        )
    for seq_len, offset in ((3, 5), (4, 9), (2, 40), (5, 7)) + (((2, -9),) if form == "position_ids" else ()):
        q, k = _randn(B, H, seq_len, D, seed=seq_len), _randn(B, HK, seq_len, D, seed=offset)
        if form == "offset":
            got, want = fn(q, k, offset), rope(q, k, offset=offset)
        else:
            ids = torch.arange(offset, offset + seq_len).expand(B, seq_len)
            got, want = fn(q, k, ids), rope(q, k, position_ids=ids)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
