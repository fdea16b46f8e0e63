"""RotaryAttention: against a float64 reference, KV-cache decoding, padding, GQA/MQA, dtypes, compile."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.nn import KVCache, RotaryAttention, alibi_slopes, padding_position_ids


def reference_attention(attn: RotaryAttention, x: torch.Tensor, *, causal: bool, key_mask=None, positions=None):
    """Float64, head by head, with RoPE from rotary.reference: slow and obvious."""
    x = x.double()
    batch, seq_len, _ = x.shape
    h, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim

    def proj(layer, heads):
        w, b = layer.weight.double(), None if layer.bias is None else layer.bias.double()
        return torch.nn.functional.linear(x, w, b).view(batch, seq_len, heads, d).transpose(1, 2)

    q, k, v = proj(attn.q_proj, h), proj(attn.k_proj, hk), proj(attn.v_proj, hk)
    positions = torch.arange(seq_len).expand(batch, seq_len) if positions is None else positions
    inv_freq = attn.rope.inv_freq if attn.rope is not None else None
    out = torch.zeros(batch, h, seq_len, d, dtype=torch.float64)
    for b in range(batch):
        for head in range(h):
            kv_head = head // (h // hk)
            qh, kh, vh = q[b, head], k[b, kv_head], v[b, kv_head]
            if inv_freq is not None:
                inter = attn.rope.interleaved
                qh = rotary.reference.rotate_complex(qh, positions[b], inv_freq, interleaved=inter)
                kh = rotary.reference.rotate_complex(kh, positions[b], inv_freq, interleaved=inter)
                if attn.rotary_value:
                    vh = rotary.reference.rotate_complex(vh, positions[b], inv_freq, interleaved=inter)
            scores = qh @ kh.T / math.sqrt(d)
            if isinstance(attn.position_bias, rotary.nn.ALiBi):
                distance = (positions[b][:, None] - positions[b][None, :]).abs().double()
                scores = scores - alibi_slopes(h)[head].double() * distance
            allowed = torch.ones(seq_len, seq_len, dtype=torch.bool)
            if causal:
                allowed = allowed.tril()
            if key_mask is not None:
                allowed = allowed & key_mask[b].bool()[None, :]
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[b, head] = torch.softmax(scores, dim=-1) @ vh
    out = out.transpose(1, 2).reshape(batch, seq_len, h * d)
    w, bias = attn.o_proj.weight.double(), None if attn.o_proj.bias is None else attn.o_proj.bias.double()
    return torch.nn.functional.linear(out, w, bias)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_kv_heads=4),
        dict(num_kv_heads=2, rope=dict(interleaved=True), bias=True),
        dict(num_kv_heads=1),
        dict(num_kv_heads=2, rope=dict(rotary_dim=8)),
        dict(position_bias="alibi"),
        dict(rotary_value=True, rope=dict(interleaved=True)),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_reference(kwargs, causal):
    torch.manual_seed(0)
    if isinstance(kwargs.get("rope"), dict):  # a configured RoPE (head_dim 32 / 4 heads = 8)
        kwargs = dict(kwargs, rope=rotary.RoPE(8, **kwargs["rope"]))
    attn = RotaryAttention(32, 4, causal=causal, **kwargs).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    # the RoPE tables are fp32 by design (cos/sin rounded once from float64), hence 1e-6, not 1e-12
    torch.testing.assert_close(attn(x), reference_attention(attn, x, causal=causal), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("position_bias", [None, "alibi", "relative"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_token_by_token_decoding_equals_full_forward(position_bias, num_kv_heads):
    torch.manual_seed(1)
    attn = RotaryAttention(32, 4, num_kv_heads=num_kv_heads, causal=True, position_bias=position_bias).eval()
    if position_bias == "relative":
        torch.nn.init.normal_(attn.position_bias.bias)  # zero-initialised; make it matter
    x = torch.randn(2, 9, 32)
    full = attn(x)
    cache = KVCache()
    steps = torch.cat([attn(x[:, i : i + 1], cache=cache) for i in range(9)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    assert cache.length == 9
    assert cache.keys.shape == (2, num_kv_heads, 9, 8)


def test_cached_keys_are_stored_rotated():
    torch.manual_seed(2)
    attn = RotaryAttention(16, 2, causal=True)
    x = torch.randn(1, 5, 16)
    cache = KVCache()
    attn(x, cache=cache)
    k = attn.k_proj(x).view(1, 5, 2, 8).transpose(1, 2)
    expected = rotary.reference.rotate_complex(k, torch.arange(5), attn.rope.inv_freq).float()
    torch.testing.assert_close(cache.keys, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache.positions, torch.arange(5)[None])


def test_prefill_then_chunks_equals_full_forward():
    torch.manual_seed(3)
    attn = RotaryAttention(32, 4, num_kv_heads=2, causal=True, position_bias="alibi").eval()
    x = torch.randn(2, 12, 32)
    cache = KVCache()
    parts = [attn(x[:, :5], cache=cache), attn(x[:, 5:8], cache=cache), attn(x[:, 8:], cache=cache)]
    torch.testing.assert_close(torch.cat(parts, dim=1), attn(x), rtol=1e-5, atol=1e-5)


def test_decoding_past_max_position_grows_tables():
    torch.manual_seed(4)
    small = RotaryAttention(16, 2, causal=True, rope=rotary.RoPE(8, max_position=4)).eval()
    big = RotaryAttention(16, 2, causal=True, rope=rotary.RoPE(8, max_position=64)).eval()
    big.load_state_dict(small.state_dict())
    x = torch.randn(1, 20, 16)
    cache = KVCache()
    steps = torch.cat([small(x[:, i : i + 1], cache=cache) for i in range(20)], dim=1)
    torch.testing.assert_close(steps, big(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(steps, reference_attention(small, x, causal=True).float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_left_padding_matches_unpadded_rows(causal):
    torch.manual_seed(5)
    attn = RotaryAttention(32, 4, num_kv_heads=1, causal=causal, position_bias="alibi").eval()
    short, long = torch.randn(1, 4, 32), torch.randn(1, 7, 32)
    pad = torch.randn(1, 3, 32)  # garbage in the padded slots must not leak
    x = torch.cat((torch.cat((pad, short), dim=1), long))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    out = attn(x, attention_mask=mask, position_ids=padding_position_ids(mask))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 3:], attn(short)[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1], attn(long)[0], rtol=1e-5, atol=1e-5)


def test_left_padded_prompt_then_decoding():
    torch.manual_seed(6)
    attn = RotaryAttention(32, 4, num_kv_heads=2, causal=True).eval()
    short, pad = torch.randn(1, 6, 32), torch.randn(1, 2, 32)
    prompt = torch.cat((pad, short[:, :3]), dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    cache = KVCache()
    outs = [attn(prompt, attention_mask=mask, position_ids=padding_position_ids(mask), cache=cache)[:, 2:]]
    for i in range(3, 6):
        mask = torch.cat((mask, torch.ones(1, 1, dtype=mask.dtype)), dim=1)
        outs.append(attn(short[:, i : i + 1], attention_mask=mask, cache=cache))  # positions continue the cache
    torch.testing.assert_close(torch.cat(outs, dim=1), attn(short), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.positions, torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5]]))


def test_output_depends_only_on_relative_positions():
    torch.manual_seed(7)
    for bias in (None, "alibi", "relative"):
        attn = RotaryAttention(32, 4, causal=True, position_bias=bias).double()
        x = torch.randn(2, 6, 32, dtype=torch.float64)
        shifted = attn(x, position_ids=torch.arange(100, 106))
        torch.testing.assert_close(shifted, attn(x), rtol=1e-6, atol=1e-6)


def test_rope_changes_the_output():
    torch.manual_seed(8)
    attn = RotaryAttention(32, 4, causal=False)
    nope = RotaryAttention(32, 4, causal=False, rope=False)
    nope.load_state_dict(attn.state_dict())
    x = torch.randn(1, 6, 32)
    assert not torch.allclose(attn(x), nope(x), atol=1e-3)
    # without positions, a non-causal layer is permutation-equivariant
    perm = torch.randperm(6)
    torch.testing.assert_close(nope(x[:, perm]), nope(x)[:, perm], rtol=1e-5, atol=1e-6)


def test_shared_rope_module():
    rope = rotary.RoPE(8, max_position=16)
    a, b = RotaryAttention(32, 4, rope=rope), RotaryAttention(32, 4, rope=rope)
    assert a.rope is b.rope is rope


def test_bf16_close_to_fp32():
    torch.manual_seed(9)
    attn = RotaryAttention(64, 4, num_kv_heads=2, causal=True)
    x = torch.randn(2, 16, 64)
    expected = attn(x)
    attn_bf16 = attn.to(torch.bfloat16)
    assert attn_bf16.rope.inv_freq.dtype == torch.float32  # tables stay fp32
    out = attn_bf16(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.03)


def test_gradients_reach_every_parameter():
    torch.manual_seed(10)
    attn = RotaryAttention(32, 4, num_kv_heads=2, causal=True, position_bias="relative", rotary_value=True, bias=True)
    x = torch.randn(2, 5, 32, requires_grad=True)
    attn(x).pow(2).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gradcheck_float64():
    torch.manual_seed(11)
    attn = RotaryAttention(8, 2, causal=True, position_bias="alibi").double()
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: attn(t), (x,))


def test_dropout_only_in_training():
    torch.manual_seed(12)
    attn = RotaryAttention(32, 4, dropout=0.5)
    x = torch.randn(1, 8, 32)
    attn.train()
    assert not torch.allclose(attn(x), attn(x))
    attn.eval()
    torch.testing.assert_close(attn(x), attn(x))


@pytest.mark.slow
def test_torch_compile_without_graph_breaks():
    torch.manual_seed(13)
    attn = RotaryAttention(32, 4, num_kv_heads=2, causal=True, position_bias="alibi").eval()
    x = torch.randn(2, 8, 32)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :2] = 0
    # fullgraph=True raises on any graph break: full forward, padded forward, prefill + cached decoding. Dynamo
    # alone (the eager backend): graph breaks are Dynamo's; AOT autograd of the rotations is tests/test_compile.py's
    compiled = torch.compile(attn, fullgraph=True, backend="eager", dynamic=True)
    torch.testing.assert_close(compiled(x), attn(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled(x, attention_mask=mask), attn(x, attention_mask=mask), rtol=1e-5, atol=1e-5)
    cache = KVCache()
    steps = [compiled(x[:, :4], cache=cache)] + [compiled(x[:, i : i + 1], cache=cache) for i in range(4, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), attn(x), rtol=1e-5, atol=1e-5)
    for args in ((x,), (x[:, :3],)):
        explanation = torch._dynamo.explain(attn)(*args, attention_mask=mask[:, : args[0].shape[1]])
        assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(hidden_size=32, num_heads=4, num_kv_heads=3), "multiple of num_kv_heads=3"),
        (dict(hidden_size=30, num_heads=4), "hidden_size=30 is not divisible"),
        (dict(hidden_size=32, num_heads=0), "num_heads must be a positive int"),
        (dict(hidden_size=32, num_heads=4, position_bias="t5"), "position_bias must be"),
        (dict(hidden_size=32, num_heads=4, rope=False, rotary_value=True), "rotary_value=True needs a rope"),
        (dict(hidden_size=32, num_heads=4, dropout=1.5), "dropout must be in"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryAttention(**kwargs)


def test_rope_of_wrong_type():
    with pytest.raises(TypeError, match="rope must be True, False or an nn.Module"):
        RotaryAttention(32, 4, rope="yes")


def test_forward_errors():
    attn = RotaryAttention(32, 4, causal=True)
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match="hidden_states must be"):
        attn(x[0])
    with pytest.raises(ValueError, match="width 16"):
        attn(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"attention_mask must be \[B, T\] = \[2, 5\]"):
        attn(x, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="only 0 and 1"):
        attn(x, attention_mask=torch.full((2, 5), 2))
    with pytest.raises(ValueError, match="additive float masks are not accepted"):
        attn(x, attention_mask=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="S=3 positions but the input has S=5"):
        attn(x, position_ids=torch.arange(3))
    with pytest.raises(TypeError, match="integer dtype"):
        attn(x, position_ids=torch.arange(5.0))
    with pytest.raises(ValueError, match="the cache holds a batch of 2 but hidden_states has batch 1"):
        cache = KVCache()
        attn(x, cache=cache)
        attn(x[:1], cache=cache)


@settings(max_examples=15, deadline=None)
@given(
    seq_len=st.integers(1, 12),
    prefill=st.integers(0, 12),
    kv_heads=st.sampled_from([1, 2, 4]),
    interleaved=st.booleans(),
    bias=st.sampled_from([None, "alibi"]),
    seed=st.integers(0, 2**16),
)
def test_property_cached_decoding_equals_full(seq_len, prefill, kv_heads, interleaved, bias, seed):
    torch.manual_seed(seed)
    attn = RotaryAttention(
        16, 4, num_kv_heads=kv_heads, causal=True, rope=rotary.RoPE(4, interleaved=interleaved), position_bias=bias
    )
    x = torch.randn(2, seq_len, 16)
    prefill = min(prefill, seq_len)
    cache = KVCache()
    parts = [attn(x[:, :prefill], cache=cache)] if prefill else []
    parts += [attn(x[:, i : i + 1], cache=cache) for i in range(prefill, seq_len)]
    steps = torch.cat(parts, dim=1)
    torch.testing.assert_close(steps, attn(x), rtol=1e-5, atol=1e-5)
    # and both are the attention: the float64 reference (head by head, rotary.reference's rotation, the paper's slopes)
    torch.testing.assert_close(steps, reference_attention(attn, x, causal=True).float(), rtol=1e-5, atol=1e-5)
