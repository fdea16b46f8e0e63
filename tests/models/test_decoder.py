"""Decoder: cached decoding equals recomputation for every position encoding, padding, GQA, dtypes."""

from __future__ import annotations

import pytest
import torch

import rotary
from rotary.models import POSITION_ENCODINGS, Decoder, DecoderConfig, PositionEncoding, register_position_encoding

ENCODINGS = ["rope", "none", "learned", "sinusoidal", "alibi"]


def small(position_encoding="rope", **kw):
    torch.manual_seed(0)
    config = DecoderConfig(
        vocab_size=50,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position=64,
        position_encoding=position_encoding,
        **kw,
    )
    return Decoder(config).eval()


def test_registry_has_every_encoding():
    assert set(ENCODINGS) <= set(POSITION_ENCODINGS)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_incremental_logits_equal_full_forward(encoding):
    model = small(encoding)
    ids = torch.randint(50, (2, 10))
    full = model(ids)
    cache = model.new_cache()
    steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, i : i + 1], cache=cache) for i in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_generate_with_cache_equals_recomputation(encoding):
    model = small(encoding)
    ids = torch.randint(50, (3, 5))
    cached = model.generate(ids, 12)
    assert cached.shape == (3, 17)
    assert cached[:, :5].equal(ids)
    assert cached.equal(model.generate(ids, 12, use_cache=False))


@pytest.mark.parametrize("encoding", ["rope", "learned", "alibi"])
def test_left_padded_batch_generates_like_single_rows(encoding):
    model = small(encoding)
    a, b = torch.randint(1, 50, (1, 3)), torch.randint(1, 50, (1, 6))
    batch = torch.cat((torch.cat((torch.zeros(1, 3, dtype=torch.long), a), dim=1), b))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1] * 6])
    out = model.generate(batch, 5, attention_mask=mask)
    assert out[0, 3:].equal(model.generate(a, 5)[0])
    assert out[1].equal(model.generate(b, 5)[0])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_causality(encoding):
    model = small(encoding)
    ids = torch.randint(50, (1, 8))
    other = ids.clone()
    other[0, 5:] = (other[0, 5:] + 1) % 50
    torch.testing.assert_close(model(ids)[:, :5], model(other)[:, :5])


def test_rope_is_shared_and_encodings_differ():
    model = small("rope")
    ropes = {id(layer.attn.rope) for layer in model.layers}
    assert len(ropes) == 1
    nope = small("none")
    nope.load_state_dict(model.state_dict())
    ids = torch.randint(50, (1, 6))
    assert not torch.allclose(model(ids), nope(ids), atol=1e-4)


def test_generation_past_max_position_grows_rope_tables():
    model = small("rope")  # max_position=64
    ids = torch.randint(50, (1, 60))
    out = model.generate(ids, 20)
    assert out.equal(model.generate(ids, 20, use_cache=False))


def test_learned_positions_cannot_exceed_table():
    model = small("learned")
    with pytest.raises(ValueError, match="beyond the learned table of max_position=64"):
        model(torch.randint(50, (1, 65)))


def test_rope_scaling_and_interleaving_are_passed_on():
    model = small("rope", rope_scaling={"rope_type": "default"}, rope_interleaved=True, rope_base=500.0)
    rope = model.layers[0].attn.rope
    assert rope.interleaved and rope.freqs.base == 500.0 and rope.freqs.rope_type == "default"


def test_any_registered_rope_scaling_reaches_the_tables():
    """Scaling methods plug in through rotary's rope_type registry; a stand-in type proves the wiring."""
    from rotary.frequencies import ROPE_TYPES, default_inv_freq, register_rope_type

    def _halved(head_dim, base, rotary_dim, params, seq_len):
        return default_inv_freq(base, rotary_dim) / params["factor"], 1.5

    with ROPE_TYPES.scope():
        register_rope_type("test-halved")(_halved)
        model = small("rope", rope_scaling={"rope_type": "test-halved", "factor": 2.0})
        rope = model.layers[0].attn.rope
        torch.testing.assert_close(rope.inv_freq, rotary.frequencies(8).inv_freq / 2)
        assert rope.attention_scaling == 1.5
        ids = torch.randint(50, (1, 6))
        assert model.generate(ids, 4).equal(model.generate(ids, 4, use_cache=False))
    assert "test-halved" not in ROPE_TYPES
    with pytest.raises(ValueError, match="unknown rope_type 'nope'"):
        small("rope", rope_scaling={"rope_type": "nope"})


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ],
)
def test_scaled_rope_decoding(scaling):
    model = small("rope", rope_scaling=scaling)
    rope = model.layers[0].attn.rope
    expected = rotary.frequencies(8, scaling=scaling)
    torch.testing.assert_close(rope.inv_freq, expected.inv_freq)
    assert rope.attention_scaling == expected.attention_scaling
    ids = torch.randint(50, (2, 5))
    assert model.generate(ids, 30).equal(model.generate(ids, 30, use_cache=False))


def test_tied_embeddings():
    model = small(tie_word_embeddings=True)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in small().parameters())


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_gradients_reach_every_parameter(encoding):
    model = small(encoding).train()
    model.loss(torch.randint(50, (2, 8))).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_training_reduces_loss():
    model = small().train()
    ids = torch.arange(20).repeat(2, 1) % 50
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model.loss(ids).item()
    for _ in range(30):
        opt.zero_grad()
        loss = model.loss(ids)
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_bf16():
    model = small()
    ids = torch.randint(50, (2, 7))
    expected = model(ids)
    model = model.to(torch.bfloat16)
    assert model.layers[0].attn.rope.inv_freq.dtype == torch.float32
    logits = model(ids)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), expected, rtol=0.05, atol=0.05)


def test_sampling_is_reproducible_with_a_generator():
    model = small()
    ids = torch.randint(50, (2, 3))
    a = model.generate(ids, 6, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    b = model.generate(ids, 6, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    assert a.equal(b)


def test_new_encoding_is_one_registration():
    """How xPos will plug in: any module with RoPE's q/k interface."""

    class HalfAngleRoPE(rotary.RoPE):  # a stand-in for a future variant
        pass

    with POSITION_ENCODINGS.scope():
        register_position_encoding("test-variant")(
            lambda c: PositionEncoding(rope=HalfAngleRoPE(c.head_dim, base=77.0))
        )
        model = small("test-variant")
        assert isinstance(model.layers[0].attn.rope, HalfAngleRoPE)
        ids = torch.randint(50, (1, 6))
        assert model.generate(ids, 4).equal(model.generate(ids, 4, use_cache=False))
    assert "test-variant" not in POSITION_ENCODINGS


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            dict(position_encoding="t5"),
            "unknown position_encoding 't5'; registered: alibi, learned, none, p_rope, rope, rope_alibi, "
            "rope_relative, sinusoidal, xpos",
        ),
        (dict(hidden_size=30), "hidden_size=30 is not divisible by num_heads=4"),
        (dict(num_layers=0), "num_layers must be a positive int, got 0"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DecoderConfig(**{"num_heads": 4, **kwargs})


def test_forward_and_generate_errors():
    model = small()
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        model(torch.randn(1, 4))
    with pytest.raises(ValueError, match="cache has 1 entries but the model has 2 layers"):
        model(torch.randint(50, (1, 4)), cache=[rotary.nn.KVCache()])
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0, got -1"):
        model.generate(torch.randint(50, (1, 4)), -1)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        model.generate(torch.randint(50, (1, 4)), 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        model.generate(torch.randint(50, (1, 4)), 2, temperature=1.0, top_k=0)
