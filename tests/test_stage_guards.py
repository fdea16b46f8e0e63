"""The stage values (Positions, RotaryTables, the rope_type registry) refuse what they cannot hold, and
the objects that hold locks can be copied and saved. Each case here failed or was silently wrong before."""

import copy
import io
import pickle

import pytest
import torch

import rotary
from rotary import positions as P
from rotary.models import Decoder, DecoderConfig
from rotary.models.roformer import RoFormer, RoFormerConfig
from rotary.rope_types import register_rope_type
from rotary.tables import RotaryTables


def small_lm(**over):
    return Decoder(DecoderConfig(**dict(dict(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4), **over))).eval()


# ---- RotaryTables made by hand are checked; producers' are not re-checked --------------------------


def test_hand_made_tables_are_value_checked():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    RotaryTables(cos, sin, False)  # genuine tables pass
    with pytest.raises(ValueError):
        RotaryTables(cos * 2, sin, False)  # cos²+sin² = 4 cos² + sin², not 1
    with pytest.raises(ValueError):
        RotaryTables(torch.full_like(cos, float("nan")), sin, False)
    with pytest.raises(ValueError):  # laid out for the half pairing, claimed interleaved
        RotaryTables(cos, sin, True)


def test_unchecked_tables_still_check_structure():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    assert RotaryTables.unchecked(cos * 2, sin, False).cos is not None  # values are the producer's word
    with pytest.raises((TypeError, ValueError)):
        RotaryTables.unchecked(cos, sin[:, :4], False)  # shapes are still checked
    with pytest.raises((TypeError, ValueError)):
        RotaryTables.unchecked(cos, sin, False, rows=torch.tensor([0, 9]))  # rows past the table


def test_check_samples_the_rows_tokens_read():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(100))
    cos = cos.clone()
    cos[97] = 3.0  # a broken row that only token 0 reads
    tables = RotaryTables.unchecked(cos, sin, False, rows=torch.tensor([97, 1, 2]))
    with pytest.raises(ValueError):
        tables.check(sample=2)
    RotaryTables.unchecked(cos, sin, False, rows=torch.tensor([1, 2, 3])).check(sample=2)


@pytest.mark.parametrize("kwargs, match", [({"rtol": 0}, "rtol"), ({"rtol": float("nan")}, "rtol"), ({"sample": 0}, "sample")])
def test_check_arguments_are_checked(kwargs, match):
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    with pytest.raises(ValueError, match=match):
        RotaryTables(cos, sin, False).check(**kwargs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_from_tensors_takes_half_precision_tables(dtype):
    cos, sin = rotary.RoPE(64).cos_sin(torch.arange(4096))
    tables = RotaryTables.from_tensors(cos.to(dtype), sin.to(dtype), interleaved=False, validate="full")
    assert tables.cos.dtype == torch.float32
    with pytest.raises(ValueError):  # still not any tensor: 1.1 x a bf16 table is no rotation
        RotaryTables.from_tensors((cos * 1.1).to(dtype), sin.to(dtype), interleaved=False, validate="full")


def test_from_tensors_refuses_fp8_tables():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    with pytest.raises(TypeError, match="float8"):
        RotaryTables.from_tensors(cos.to(torch.float8_e4m3fn), sin.to(torch.float8_e4m3fn), interleaved=False)


# ---- rotate's inputs ----------------------------------------------------------------------------


@pytest.fixture
def setup():
    rope = rotary.RoPE(64)
    return rope, rope.tables(torch.arange(8)), torch.randn(1, 4, 8, 64)


def test_rotate_takes_any_iterable_but_not_a_lone_tensor(setup):
    rope, tables, q = setup
    (out,) = rotary.rotate((x for x in [q]), tables)
    assert torch.equal(out, rope.rotate(q))
    with pytest.raises(TypeError, match=r"pass \[x\]"):
        rotary.rotate(q, tables)
    with pytest.raises(TypeError, match="list of tensors"):
        rotary.rotate(5, tables)


def test_rotate_refuses_fp8_inputs(setup):
    _, tables, q = setup
    with pytest.raises(TypeError, match="float8"):
        rotary.rotate([q.to(torch.float8_e4m3fn)], tables)


def test_float64_inputs_get_float64_accuracy_from_the_module(setup):
    rope, _, q = setup
    pos = torch.arange(2**20, 2**20 + 8)
    want = rotary.reference.rotate_matrix(q.double(), pos, rope.inv_freq.double())
    got = rope.rotate(q.double(), position_ids=pos)
    assert got.dtype == torch.float64
    assert float((got - want).abs().max()) < 1e-12  # float64 accuracy at position 2**20, not fp32's 1e-7
    cos, sin = rope.cos_sin(pos, dtype=torch.float64)
    assert cos.dtype == torch.float64
    assert float((rotary.apply_rotary(q.double(), cos, sin) - want).abs().max()) < 1e-12
    cos32, sin32 = rope.cos_sin(pos)  # tables given in fp32: the accuracy is theirs
    assert float((rotary.apply_rotary(q.double(), cos32, sin32) - want).abs().max()) > 1e-9


def test_inplace_on_a_leaf_that_requires_grad_is_named(setup):
    _, tables, _ = setup
    leaf = torch.randn(1, 4, 8, 64, requires_grad=True)
    with pytest.raises(ValueError, match="leaf tensor that requires grad"):
        rotary.rotate([leaf], tables, inplace=True)
    with torch.no_grad():  # allowed, as torch allows it
        rotary.rotate([leaf], tables, inplace=True)


def test_inplace_refuses_self_overlap_torch_cannot_classify(setup):
    _, tables, _ = setup
    base = torch.randn(1 * 4 * 8 * 64)
    # strides that make elements alias without an expanded (stride 0) dim
    x = base.as_strided((1, 4, 8, 64), (0, 64, 32, 1))
    with pytest.raises(ValueError, match="overlapping memory"):
        rotary.rotate([x], tables, inplace=True)


# ---- positions ------------------------------------------------------------------------------------


def test_positions_past_two_to_the_53_are_refused():
    assert P.MAX_POSITION == 2**53
    with pytest.raises(ValueError, match="2\\*\\*53"):
        P.arange(4, offset=2**53)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        P.from_ids(torch.tensor([0, 2**60]))
    with pytest.raises(ValueError, match="2\\*\\*53"):
        P.Positions(torch.tensor([2**62]), None)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        rotary.RoPE(8)(torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8), offset=2**63 - 8)
    P.arange(1, offset=2**53)  # the largest is fine


def test_continuation_needs_positions():
    with pytest.raises(TypeError, match="previous must be Positions"):
        P.continuation(torch.arange(3), 2)


# ---- registry and scaling changes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"required": "factor"}, "collection of key names"),
        ({"optional": 3}, "collection of key names"),
        ({"check": "yes"}, "check must be a function"),
        ({"length_dependent": "no"}, "length_dependent"),
        ({"trained_length": "no"}, "trained_length"),
    ],
)
def test_register_rope_type_checks_its_arguments(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        register_rope_type("_guard_test", **kwargs)


def test_register_rope_type_refuses_a_non_function():
    with pytest.raises(TypeError, match="decorates an init function"):
        register_rope_type("_guard_test2")(42)
    assert "_guard_test2" not in rotary.rope_types.ROPE_TYPES


def test_with_scaling_argument_checks():
    rope = rotary.RoPE(64, base=10000.0)
    with pytest.raises(TypeError, match="dict"):
        rope.with_scaling("linear")
    with pytest.raises(rotary.ConfigError, match="rope_theta"):
        rope.with_scaling({"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0})
    same = rope.with_scaling({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    assert torch.equal(same.inv_freq, rope.inv_freq / 2)


# ---- objects holding locks can be copied and saved ------------------------------------------------


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("how", [copy.deepcopy, _roundtrip, lambda m: pickle.loads(pickle.dumps(m))])
def test_models_with_caches_copy_and_save(how):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(50, (1, 24), generator=gen)
    lm = small_lm(rope_scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}, max_position=16)
    before = lm(ids)  # fills the table caches (and takes their locks)
    twin = how(lm)
    assert torch.equal(twin(ids), before)
    rope = rotary.RoPE(64, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}, max_position=16)
    q = torch.randn(1, 2, 40, 64, generator=gen)
    out = rope(q, q)[0]
    assert torch.equal(how(rope)(q, q)[0], out)


def test_roformer_copies_after_a_forward():
    model = RoFormer(RoFormerConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)).eval()
    ids = torch.randint(50, (1, 7))
    out = model(ids)
    assert torch.equal(copy.deepcopy(model)(ids), out)


# ---- the meta device ------------------------------------------------------------------------------


@pytest.mark.parametrize("over", [{"position_encoding": "xpos"}, {"no_rope_layers": [1, 0]}])
def test_variant_decoders_build_on_the_meta_device(over):
    with torch.device("meta"):
        lm = small_lm(**over)
    lm.to_empty(device="cpu")
    ref = small_lm(**over)
    lm.load_state_dict(ref.state_dict())
    ids = torch.randint(50, (1, 9))
    assert torch.equal(lm(ids), ref(ids))
