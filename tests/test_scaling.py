"""Context-window scaling: every rope_type against transformers 5.23, and the length-dependent state machine."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as HF_ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

import rotary
from helpers import hf_frequencies
from rotary import RoPE, frequencies
from rotary.frequencies import default_inv_freq
from rotary.tables import cos_sin_table

transformers.logging.set_verbosity_error()  # transformers logs (does not raise) its own config checks

EXAMPLES = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS32 = 2.0**-24  # half an ulp at 1.0: fp32 rounding of a value in [0.5, 1)


def hf_config(head_dim: int, params: dict, max_position_embeddings: int = 4096) -> LlamaConfig:
    """A transformers config whose RoPE block is ``params`` (the init functions read only that and head_dim)."""
    return LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        num_hidden_layers=1,
        intermediate_size=8,
        vocab_size=8,
        rope_parameters=dict(params),
    )


# ---- strategies ------------------------------------------------------------------------------
head_dims = st.integers(8, 128).map(lambda h: 2 * h)  # 16..256, even
bases = st.floats(3.0, 7.0).map(lambda e: float(f"{10**e:.6g}"))  # 1e3..1e7
factors = st.one_of(st.sampled_from([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]), st.floats(1.0, 64.0))
partials = st.sampled_from([1.0, 1.0, 0.5, 0.25, 0.75, 0.4])
originals = st.sampled_from([256, 512, 2048, 4096, 8192, 32768, 131072])


@st.composite
def configurations(draw, rope_type: str):
    head_dim = draw(head_dims)
    partial = draw(partials)
    dim = int(head_dim * partial)
    assume(dim % 2 == 0 and dim >= 4)
    params = {"rope_type": rope_type, "rope_theta": draw(bases)}
    if partial != 1.0:
        params["partial_rotary_factor"] = partial
    original = draw(originals)
    max_position_embeddings = original * draw(st.sampled_from([1, 2, 4, 8]))
    if rope_type in ("linear", "dynamic"):
        params["factor"] = draw(factors)
    elif rope_type == "yarn":
        params["factor"] = draw(factors)
        params["original_max_position_embeddings"] = original
        beta_slow = draw(st.sampled_from([None, 1, 1.0, 2.0, 0.5]))
        beta_fast = draw(st.sampled_from([None, 32, 32.0, 16.0, 64.0]))
        if beta_slow is not None:
            params["beta_slow"] = beta_slow
        if beta_fast is not None:
            params["beta_fast"] = beta_fast
        # the context length agrees with the factor (or is left at the trained one), as in published configs;
        # a disagreement is an error here (transformers warns): test_yarn_factor_disagreeing_with_the_lengths
        consistent = [original] + [original * int(params["factor"])] * float(params["factor"]).is_integer()
        max_position_embeddings = draw(st.sampled_from(consistent))
        extra = draw(st.sampled_from(["none", "attention_factor", "mscale", "truncate"]))
        if extra == "attention_factor":
            params["attention_factor"] = draw(st.floats(0.5, 2.0))
        elif extra == "mscale":
            params["mscale"] = draw(st.sampled_from([0.707, 1.0]))
            params["mscale_all_dim"] = draw(st.sampled_from([0.707, 1.0]))
        elif extra == "truncate":
            params["truncate"] = draw(st.booleans())
    elif rope_type == "longrope":
        params["original_max_position_embeddings"] = original
        n = (dim + 1) // 2
        values = st.floats(1.0, 64.0, width=32)
        params["short_factor"] = draw(st.lists(values, min_size=n, max_size=n))
        params["long_factor"] = draw(st.lists(values, min_size=n, max_size=n))
        if draw(st.booleans()):
            params["factor"] = draw(factors)
        if draw(st.booleans()):
            params["attention_factor"] = draw(st.floats(0.5, 2.0))
    elif rope_type == "llama3":
        params["factor"] = draw(factors)
        low = draw(st.sampled_from([1.0, 0.5, 2.0]))
        params["low_freq_factor"] = low
        params["high_freq_factor"] = low * draw(st.sampled_from([2.0, 4.0, 8.0]))
        params["original_max_position_embeddings"] = original
    elif rope_type == "proportional":
        params["partial_rotary_factor"] = draw(st.sampled_from([0.25, 0.5, 1.0]))
        if draw(st.booleans()):
            params["factor"] = draw(factors)
    return head_dim, params, max_position_embeddings


def ours(head_dim: int, params: dict, max_position_embeddings: int, seq_len=None):
    """rotary's frequencies for a transformers block (which gets the context length from the config)."""
    block = dict(params)
    if block["rope_type"] in ("dynamic", "yarn", "longrope"):
        block["max_position_embeddings"] = max_position_embeddings
    return frequencies(head_dim, scaling=block, seq_len=seq_len)


def assert_same_as_hf(head_dim, params, max_position_embeddings, seq_len=None):
    hf_inv_freq, hf_scaling = HF_ROPE_INIT_FUNCTIONS[params["rope_type"]](
        hf_config(head_dim, params, max_position_embeddings), "cpu", seq_len=seq_len
    )
    f = ours(head_dim, params, max_position_embeddings, seq_len)
    assert f.inv_freq.dtype == torch.float32
    assert torch.equal(f.inv_freq, hf_inv_freq), (params, (f.inv_freq - hf_inv_freq).abs().max())
    assert f.attention_scaling == hf_scaling
    return f


# ---- parity: inv_freq bit-identical, attention_scaling equal -------------------------------------
@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3", "proportional"])
@EXAMPLES
@given(data=st.data())
def test_static_types_match_transformers(rope_type, data):
    head_dim, params, max_position_embeddings = data.draw(configurations(rope_type))
    assert_same_as_hf(head_dim, params, max_position_embeddings)


@EXAMPLES
@given(config=configurations("dynamic"), seq_len=st.integers(1, 300_000), as_tensor=st.booleans())
def test_dynamic_matches_transformers_at_any_length(config, seq_len, as_tensor):
    head_dim, params, max_position_embeddings = config
    length = torch.tensor(seq_len) if as_tensor else seq_len  # transformers' module passes a tensor
    assert_same_as_hf(head_dim, params, max_position_embeddings, seq_len=length)
    assert_same_as_hf(head_dim, params, max_position_embeddings, seq_len=None)


@EXAMPLES
@given(config=configurations("longrope"), seq_len=st.one_of(st.none(), st.integers(1, 300_000)))
def test_longrope_matches_transformers(config, seq_len):
    head_dim, params, max_position_embeddings = config
    f = assert_same_as_hf(head_dim, params, max_position_embeddings, seq_len=seq_len)
    long = seq_len is not None and seq_len > params["original_max_position_embeddings"]
    factors = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32)
    base_inv = hf_frequencies({"rope_type": "default"}, params["rope_theta"], 2 * len(factors))[0]  # transformers'
    torch.testing.assert_close(f.inv_freq, base_inv / factors, rtol=4 * EPS32, atol=0)


def test_published_snapshots_from_transformers_tests():
    # transformers' tests/utils/test_modeling_rope_utils.py snapshots (LlamaConfig defaults: head_dim 128,
    # theta 1e4, 2048 positions; factor 10), printed to 5 significant digits there
    yarn = frequencies(
        128,
        scaling={
            "rope_type": "yarn",
            "factor": 10.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 2048,
        },
    )
    expected_yarn = [
        1.0,
        8.6596e-01,
        7.4989e-01,
        6.4938e-01,
        5.6234e-01,
        4.8697e-01,
        4.2170e-01,
        3.6517e-01,
        3.1623e-01,
        2.7384e-01,
        2.3714e-01,
        2.0535e-01,
        1.7783e-01,
        1.5399e-01,
        1.3335e-01,
        1.1548e-01,
        1.0000e-01,
        8.3479e-02,
        6.9590e-02,
        5.7925e-02,
        4.8136e-02,
        3.9931e-02,
        3.3061e-02,
        2.7315e-02,
        2.2515e-02,
        1.8512e-02,
        1.5177e-02,
        1.2403e-02,
        1.0101e-02,
        8.1924e-03,
        6.6143e-03,
        5.3120e-03,
        4.2400e-03,
        3.3599e-03,
        2.6396e-03,
        2.0520e-03,
        1.5746e-03,
        1.1882e-03,
        8.7713e-04,
        6.2810e-04,
        4.3007e-04,
        2.7384e-04,
        2.3714e-04,
        2.0535e-04,
        1.7783e-04,
        1.5399e-04,
        1.3335e-04,
        1.1548e-04,
        1.0000e-04,
        8.6596e-05,
        7.4989e-05,
        6.4938e-05,
        5.6234e-05,
        4.8697e-05,
        4.2170e-05,
        3.6517e-05,
        3.1623e-05,
        2.7384e-05,
        2.3714e-05,
        2.0535e-05,
        1.7783e-05,
        1.5399e-05,
        1.3335e-05,
        1.1548e-05,
    ]
    torch.testing.assert_close(yarn.inv_freq, torch.tensor(expected_yarn), rtol=6e-5, atol=0)
    assert yarn.attention_scaling == 0.1 * math.log(10.0) + 1.0
    dynamic = frequencies(
        128, scaling={"rope_type": "dynamic", "factor": 10.0, "max_position_embeddings": 2048}, seq_len=16384
    )
    expected_dynamic = [
        1.0,
        8.0931e-01,
        6.5498e-01,
        5.3008e-01,
        4.2900e-01,
        3.4720e-01,
        2.8099e-01,
        2.2741e-01,
        1.8404e-01,
        1.4895e-01,
        1.2055e-01,
        9.7558e-02,
        7.8955e-02,
        6.3899e-02,
        5.1714e-02,
        4.1853e-02,
        3.3872e-02,
        2.7413e-02,
        2.2185e-02,
        1.7955e-02,
        1.4531e-02,
        1.1760e-02,
        9.5176e-03,
        7.7027e-03,
        6.2339e-03,
        5.0451e-03,
        4.0831e-03,
        3.3045e-03,
        2.6744e-03,
        2.1644e-03,
        1.7517e-03,
        1.4176e-03,
        1.1473e-03,
        9.2852e-04,
        7.5146e-04,
        6.0817e-04,
        4.9220e-04,
        3.9834e-04,
        3.2238e-04,
        2.6091e-04,
        2.1115e-04,
        1.7089e-04,
        1.3830e-04,
        1.1193e-04,
        9.0585e-05,
        7.3312e-05,
        5.9332e-05,
        4.8018e-05,
        3.8861e-05,
        3.1451e-05,
        2.5453e-05,
        2.0600e-05,
        1.6672e-05,
        1.3492e-05,
        1.0920e-05,
        8.8374e-06,
        7.1522e-06,
        5.7883e-06,
        4.6845e-06,
        3.7912e-06,
        3.0683e-06,
        2.4832e-06,
        2.0097e-06,
        1.6265e-06,
    ]
    torch.testing.assert_close(dynamic.inv_freq, torch.tensor(expected_dynamic), rtol=6e-5, atol=0)
    llama3 = frequencies(
        128,
        scaling={
            "rope_type": "llama3",
            "factor": 10.0,
            "low_freq_factor": 1,
            "high_freq_factor": 4,
            "original_max_position_embeddings": 2048,
        },
    )
    expected_llama3 = (
        expected_yarn[:17]
        + [
            8.6596e-02,
            7.4989e-02,
            6.4938e-02,
            5.6234e-02,
            4.8697e-02,
            4.2170e-02,
            3.6517e-02,
            3.1623e-02,
            2.7384e-02,
            2.3714e-02,
            2.0535e-02,
            1.7783e-02,
            1.5399e-02,
            1.3335e-02,
            1.0730e-02,
            7.7785e-03,
            5.6009e-03,
            3.9991e-03,
            2.8248e-03,
            1.9675e-03,
            1.3449e-03,
            8.9549e-04,
            5.7363e-04,
            3.4539e-04,
        ]
        + expected_yarn[41:]
    )
    torch.testing.assert_close(llama3.inv_freq, torch.tensor(expected_llama3), rtol=6e-5, atol=0)
    assert llama3.attention_scaling == 1.0


# ---- what each method does to the pairs ---------------------------------------------------------
def test_linear_divides_every_frequency():
    f = frequencies(64, base=10000.0, scaling={"rope_type": "linear", "factor": 4.0})
    assert torch.equal(f.inv_freq, default_inv_freq(10000.0, 64) / 4.0)


@given(head_dim=head_dims, alpha=st.floats(1.0, 64.0), base=bases)
@EXAMPLES
def test_ntk_raises_the_base(head_dim, alpha, base):
    f = frequencies(head_dim, base=base, scaling={"rope_type": "ntk", "factor": alpha})
    # transformers' default frequencies (restated in helpers, not rotary's default_inv_freq) of the raised base
    new_base = base * alpha ** (head_dim / (head_dim - 2))
    assert torch.equal(f.inv_freq, hf_frequencies({"rope_type": "default"}, new_base, head_dim)[0])
    plain = hf_frequencies({"rope_type": "default"}, base, head_dim)[0].double()
    assert f.inv_freq[0] == 1.0  # the fastest pair is untouched
    # the slowest pair is divided by exactly alpha (up to the fp32 roundings of both tables)
    assert f.inv_freq[-1].double() * alpha == pytest.approx(plain[-1].item(), rel=1e-5)


def test_ntk_equals_dynamic_at_the_matching_length():
    # dynamic NTK at length L is static NTK with alpha = factor * L / L_train - (factor - 1)
    dyn = frequencies(64, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 100}, seq_len=300)
    ntk = frequencies(64, scaling={"rope_type": "ntk", "factor": 2.0 * 300 / 100 - 1.0})
    assert torch.equal(dyn.inv_freq, ntk.inv_freq)


def test_dynamic_is_default_up_to_the_trained_length():
    block = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 512}
    plain = default_inv_freq(10000.0, 64)
    for seq_len in (None, 1, 512):
        assert torch.equal(frequencies(64, scaling=block, seq_len=seq_len).inv_freq, plain)
    assert frequencies(64, scaling=block, seq_len=513).inv_freq[-1] < plain[-1]


def test_yarn_keeps_fast_pairs_and_interpolates_slow_ones():
    f = frequencies(
        128, base=10000.0, scaling={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}
    )
    plain = default_inv_freq(10000.0, 128)
    assert torch.equal(f.inv_freq[:8], plain[:8])
    torch.testing.assert_close(f.inv_freq[-8:], plain[-8:] / 16.0, rtol=1e-6, atol=0)
    assert bool(((f.inv_freq <= plain) & (f.inv_freq >= plain / 16.0 * (1 - 1e-6))).all())


def test_llama3_bands():
    f = frequencies(
        128,
        base=500000.0,
        scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    plain = default_inv_freq(500000.0, 128)
    wavelen = 2 * math.pi / plain
    short, long = wavelen < 8192 / 4.0, wavelen > 8192 / 1.0
    assert torch.equal(f.inv_freq[short], plain[short])
    assert torch.equal(f.inv_freq[long], plain[long] / 8.0)
    mid = ~short & ~long
    assert mid.any() and bool(((f.inv_freq[mid] < plain[mid]) & (f.inv_freq[mid] > plain[mid] / 8.0)).all())


def test_proportional_freezes_the_tail_pairs():
    f = frequencies(256, base=1e6, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert f.inv_freq.shape == (128,) and f.rotary_dim == 256
    assert bool((f.inv_freq[32:] == 0).all()) and bool((f.inv_freq[:32] > 0).all())
    # exponents run over the whole head: pair i rotates at base ** (-2i / head_dim)
    assert torch.equal(f.inv_freq[:32], default_inv_freq(1e6, 256)[:32])
    assert f.wavelengths[-1] == math.inf


def test_partial_rotation_by_factor_or_rotary_dim():
    by_factor = frequencies(128, scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5})
    by_dim = frequencies(128, rotary_dim=64, scaling={"rope_type": "linear", "factor": 2.0})
    assert by_factor.rotary_dim == by_dim.rotary_dim == 64
    assert torch.equal(by_factor.inv_freq, by_dim.inv_freq)
    # channels past rotary_dim pass through the module unchanged
    rope = RoPE(
        128,
        scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "partial_rotary_factor": 0.25,
        },
    )
    q = torch.randn(1, 2, 10, 128)
    q_rot, _ = rope(q, q)
    assert torch.equal(q_rot[..., 32:], q[..., 32:])
    assert not torch.equal(q_rot[..., :32], q[..., :32])


def test_legacy_type_key_and_rope_theta_in_block():
    a = frequencies(64, scaling={"type": "linear", "factor": 2.0, "rope_theta": 5e5})
    b = frequencies(64, base=5e5, scaling={"rope_type": "linear", "factor": 2.0})
    assert torch.equal(a.inv_freq, b.inv_freq) and a.rope_type == "linear" and a.base == 5e5
    with pytest.raises(rotary.ConfigError, match="rope_theta=500000.0"):
        frequencies(64, base=1e4, scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})
    with pytest.raises(rotary.ConfigError, match="give only one"):
        frequencies(64, rotary_dim=32, scaling={"partial_rotary_factor": 0.25})


# ---- cos/sin tables against transformers' modules ------------------------------------------------
def _reference(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float):
    theta = positions.double()[:, None] * inv_freq.double()[None]
    theta = torch.cat((theta, theta), dim=-1)
    return theta.cos() * scaling, theta.sin() * scaling, theta


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default"},
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    ],
    ids=lambda p: p["rope_type"],
)
def test_tables_match_transformers_and_are_closer_to_float64(params):
    cfg = hf_config(128, dict(params, rope_theta=500000.0), max_position_embeddings=8192)
    hf = LlamaRotaryEmbedding(cfg)
    rope = RoPE.from_hf_config(cfg)
    assert torch.equal(rope.inv_freq, hf.inv_freq) and rope.attention_scaling == hf.attention_scaling
    near, far = torch.arange(0, 2048), torch.tensor([8191, 65535, 131071, 1 << 20])
    positions = torch.cat((near, far))
    hf_cos, hf_sin = hf(torch.zeros(1), positions[None])
    # far positions through the table function the module uses (the cache would grow to 2**21 rows)
    far_cos, far_sin = cos_sin_table(far, rope.inv_freq, attention_scaling=rope.attention_scaling)
    near_cos, near_sin = rope.cos_sin(near)
    cos, sin = torch.cat((near_cos, far_cos)), torch.cat((near_sin, far_sin))
    ref_cos, ref_sin, theta = _reference(positions, rope.inv_freq, rope.attention_scaling)
    # within fp32 rounding of transformers: its angle is rounded once (<= |theta| * 2**-24), then cos/sin,
    # the attention scaling and ours add a few half-ulps
    tol = rope.attention_scaling * (theta.abs() * EPS32 + 4 * EPS32)
    assert bool(((cos.double() - hf_cos[0].double()).abs() <= tol).all())
    assert bool(((sin.double() - hf_sin[0].double()).abs() <= tol).all())
    # and never farther than transformers from the float64 truth, anywhere
    for ours_t, hf_t, ref in ((cos, hf_cos[0], ref_cos), (sin, hf_sin[0], ref_sin)):
        ours_err = (ours_t.double() - ref).abs()
        hf_err = (hf_t.double() - ref).abs()
        assert bool((ours_err <= 0.5 * torch.finfo(torch.float32).eps * ref.abs().clamp_min(1e-30) * 2).all())
        assert ours_err.max() <= hf_err.max()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_tables_on_drawn_configurations(data):
    rope_type = data.draw(st.sampled_from(["default", "linear", "yarn", "llama3", "proportional"]))
    if rope_type == "default":
        head_dim, params, max_position_embeddings = data.draw(configurations("linear"))
        params = {k: v for k, v in params.items() if k != "factor"} | {"rope_type": "default"}
    else:
        head_dim, params, max_position_embeddings = data.draw(configurations(rope_type))
    if rope_type == "default":  # Llama's default ignores partial_rotary_factor; Phi-3's reads it
        cfg = Phi3Config(
            hidden_size=2 * head_dim,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_hidden_layers=1,
            intermediate_size=8,
            vocab_size=8,
            pad_token_id=0,
            rope_parameters=params,
        )
        hf = Phi3RotaryEmbedding(cfg)
    else:
        cfg = hf_config(head_dim, params, max_position_embeddings)
        hf = LlamaRotaryEmbedding(cfg)
    rope = RoPE.from_hf_config(cfg)
    assert torch.equal(rope.inv_freq, hf.inv_freq) and rope.attention_scaling == hf.attention_scaling
    positions = torch.tensor(sorted(data.draw(st.sets(st.integers(0, 8191), min_size=1, max_size=48))))
    hf_cos, hf_sin = hf(torch.zeros(1), positions[None])
    cos, sin = rope.cos_sin(positions)
    ref_cos, ref_sin, theta = _reference(positions, rope.inv_freq, rope.attention_scaling)
    tol = rope.attention_scaling * (theta.abs() * EPS32 + 4 * EPS32)
    for ours_t, hf_t, ref in ((cos, hf_cos[0], ref_cos), (sin, hf_sin[0], ref_sin)):
        assert bool(((ours_t.double() - hf_t.double()).abs() <= tol).all())
        ours_err, hf_err = (ours_t.double() - ref).abs(), (hf_t.double() - ref).abs()
        assert bool((ours_err <= EPS32 * ref.abs() + 1e-30).all())  # one rounding of the float64 value
        assert ours_err.max() <= hf_err.max()


# ---- dynamic / longrope: the same tables over a replayed call sequence ---------------------------
REPLAY = [6, 32, 16, 8, 7, 40, 33, 9, 3]


def _check_call(hf_module, rope, length, how):
    positions = torch.arange(length)[None]
    hf_cos, hf_sin = hf_module(torch.zeros(1), positions)
    if how == "cos_sin":
        cos, sin = rope.cos_sin(positions)
        cos, sin = cos[0], sin[0]
    else:  # forward without position_ids: the offset path must update the frequencies too
        q = torch.randn(1, 1, length, rope.head_dim)  # fp32: both sides use the fp32 tables
        q_rot = rope.rotate(q)
        cos, sin = rope.cos_sin(torch.arange(length))
        expected = rotary.apply_rotary(q, cos, sin)
        assert torch.equal(q_rot, expected)
    assert torch.equal(rope.inv_freq, hf_module.inv_freq), length
    assert rope.attention_scaling == hf_module.attention_scaling
    torch.testing.assert_close(cos, hf_cos[0], rtol=0, atol=64 * EPS32 * rope.attention_scaling)
    torch.testing.assert_close(sin, hf_sin[0], rtol=0, atol=64 * EPS32 * rope.attention_scaling)


@pytest.mark.parametrize("how", ["cos_sin", "rotate"])
def test_dynamic_replays_transformers_call_for_call(how):
    cfg = hf_config(32, {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}, max_position_embeddings=8)
    hf = LlamaRotaryEmbedding(cfg)
    rope = RoPE.from_hf_config(cfg)
    original = rope.inv_freq.clone()
    for length in REPLAY:
        _check_call(hf, rope, length, how)
    # the state itself: 32 grew the base; 16 and 8 keep it (not shorter than 8); 7 resets
    rope2 = RoPE.from_hf_config(cfg)
    seen = []
    for length in (6, 32, 16, 8, 7):
        rope2.cos_sin(torch.arange(length))
        seen.append(rope2.inv_freq.clone())
    assert torch.equal(seen[0], original)
    assert not torch.equal(seen[1], original)
    assert torch.equal(seen[2], seen[1]) and torch.equal(seen[3], seen[1])
    assert torch.equal(seen[4], original)


def test_longrope_replays_transformers_call_for_call():
    n = 16
    cfg = Phi3Config(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=1,
        intermediate_size=8,
        vocab_size=8,
        max_position_embeddings=32,
        original_max_position_embeddings=8,
        pad_token_id=0,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + i / 32 for i in range(n)],
            "long_factor": [1.0 + i for i in range(n)],
        },
    )
    hf = Phi3RotaryEmbedding(cfg)
    rope = RoPE.from_hf_config(cfg)
    for length in REPLAY:
        _check_call(hf, rope, length, "cos_sin")
        long = length > 8
        assert torch.equal(
            rope.inv_freq,
            frequencies(
                32, scaling=dict(rope.original_freqs.scaling, rope_theta=10000.0), seq_len=9 if long else None
            ).inv_freq,
        )


def test_dynamic_stateless_uses_the_current_length_only():
    block = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8}
    rope = RoPE(32, scaling=block, dynamic="stateless")
    hf_like = RoPE(32, scaling=block)
    for length in (6, 32, 16, 8, 7):
        rope.cos_sin(torch.arange(length))
        hf_like.cos_sin(torch.arange(length))
        fresh = frequencies(32, scaling=block, seq_len=torch.tensor(length))
        assert torch.equal(rope.inv_freq, fresh.inv_freq), length
    # at 16 the two differ: the state machine keeps the base grown for 32 (transformers#25104)
    rope.cos_sin(torch.arange(32))
    hf_like.cos_sin(torch.arange(32))
    rope.cos_sin(torch.arange(16))
    hf_like.cos_sin(torch.arange(16))
    assert not torch.equal(rope.inv_freq, hf_like.inv_freq)
    with pytest.raises(ValueError, match="'hf'.*'stateless'"):
        RoPE(32, scaling=block, dynamic="sometimes")


def test_length_change_rebuilds_tables_and_keeps_fp32():
    block = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 16}
    rope = RoPE(32, scaling=block, max_position=64)
    short_cos, _ = rope.cos_sin(torch.arange(10))
    rope.cos_sin(torch.arange(200))  # grows the base: cached tables must not be reused
    grown_cos, _ = rope.cos_sin(torch.arange(100, 110))  # still grown (longer than 16)
    ref, _, _ = _reference(torch.arange(100, 110), rope.inv_freq, 1.0)
    torch.testing.assert_close(grown_cos.double(), ref, rtol=0, atol=4 * EPS32)
    rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32
    assert torch.equal(rope.inv_freq, rope.freqs.inv_freq)
    again, _ = rope.cos_sin(torch.arange(10))  # shorter than 16: reset to the trained frequencies
    assert again.dtype == torch.float32 and torch.equal(again, short_cos)
    rope.reset_length()
    assert torch.equal(rope.inv_freq, rope.original_freqs.inv_freq)


def test_static_types_compile_without_graph_breaks():
    rope = RoPE(64, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128})
    q = torch.randn(1, 2, 12, 64)
    expected = rope(q, q)
    compiled = torch.compile(lambda a, b: rope(a, b, offset=3), backend="eager", fullgraph=True)
    got = compiled(q, q)
    eager = rope(q, q, offset=3)
    torch.testing.assert_close(got[0], eager[0], rtol=0, atol=1e-6)
    assert not torch.equal(got[0], expected[0])


def test_yarn_null_factor_is_the_ratio_of_the_lengths():
    params = {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096, "rope_theta": 1e4}
    f = assert_same_as_hf(64, params, 65536)
    explicit = frequencies(64, scaling=dict(params, factor=16.0))
    assert torch.equal(f.inv_freq, explicit.inv_freq) and f.attention_scaling == explicit.attention_scaling
    with pytest.raises(rotary.ConfigError, match="needs 'factor' or 'max_position_embeddings'"):
        frequencies(64, scaling=params)
