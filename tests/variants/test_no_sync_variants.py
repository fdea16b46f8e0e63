"""The no-synchronisation rule for the variants, the pairing helpers and the score biases.

Every per-call entry point of XPos, MRoPE, AxialRoPE, RoPEMixed, NoPETemperature, ``to_half`` /
``to_interleaved`` and ``rotary.nn.position`` runs as on an accelerator (``helpers.accelerator_rules``:
no tensor value read on the host) and gives the CPU path's result bit for bit. Each check that reads
values on the CPU reads nothing there: bad input is the caller's contract (documented; a NaN, inf or 0
result, nothing raised and no flag to poll), while the plain CPU path still raises at once. A second call copies
no constant host-to-device: run on the meta device (another device, without values), every tensor
that crosses from the CPU is recorded.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import rotary
from helpers import accelerator_rules
from rotary.hf.patching import _apply_deepseek_interleave
from rotary.nn.position import ALiBi, LearnedPositionEmbedding, RelativePositionBias, SinusoidalPositionEmbedding
from rotary.positions import Positions
from rotary.variants import AxialRoPE, MRoPE, NoPETemperature, RoPEMixed, XPos, multimodal_positions
from rotary.variants.axial import Coordinates
from rotary.variants.nope import nope_temperature

B, S, HQ, HK, D = 2, 6, 4, 2, 16

XPOS = XPos(D)
XPOS_I = XPos(D, interleaved=True, rotary_dim=12, scale_base=64.0)
MROPE = MRoPE(D, mrope_section=[2, 3, 3], base=1e4)
MROPE_I = MRoPE(
    D, mrope_section=[4, 2, 2], mrope_interleaved=True, interleaved=True, scaling={"rope_type": "linear", "factor": 2.0}
)
AXIAL = AxialRoPE(D)
DINO = AxialRoPE.preset("dinov3", D, shift_coords=0.5, jitter_coords=1.5, rescale_coords=2.0)
FLUX = AxialRoPE.preset("flux")
MIXED = RoPEMixed(D, HQ, generator=torch.Generator().manual_seed(0), prefix_tokens=1)
NOPE = NoPETemperature(D, floor_scale=4)
LEARNED = LearnedPositionEmbedding(16, 8)
ALIBI = ALiBi(HQ)
RELATIVE = RelativePositionBias(HQ, max_distance=3)
SINUSOIDAL = SinusoidalPositionEmbedding(8)
with torch.no_grad():
    RELATIVE.bias.copy_(torch.randn(RELATIVE.bias.shape, generator=torch.Generator().manual_seed(1)))

IDS = torch.tensor([[3, 0, 7, 1, 1, 11], [5, 6, 7, 8, 9, 10]])
TYPES = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
MULTIMODAL = multimodal_positions(TYPES, image_grid_thw=torch.tensor([[1, 4, 4]]), spatial_merge_size=2)
COORDS = torch.tensor(
    [[[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]], [[2, 2], [2, 3], [3, 2], [3, 3], [4, 0], [0, 4]]]
)
FLOAT_COORDS = COORDS.double() * 0.37 - 0.5
IDENTITY = torch.tensor([True, False, False, False, False, True])
HF_TABLES = rotary.RoPE(D).cos_sin(IDS)  # [B, S, D], as transformers hands them to the apply function


def _qk(layout: str = "bhsd", hk: int = HK, d: int = D, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[B, HQ, S, d]`` and k ``[B, hk, S, d]`` (``"bshd"``: heads second)."""
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h: (B, h, S, d)) if layout == "bhsd" else (lambda h: (B, S, h, d))
    return torch.randn(shape(HQ), generator=g), torch.randn(shape(hk), generator=g)


def _tables(t: rotary.RotaryTables) -> tuple[torch.Tensor, ...]:
    """Every tensor a RotaryTables holds (rows and key tables when present)."""
    return tuple(x for x in (t.cos, t.sin, t.rows, t.k_cos, t.k_sin) if x is not None)


def _calls() -> dict:
    """name -> a call of a per-call entry point (fresh inputs each time), returning a tuple of tensors."""
    q, k = _qk()
    qs, ks = _qk("bshd")
    qm, km = _qk(hk=HQ)  # RoPE-Mixed: per-head tables, q and k with the same heads
    qf, kf = _qk(d=128)
    cos, sin = HF_TABLES
    return {
        # xPos
        "xpos(q, k)": lambda: XPOS(q, k),
        "xpos(q, k, offset)": lambda: XPOS(q, k, offset=5),
        "xpos(q, k, position_ids [B, S])": lambda: XPOS_I(q, k, position_ids=IDS),
        "xpos bshd position_ids [S]": lambda: XPOS(qs, ks, layout="bshd", position_ids=IDS[0]),
        "xpos fp16 position_ids": lambda: XPOS(q.half(), k.half(), position_ids=IDS),
        "xpos fp16 offset": lambda: XPOS(q.half(), k.half(), offset=3),
        "xpos bf16": lambda: XPOS(q.bfloat16(), k.bfloat16(), position_ids=IDS),
        "xpos.tables(ids)": lambda: _tables(XPOS_I.tables(IDS)),
        "xpos.tables(Positions without a bound)": lambda: _tables(XPOS.tables(Positions.unchecked(IDS, None))),
        "xpos.tables packed": lambda: _tables(XPOS.tables(Positions.unchecked(IDS.flatten(), 12, packed=True))),
        "xpos.scales": lambda: (XPOS.scales(IDS),),
        # M-RoPE
        "mrope(q, k, ids [3, B, S])": lambda: MROPE(q, k, position_ids=IDS.expand(3, B, S)),
        "mrope(q, k, MultimodalPositions)": lambda: MROPE_I(q, k, position_ids=MULTIMODAL),
        "mrope continuation": lambda: MROPE(q[:, :, :2], k[:, :, :2], position_ids=MULTIMODAL.continuation(2)),
        "mrope.tables": lambda: _tables(MROPE.tables(MULTIMODAL.position_ids)),
        "mrope.input_tables": lambda: _tables(
            MROPE_I.input_tables(IDS.expand(3, B, S), batch=B, seq_len=S, device=q.device)
        ),
        # axial RoPE
        "axial(q, k, grid)": lambda: AXIAL(q, k, AXIAL.grid(2, 3)),
        "axial(q, k, integer coordinates [B, S, A])": lambda: AXIAL(q, k, COORDS),
        "axial float coordinates, identity, in place": lambda: AXIAL(
            q.clone(), k.clone(), FLOAT_COORDS, identity=IDENTITY, inplace=True
        ),
        "axial.rotate bshd": lambda: (AXIAL.rotate(qs, COORDS[0], layout="bshd"),),
        "axial.tables": lambda: _tables(AXIAL.tables(AXIAL.grid(1, 5, prefix=1))),
        "axial.input_tables": lambda: _tables(AXIAL.input_tables(COORDS, batch=B, seq_len=S, device=q.device)),
        "axial Positions [S, A]": lambda: AXIAL(q, k, rotary.positions.grid(2, 3)),
        "dinov3 eval": lambda: DINO.eval()(q, k, DINO.grid(1, 5)),
        "dinov3 training augmentation": lambda: DINO.train()(
            q, k, DINO.grid(1, 5), generator=torch.Generator().manual_seed(7)
        ),
        "flux float64 frequencies": lambda: FLUX(qf, kf, torch.tensor([[0, y, x] for y in range(2) for x in range(3)])),
        # RoPE-Mixed
        "rope_mixed(q, k, grid)": lambda: MIXED(qm, km, MIXED.grid(1, 5)),
        "rope_mixed float coordinates": lambda: MIXED(qm, km, FLOAT_COORDS),
        "rope_mixed.rotate": lambda: (MIXED.rotate(qm, COORDS),),
        "rope_mixed.tables": lambda: _tables(MIXED.tables(COORDS, identity=IDENTITY)),
        # NoPE temperature
        "nope.tables": lambda: _tables(NOPE.tables(IDS)),
        "nope.tables packed": lambda: _tables(NOPE.tables(Positions.unchecked(IDS.flatten(), 12, packed=True))),
        "nope_temperature": lambda: (nope_temperature(IDS, floor_scale=4),),
        # pairing helpers and the DeepSeek-V3 apply of rotary.hf
        "to_half": lambda: (rotary.to_half(q), rotary.to_half(qs, 12)),
        "to_interleaved": lambda: (rotary.to_interleaved(q), rotary.to_interleaved(qs, 8)),
        "hf deepseek interleave": lambda: _apply_deepseek_interleave(q, k, cos, sin),
        # score biases and absolute embeddings
        "learned position embedding": lambda: (LEARNED(IDS),),
        "learned position embedding Positions": lambda: (LEARNED(Positions.unchecked(IDS, None)),),
        "alibi": lambda: (ALIBI(IDS, IDS[:, :4]),),
        "relative position bias": lambda: (RELATIVE(IDS, IDS),),
        "sinusoidal": lambda: (SINUSOIDAL(IDS),),
    }


CALLS = list(_calls())


@pytest.mark.parametrize("name", CALLS)
def test_entry_point_reads_nothing_on_an_accelerator_and_gives_the_cpu_result(name):
    want = _calls()[name]()
    with accelerator_rules():
        got = _calls()[name]()
        got = _calls()[name]()  # a second call: per-device copies and cached grids reused
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w), name


def test_rope_mixed_gradients_are_the_same_on_an_accelerator():
    """The learned frequencies stay differentiable: the gradient under the accelerator rules is the CPU one."""
    grads = []
    for rules in (False, True):
        mixed = RoPEMixed(D, HQ, generator=torch.Generator().manual_seed(3))
        q, k = _qk(hk=HQ, seed=5)
        with accelerator_rules() if rules else contextlib.nullcontext():
            q_rot, k_rot = mixed(q, k, FLOAT_COORDS)
            (q_rot * k_rot).sum().backward()
        grads.append(mixed.inv_freq.grad)
    assert grads[0] is not None and grads[0].abs().sum() > 0
    assert torch.equal(grads[0], grads[1])


# checks of values: raised at once on the CPU, the caller's contract on an accelerator ---------------

SMALL = XPos(D, scale_base=8.0, max_position=16)  # max_distance 557, fp16_max_distance 61, centre 8
FAST = AxialRoPE(D, frequency_scale=10.0)  # frequencies up to 10 rad per unit


BAD = {
    "xpos past max_distance": (
        lambda q, k: SMALL(q, k, position_ids=torch.tensor([0, 1, 2, 3, 4, SMALL.center + SMALL.max_distance + 1])),
        ValueError,
        r"beyond max_distance=557",
    ),
    "xpos.tables past max_distance": (
        lambda q, k: _tables(SMALL.tables(torch.tensor([[2 * SMALL.max_distance]]))),
        ValueError,
        r"position 1114 is 1106 from the xPos centre 8",
    ),
    "xpos fp16 past fp16_max_distance": (
        lambda q, k: SMALL(q.half(), k.half(), position_ids=torch.tensor([[0, 1, 2, 3, 4, 80]] * B)),
        ValueError,
        r"position 80 is 72 from the xPos centre 8, beyond fp16_max_distance=61",
    ),
    "axial NaN coordinates": (
        lambda q, k: AXIAL(q, k, FLOAT_COORDS.clone().index_fill_(1, torch.tensor([2]), math.nan)),
        ValueError,
        "coordinates hold NaN or inf values",
    ),
    "rope_mixed inf coordinates": (
        lambda q, k: MIXED(*_qk(hk=HQ), torch.tensor([[0.0, 1.0]] * 5 + [[math.inf, 0.0]])),
        ValueError,
        "coordinates hold NaN or inf values",
    ),
    "axial angles beyond float64": (
        lambda q, k: FAST(q, k, torch.tensor([[1e308, 0.0]] + [[0.0, 1.0]] * 5, dtype=torch.float64)),
        ValueError,
        r"coordinates up to 1e\+308 times frequencies up to 10 .* beyond float64's range",
    ),
    "learned position past max_position": (
        lambda q, k: (LEARNED(torch.tensor([[0, 3, 16, 2]])),),
        ValueError,
        "position 16 is beyond the learned table of max_position=16",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_named_at_once_on_the_cpu_and_the_contract_on_an_accelerator(name):
    call, error, cpu_message = BAD[name]
    q, k = _qk()
    with pytest.raises(error, match=cpu_message):  # the CPU: at once, as before
        call(q, k)
    with accelerator_rules():
        outs = call(q, k)  # no raise, no read, nothing to poll: the documented contract
    if name != "xpos past max_distance":  # one position just past it: scales at the edge of fp32, still finite
        assert any(not torch.isfinite(o).all() for o in outs)  # not a silently finite wrong result


def test_learned_positions_past_the_table_are_nan_and_the_others_exact():
    ids = torch.tensor([[0, 3, 16, 2], [15, 40, 1, 0]])
    with accelerator_rules():
        out = LEARNED(ids)
    outside = ids >= LEARNED.max_position
    assert torch.isnan(out[outside]).all()
    assert torch.equal(out[~outside], LEARNED.embedding.weight[ids[~outside]])


def test_xpos_positions_the_host_knows_raise_at_once_on_an_accelerator():
    """offset + arange(S) has a host bound: xPos refuses it at once, with no device read, as on the CPU."""
    q, k = _qk()
    for call, message in (
        (lambda: SMALL(q, k, offset=SMALL.max_distance + 100), "beyond max_distance=557"),
        (
            lambda: SMALL(q.half(), k.half(), offset=100),
            r"position 105 is 97 from the xPos centre 8, beyond fp16_max_distance",
        ),
    ):
        with accelerator_rules(), pytest.raises(ValueError, match=message):
            call()


def test_xpos_reads_the_cpu_ids_when_the_bound_is_unknown():
    """A hand-made Positions without a bound is checked on the CPU too (once silently inf/0 scales)."""
    far = Positions.unchecked(torch.tensor([0, SMALL.center + SMALL.max_distance + 1]), None)
    with pytest.raises(ValueError, match="beyond max_distance=557"):
        SMALL.tables(far)
    near = Positions.unchecked(torch.tensor([0, SMALL.center + SMALL.max_distance]), None)
    assert torch.isfinite(SMALL.tables(near).k_cos).all()


def test_good_input_near_the_limits_is_finite():
    q, k = _qk()
    with accelerator_rules():
        outs = (
            *SMALL(q, k, position_ids=torch.tensor([0, 1, 2, 3, 4, SMALL.center + SMALL.max_distance])),
            *SMALL(
                q.half(), k.half(), position_ids=torch.tensor([0, 1, 2, 3, 4, SMALL.center + SMALL.fp16_max_distance])
            ),
            LEARNED(torch.tensor([0, 15])),
            *FAST(q, k, torch.tensor([[1e306, 0.0]] + [[0.0, 1.0]] * 5, dtype=torch.float64)),
        )
    assert all(torch.isfinite(o).all() for o in outs)


# no host-to-device copy of a constant after the first call ---------------------------------------


class _Transfers(TorchDispatchMode):
    """Record every op that takes a CPU tensor (with an axis: not a scalar) and works on another device."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(t.device.type == "cpu" and t.dim() for t in tensors) and any(
            t.device.type != "cpu" for t in tensors + outs
        ):
            self.seen.append(str(func))
        return out


@pytest.fixture
def transfers(monkeypatch):
    """A recorder of host-to-device copies: ``with transfers: ...`` then ``transfers.seen``.

    ``torch.tensor`` / ``torch.as_tensor`` with a device build on the host and copy below the
    dispatcher, out of the mode's sight: they are recorded by name.
    """
    mode = _Transfers()
    for name in ("tensor", "as_tensor"):
        original = getattr(torch, name)

        def wrapped(*args, _original=original, _name=name, **kwargs):
            device = kwargs.get("device")
            if device is not None and torch.device(device).type != "cpu":
                mode.seen.append(f"torch.{_name}(device={device})")
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch, name, wrapped)
    return mode


def _meta(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.to("meta") for t in ts]


def _meta_calls() -> dict:
    """name -> a call on meta inputs (modules on the CPU unless noted)."""
    q, k = _meta(*_qk())
    qm, km = _meta(*_qk(hk=HQ))
    ids, coords, identity = _meta(IDS, COORDS, IDENTITY)
    continued = MULTIMODAL.continuation(S).position_ids.to("meta")
    mixed_on_meta = RoPEMixed(D, HQ).to("meta")  # a learned parameter lives on the inputs' device
    axial_on_meta = AxialRoPE(D).to("meta")
    learned_on_meta = LearnedPositionEmbedding(16, 8).to("meta")
    return {
        "xpos position_ids": lambda: XPOS(q, k, position_ids=ids),
        "xpos offset": lambda: XPOS_I(q, k, offset=4),
        "xpos.scales": lambda: XPOS.scales(ids),
        "xpos fp16": lambda: XPOS(q.half(), k.half(), position_ids=ids),
        "mrope": lambda: MROPE(q, k, position_ids=ids.expand(3, B, S)),
        "mrope continuation": lambda: MROPE_I(q, k, position_ids=continued),
        "axial, module on the CPU, grid per call": lambda: AXIAL(q, k, AXIAL.grid(2, 3)),
        "axial, grid on the device per call": lambda: AXIAL(q, k, AXIAL.grid(2, 3, device="meta")),
        "axial coordinates on the device": lambda: AXIAL(q, k, coords, identity=identity),
        "axial module on the device": lambda: axial_on_meta(q, k, coords),
        "dinov3 eval": lambda: DINO.eval()(q, k, DINO.grid(1, 5)),
        "rope_mixed on the device": lambda: mixed_on_meta(qm, km, coords),
        "nope": lambda: NOPE.tables(ids),
        "to_half / to_interleaved": lambda: (rotary.to_half(q), rotary.to_interleaved(q, 12)),
        "learned position embedding": lambda: learned_on_meta(ids),
    }


@pytest.mark.parametrize("name", list(_meta_calls()))
def test_a_second_call_copies_no_constant_to_the_device(name, transfers):
    call = _meta_calls()[name]
    call()  # the first call may make the per-device copies
    with transfers:
        call()
    assert transfers.seen == [], f"{name} copied host tensors to the device: {transfers.seen}"


def test_the_transfer_recorder_sees_a_host_to_device_copy(transfers):
    """The recorder is not blind: the old per-call copies (ζ, a frequency matrix, an index) are seen."""
    ids = IDS.to("meta")
    with transfers:
        XPOS.zeta.to(ids.device) ** ids.double().unsqueeze(-1)
        torch.tensor([0, 2, 1, 3], device="meta")
    assert transfers.seen == ["aten._to_copy.default", "torch.tensor(device=meta)"]


def test_per_device_copies_are_made_once_and_follow_the_host_tensor():
    xpos = XPos(D)
    ids = IDS.to("meta")
    xpos.tables(ids)
    first = xpos._copies.on("zeta", xpos.zeta, ids.device)
    xpos.tables(ids)
    assert xpos._copies.on("zeta", xpos.zeta, ids.device) is first  # reused, by identity
    assert len(xpos._copies) == 2  # inv_freq and zeta, on meta
    assert xpos._copies.on("zeta", xpos.zeta, torch.device("cpu")) is xpos.zeta  # the CPU: the host tensor itself
    xpos.zeta = xpos.zeta * 1.0  # a new host tensor: a new copy
    assert xpos._copies.on("zeta", xpos.zeta, ids.device) is not first
    mrope = MRoPE(D, mrope_section=[2, 3, 3])
    mrope.tables(IDS.expand(3, B, S).to("meta"))
    copy = mrope._copies.on("inv_freq_axes", mrope.inv_freq_axes, torch.device("meta"))
    mrope.inv_freq_axes.mul_(2)  # edited in place: its version moved, the copy is made again
    assert mrope._copies.on("inv_freq_axes", mrope.inv_freq_axes, torch.device("meta")) is not copy


def test_grids_and_their_device_copies_are_reused_until_edited():
    rope = AxialRoPE(D)
    grid = rope.grid(2, 3, prefix=1)
    assert rope.grid(2, 3, prefix=1) is grid
    assert rope.grid(2, 3) is not grid and rope.grid(3, 2, prefix=1) is not grid
    moved = grid.to("meta")
    assert grid.to("meta") is moved and grid.to(torch.device("cpu")) is grid
    grid.values.add_(1.0)  # edited in place: a fresh grid, a fresh copy
    fresh = rope.grid(2, 3, prefix=1)
    assert fresh is not grid and torch.equal(fresh.values, AxialRoPE(D).grid(2, 3, prefix=1).values)
    assert grid.to("meta") is not moved
    rope.grid_offset = 1.0  # the convention is part of the key
    assert torch.equal(rope.grid(2, 3, prefix=1).values[1:], fresh.values[1:] + 1.0)
    with torch.inference_mode():
        inside = AxialRoPE(D).grid(2, 2, device="meta")
    assert not inside.values.is_inference()  # kept tensors are usable outside inference mode


def test_coordinates_that_require_grad_are_moved_with_autograd():
    values = torch.tensor([[0.5, 1.0], [2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    coords = Coordinates(values)
    moved = coords.to("meta")
    assert moved.values.requires_grad and coords.to("meta") is not moved


def _host_inputs_of_compiled(call) -> list[tuple[int, ...]]:
    """Shapes of the CPU tensors (not scalars) that ``torch.compile`` lifts into the graph of ``call``."""
    torch._dynamo.reset()
    seen: list[tuple[int, ...]] = []

    def backend(gm, inputs):
        seen.extend(
            tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim()
        )
        return gm.forward

    torch.compile(call, backend=backend, fullgraph=True)()
    torch._dynamo.reset()
    return seen


@pytest.mark.parametrize("name", ["xpos", "mrope", "axial"])
def test_a_compiled_call_after_an_eager_one_takes_the_device_copies(name):
    """Under torch.compile the copies made by an eager call are used: no host constant enters the graph
    (a fresh module, compiled cold, shows what would: its host frequencies)."""
    q, k = _meta(*_qk())
    ids = IDS[0].to("meta")
    modules = {
        "xpos": lambda: XPos(D),
        "mrope": lambda: MRoPE(D, mrope_section=[2, 3, 3]),
        "axial": lambda: AxialRoPE(D),
    }
    calls = {
        "xpos": lambda m: lambda: m(q, k, position_ids=ids),
        "mrope": lambda m: lambda: m(q, k, position_ids=ids.expand(3, B, S)),
        "axial": lambda m: lambda: m(q, k, m.grid(2, 3)),
    }
    cold = calls[name](modules[name]())
    assert _host_inputs_of_compiled(cold) != []
    warm = calls[name](modules[name]())
    warm()
    assert _host_inputs_of_compiled(warm) == []
