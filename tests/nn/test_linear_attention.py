"""RotaryLinearAttention: equals the documented formula (restated here in float64 on rotary.reference's rotation and
transformers' frequencies, sharing no code with the layer) and the O(N²) reference, is shift-invariant, never needs
N×N."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import rotary
from helpers import hf_frequencies
from rotary.nn import RotaryAttention, RotaryLinearAttention, linear_attention_reference, rotary_linear_attention


def _qkv(seq_len=37, dim=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, seq_len, dim, generator=g, dtype=dtype) for _ in range(3)]


# The documented formula, restated in float64 with nothing from rotary but rotary.reference (module docstring of
# rotary.nn.linear_attention, docs/attention.md "rotary.nn.RotaryLinearAttention"):
#   out_i = Σ_{j kept} [R_i f(q_i)]ᵀ[R_j f(k_j)] v_j / (Σ_{j kept} g(q_i)ᵀ g(k_j) + eps)
# elu, relu: f = g = φ (elu+1 or relu), the rotation in the numerator only; cosine: f = g = [q̂, 1] with the
# rotation applied to q̂ in both sums. j is kept unless causal and j > i, or key_padding_mask[b, j] is 0.
TABLE_ROUNDING = 2.0**-25  # |cos - fl32(cos)|, |sin - fl32(sin)| for values in [-1, 1]: half an fp32 ulp below 1
FLOAT64_SUMS = 1e-12  # float64 rounding of sums of <= 40 * 13 products: (40 + 13) * 2**-53 = 6e-15, with 100x room


def hf_inv_freq(dim: int) -> torch.Tensor:
    """transformers' default frequencies at base 10000 (restated in ``helpers.hf_frequencies``), in float64."""
    return hf_frequencies({"rope_type": "default"}, 10000.0, dim)[0].double()


def _oracle_features(x: torch.Tensor, positions: torch.Tensor, feature_map: str, interleaved: bool):
    """(numerator features, denominator features, whether the denominator's are rotated) of ``x`` [B, H, S, D]."""

    def rotate(t: torch.Tensor) -> torch.Tensor:
        return rotary.reference.rotate_complex(t, positions, hf_inv_freq(x.shape[-1]), interleaved=interleaved)

    if feature_map == "cosine":
        unit = x / x.norm(dim=-1, keepdim=True)
        feature = torch.cat((rotate(unit), torch.ones_like(x[..., :1])), dim=-1)
        return feature, feature, True
    phi = torch.where(x > 0, x + 1.0, torch.exp(x)) if feature_map == "elu" else torch.where(x > 0, x, 0.0)
    return rotate(phi), phi, False


def linear_attention_oracle(
    q, k, v, positions, *, feature_map="elu", causal=False, interleaved=False, key_padding_mask=None, eps=1e-6
):
    """(out, bound): the formula in float64, and per element how far an output computed from fp32 cos/sin tables
    may lie from it. A table entry off by at most ``TABLE_ROUNDING`` moves a rotated pair by at most
    ``sqrt(2) * TABLE_ROUNDING`` times its length, so a score fᵀf' by at most ``2 sqrt(2) TABLE_ROUNDING |f| |f'|``
    (3 covers the second-order term); the quotient N / (D + eps) then moves by (δN + |out| δD) / (D + eps)."""
    q, k, v = q.double(), k.double(), v.double()
    fq, gq, den_rotated = _oracle_features(q, positions, feature_map, interleaved)
    fk, gk, _ = _oracle_features(k, positions, feature_map, interleaved)
    seq_len = q.shape[2]
    index = torch.arange(seq_len)
    keep = index[:, None] >= index[None, :] if causal else torch.ones(seq_len, seq_len, dtype=torch.bool)  # j <= i
    keep = keep.expand(q.shape[0], 1, seq_len, seq_len)
    if key_padding_mask is not None:
        keep = keep & (key_padding_mask != 0)[:, None, None, :]
    keep = keep.double()
    numerator = (fq @ fk.transpose(-1, -2) * keep) @ v
    denominator = (gq @ gk.transpose(-1, -2) * keep).sum(-1, keepdim=True) + eps
    out = numerator / denominator
    norms = lambda a, b: a.norm(dim=-1)[..., :, None] * b.norm(dim=-1)[..., None, :] * keep  # noqa: E731
    numerator_size = norms(fq, fk) @ v.abs()
    denominator_size = norms(gq, gk).sum(-1, keepdim=True)
    table_part = 3 * TABLE_ROUNDING * (numerator_size + out.abs() * denominator_size * den_rotated)
    rounding_part = FLOAT64_SUMS * (numerator_size + out.abs() * denominator_size)
    return out, (table_part + rounding_part) / denominator


def assert_matches_oracle(actual, expected_and_bound):
    """``actual`` lies within the oracle's bound of the oracle's output, element by element."""
    expected, bound = expected_and_bound
    error = (actual.double() - expected).abs()
    if not bool((error <= bound).all()):
        worst = int((error - bound).flatten().argmax())
        raise AssertionError(
            f"off the documented formula by {float(error.flatten()[worst]):.3g} at flat index {worst} (bound "
            f"{float(bound.flatten()[worst]):.3g}): {float(actual.flatten()[worst])} vs "
            f"{float(expected.flatten()[worst])}"
        )


@functools.cache
def _quadratic_case(feature_map, causal, interleaved):
    """``(q, k, v, cos, sin)`` of ``_qkv()`` at positions 0..36, its O(N²) reference and its oracle, once per option
    set: the chunk sizes, which only the O(N) path reads, share them."""
    q, k, v = _qkv()
    cos, sin = rotary.RoPE(16, interleaved=interleaved).cos_sin(torch.arange(37))
    opts = dict(feature_map=feature_map, causal=causal, interleaved=interleaved)
    reference = linear_attention_reference(q, k, v, cos, sin, **opts)
    return (q, k, v, cos, sin), reference, linear_attention_oracle(q, k, v, torch.arange(37), **opts)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "cosine"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 8, 64])
def test_equals_quadratic_reference(feature_map, causal, interleaved, chunk_size):
    """The O(N) path equals the O(N²) reference, and both equal the documented formula (the oracle above)."""
    inputs, reference, oracle = _quadratic_case(feature_map, causal, interleaved)
    opts = dict(feature_map=feature_map, causal=causal, interleaved=interleaved)
    fast = rotary_linear_attention(*inputs, chunk_size=chunk_size, **opts)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)
    assert_matches_oracle(fast, oracle)
    assert_matches_oracle(reference, oracle)


def test_reference_is_su_formula_written_out():
    """Check the layer, pair by pair, against the documented formula written out for one query."""
    q, k, v = (t[:1, :1, :5] for t in _qkv(seq_len=5, dim=4))
    inv_freq = hf_inv_freq(4)
    rot = lambda x: rotary.reference.rotate_matrix(x, torch.arange(5), inv_freq)  # noqa: E731
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    rq, rk = rot(phi_q)[0, 0], rot(phi_k)[0, 0]
    i = 3  # causal: j <= 3
    numerator = sum((rq[i] @ rk[j]) * v[0, 0, j] for j in range(i + 1))
    denominator = sum(phi_q[0, 0, i] @ phi_k[0, 0, j] for j in range(i + 1))
    cos, sin = rotary.RoPE(4).cos_sin(torch.arange(5))
    out = rotary_linear_attention(q, k, v, cos, sin, causal=True, eps=0.0)
    torch.testing.assert_close(out[0, 0, i], numerator / denominator, rtol=1e-6, atol=1e-6)


def test_cosine_scheme_formula():
    """``sim = 1 + cos(R_i q_i, R_j k_j)`` written out, rotated by rotary.reference (docs/attention.md)."""
    q, k, v = (t[:1, :1, :6] for t in _qkv(seq_len=6, dim=8))
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(6))
    rq, rk = (rotary.reference.rotate_complex(t, torch.arange(6), hf_inv_freq(8)) for t in (q, k))
    sim = 1 + torch.nn.functional.normalize(rq, dim=-1) @ torch.nn.functional.normalize(rk, dim=-1).transpose(-1, -2)
    expected = (sim @ v) / sim.sum(-1, keepdim=True)
    out = rotary_linear_attention(q, k, v, cos, sin, feature_map="cosine", eps=0.0)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("feature_map", ["elu", "cosine"])
@pytest.mark.parametrize("causal", [False, True])
def test_output_unchanged_when_positions_shift(feature_map, causal):
    torch.manual_seed(0)
    attn = RotaryLinearAttention(32, 2, feature_map=feature_map, causal=causal, chunk_size=5).double()
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    shifted = attn(x, position_ids=torch.arange(1000, 1023))
    torch.testing.assert_close(shifted, attn(x), rtol=1e-6, atol=1e-6)  # fp32 tables: 1e-6, not 1e-12


def test_positions_matter():
    torch.manual_seed(1)
    attn = RotaryLinearAttention(32, 2)
    x = torch.randn(1, 10, 32)
    reversed_positions = attn(x, position_ids=torch.arange(9, -1, -1))
    assert not torch.allclose(reversed_positions, attn(x), atol=1e-4)


def test_causal_output_ignores_the_future():
    torch.manual_seed(2)
    attn = RotaryLinearAttention(32, 4, causal=True, chunk_size=4)
    x = torch.randn(1, 20, 32)
    y = x.clone()
    y[:, 13:] = torch.randn(1, 7, 32)
    torch.testing.assert_close(attn(x)[:, :13], attn(y)[:, :13])


def test_key_padding_mask_equals_dropping_the_keys():
    q, k, v = _qkv(seq_len=10)
    cos, sin = rotary.RoPE(16).cos_sin(torch.arange(10))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[:, 7:] = False
    out = rotary_linear_attention(q, k, v, cos, sin, key_padding_mask=mask)
    reference = linear_attention_reference(q, k, v, cos, sin, key_padding_mask=mask)
    torch.testing.assert_close(out, reference, rtol=1e-10, atol=1e-10)
    assert_matches_oracle(out, linear_attention_oracle(q, k, v, torch.arange(10), key_padding_mask=mask))
    # queries 0..6 with keys 0..6 only: the same as a 7-token sequence
    short = rotary_linear_attention(q[:, :, :7], k[:, :, :7], v[:, :, :7], cos[:7], sin[:7])
    torch.testing.assert_close(out[:, :, :7], short, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("interleaved", [False, True])
def test_masks_eps_and_positions_follow_the_documented_formula(interleaved):
    """Every feature map, causal or not, with a 0/1 key_padding_mask (0 = a key out of both sums), eps=0.5 added to
    the denominator and positions from 3: the O(N) path and the reference equal the oracle (module docstring)."""
    q, k, v = (t[:, :1, :9, :6] for t in _qkv(seq_len=9, dim=6))
    positions = torch.arange(3, 12)
    cos, sin = rotary.RoPE(6, interleaved=interleaved).cos_sin(positions)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 1, 0, 0]])
    for feature_map in ("elu", "relu", "cosine"):
        for causal in (False, True):
            opts = dict(feature_map=feature_map, causal=causal, interleaved=interleaved, key_padding_mask=mask, eps=0.5)
            oracle = linear_attention_oracle(q, k, v, positions, **opts)
            assert_matches_oracle(rotary_linear_attention(q, k, v, cos, sin, chunk_size=4, **opts), oracle)
            assert_matches_oracle(linear_attention_reference(q, k, v, cos, sin, **opts), oracle)


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_no_n_by_n_intermediate(causal):
    """No op of the fast path produces anything larger than the [B, H, N, D] inputs (N² would be 64x larger)."""
    batch, heads, seq_len, dim, chunk = 2, 3, 512, 8, 16
    q, k, v = (torch.randn(batch, heads, seq_len, dim) for _ in range(3))
    cos, sin = rotary.RoPE(dim).cos_sin(torch.arange(seq_len))
    with LargestTensor() as spy:
        rotary_linear_attention(q, k, v, cos, sin, causal=causal, chunk_size=chunk)
    assert spy.largest <= batch * heads * seq_len * dim
    with LargestTensor() as spy_reference:
        linear_attention_reference(q, k, v, cos, sin, causal=causal)
    assert spy_reference.largest >= batch * heads * seq_len * seq_len  # the spy does see N×N when it exists


def test_bf16_and_gradients():
    torch.manual_seed(3)
    attn = RotaryLinearAttention(32, 2, causal=True, chunk_size=8)
    x = torch.randn(2, 20, 32, requires_grad=True)
    attn(x).sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    expected = attn(x.detach())
    out = attn.to(torch.bfloat16)(x.detach().bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def test_gradcheck():
    q, k, v = (t[:1, :1, :6, :4].requires_grad_() for t in _qkv())
    cos, sin = rotary.RoPE(4).cos_sin(torch.arange(6))
    fn = lambda a, b, c: rotary_linear_attention(a, b, c, cos, sin, causal=True, chunk_size=4)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_errors():
    q, k, v = _qkv(seq_len=4)
    cos, sin = rotary.RoPE(16).cos_sin(torch.arange(4))
    with pytest.raises(ValueError, match="unknown feature_map 'gelu'"):
        rotary_linear_attention(q, k, v, cos, sin, feature_map="gelu")
    with pytest.raises(ValueError, match="chunk_size must be a positive int, got 0"):
        rotary_linear_attention(q, k, v, cos, sin, chunk_size=0)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        rotary_linear_attention(q, k[:, :2], v, cos, sin)
    with pytest.raises(ValueError, match="v must be"):
        rotary_linear_attention(q, k, v[:, :, :3], cos, sin)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        rotary_linear_attention(q, k, v, cos, sin, key_padding_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="unknown feature_map"):
        RotaryLinearAttention(32, 2, feature_map="softmax")
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        RotaryLinearAttention(32, 3)
    with pytest.raises(ValueError, match="S=3 positions but the input has S=4"):
        RotaryLinearAttention(32, 2)(torch.randn(1, 4, 32), position_ids=torch.arange(3))


@settings(max_examples=25, deadline=None)
@given(
    seq_len=st.integers(1, 40),
    half_dim=st.integers(1, 6),
    chunk_size=st.integers(1, 17),
    feature_map=st.sampled_from(["elu", "relu", "cosine"]),
    causal=st.booleans(),
    offset=st.integers(0, 10_000),
    seed=st.integers(0, 2**16),
)
def test_property_fast_equals_reference(seq_len, half_dim, chunk_size, feature_map, causal, offset, seed):
    g = torch.Generator().manual_seed(seed)
    dim = 2 * half_dim
    q, k, v = (torch.randn(1, 2, seq_len, dim, generator=g, dtype=torch.float64) for _ in range(3))
    cos, sin = rotary.RoPE(dim).cos_sin(torch.arange(offset, offset + seq_len))
    opts = dict(feature_map=feature_map, causal=causal)
    fast = rotary_linear_attention(q, k, v, cos, sin, chunk_size=chunk_size, **opts)
    reference = linear_attention_reference(q, k, v, cos, sin, **opts)
    torch.testing.assert_close(fast, reference, rtol=1e-9, atol=1e-9)
    oracle = linear_attention_oracle(q, k, v, torch.arange(offset, offset + seq_len), **opts)
    assert_matches_oracle(fast, oracle)
    assert_matches_oracle(reference, oracle)


def test_linear_attention_agrees_with_softmax_attention_on_masks(gen):
    x = torch.randn(2, 6, 32, generator=gen)
    for attn in (RotaryAttention(32, 2, causal=True), RotaryLinearAttention(32, 2, causal=True)):
        with pytest.raises(ValueError, match="additive float masks are not accepted"):
            attn(x, attention_mask=torch.zeros(2, 6))
        with pytest.raises(ValueError, match="only 0 and 1"):
            attn(x, attention_mask=torch.full((2, 6), 2))
    out = RotaryLinearAttention(32, 2, causal=True)(x[:, :0])
    assert out.shape == (2, 0, 32)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: RotaryLinearAttention(16, 2, eps=-1e-6), "eps must be a finite number >= 0, got -1e-06"),
        (lambda: RotaryLinearAttention(16, 2, eps=float("nan")), "eps must be a finite number >= 0, got nan"),
        (lambda: RotaryLinearAttention(12, 4), "head_dim = hidden_size // num_heads = 3 must be even"),
        (lambda: RotaryLinearAttention(16, 2, bias="no"), "bias must be True or False"),
        (
            lambda: rotary.nn.linear_attention_reference(
                *[torch.randn(1, 1, 2, 4)] * 3, torch.ones(2, 4), torch.zeros(2, 4), feature_map="tanh"
            ),
            "unknown feature_map 'tanh'",
        ),
        (lambda: rotary.nn.alibi_slopes(10**9), "num_heads=1000000000 is more than 65536 heads"),
        (
            lambda: rotary.nn.RelativePositionBias(4, 10**9),
            r"max_distance=1000000000\) would learn a table of 29.8 GiB",
        ),
        (lambda: rotary.nn.LearnedPositionEmbedding(10**9, 1024), r"would need 3.7 TiB for its table"),
        (lambda: rotary.nn.SinusoidalPositionEmbedding(8, base=1.0), "base must be a finite number > 1, got 1.0"),
        (
            lambda: rotary.nn.SinusoidalPositionEmbedding(8, base=float("inf")),
            "base must be a finite number > 1, got inf",
        ),
        (lambda: rotary.models.decoder.RMSNorm(8, eps=-1.0), "eps must be a finite number > 0, got -1.0"),
        (lambda: rotary.models.decoder.SwiGLU(8, 0), "intermediate_size must be a positive int, got 0"),
    ],
)
def test_layer_parameters_out_of_range_are_named(build, match):
    """Were accepted (NaN outputs, a table with no rotation), a ZeroDivisionError, or an allocation
    the operating system killed the process for."""
    with pytest.raises((TypeError, ValueError), match=match):
        build()
