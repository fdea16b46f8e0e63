"""transfer_position_encoding: every weight outside the position encoding is copied, by name and value;
the new encoding's own weights, and nothing else, keep their fresh initialisation."""

from __future__ import annotations

import pytest
import torch

from rotary.models import Decoder, DecoderConfig, position_state_names, transfer_position_encoding

PAIRS = [
    ("sinusoidal", "rope"),
    ("learned", "rope"),
    ("rope", "learned"),
    ("rope_relative", "alibi"),
    ("alibi", "rope_relative"),
    ("none", "xpos"),
]


def trained(encoding: str, seed: int = 0) -> Decoder:
    """A model whose every weight differs from any fresh initialisation (as if trained)."""
    torch.manual_seed(seed)
    model = Decoder(
        DecoderConfig(
            vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, max_position=48, position_encoding=encoding
        )
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model


@pytest.mark.parametrize("source_encoding, target_encoding", PAIRS)
def test_every_non_position_weight_is_copied_and_nothing_else(source_encoding, target_encoding):
    source = trained(source_encoding)
    before = {k: v.clone() for k, v in source.state_dict().items()}
    torch.manual_seed(123)
    target = transfer_position_encoding(source, target_encoding)
    torch.manual_seed(123)
    fresh = Decoder(target.config)  # what the target's weights were before the copy

    source_position, target_position = position_state_names(source), position_state_names(target)
    copied = set(source.state_dict()) - source_position
    assert copied == set(target.state_dict()) - target_position
    assert len(copied) >= 2 + 2 * 9  # embeddings, head, final norm, and every layer's projections and norms
    for name in copied:  # by name and value
        assert torch.equal(target.state_dict()[name], before[name]), name
        assert not torch.equal(target.state_dict()[name], fresh.state_dict()[name]), f"{name} was not copied"
    for name in target_position:  # the new encoding's own weights: as initialised
        assert torch.equal(target.state_dict()[name], fresh.state_dict()[name]), name
    for name, value in source.state_dict().items():  # the source is untouched
        assert torch.equal(value, before[name]), name
    assert target.config.position_encoding == target_encoding
    assert target.config == DecoderConfig(**{**source.config.__dict__, "position_encoding": target_encoding})


def test_position_state_names_are_the_position_modules_and_nothing_else():
    assert position_state_names(trained("rope")) == set()
    assert position_state_names(trained("sinusoidal")) == set()  # a fixed table: no weights
    assert position_state_names(trained("learned")) == {"embed_positions.embedding.weight"}
    assert position_state_names(trained("rope_relative")) == {f"layers.{i}.attn.position_bias.bias" for i in range(2)}


def test_the_copy_changes_what_the_model_computes_only_through_positions():
    """RoPE at position 0 is the identity, and so is a sinusoidal table at position 0 minus its value there:
    with a single token, the transferred model equals the source without its position embedding."""
    source = trained("learned").eval()
    target = transfer_position_encoding(source, "rope").eval()
    ids = torch.randint(64, (3, 1))
    with torch.no_grad():
        source.embed_positions.embedding.weight.zero_()
        assert torch.allclose(target(ids), source(ids), atol=1e-6)


def test_changes_that_alter_the_shapes_are_refused():
    source = trained("sinusoidal")
    with pytest.raises(ValueError, match="differ outside their position encodings"):
        transfer_position_encoding(source, "rope", num_layers=3)
    with pytest.raises(ValueError, match="in the source and .* in the new model"):
        transfer_position_encoding(source, "rope", intermediate_size=64)
    rope = transfer_position_encoding(source, "rope", rope_base=500.0)  # a change that keeps the shapes
    assert rope.config.rope_base == 500.0 and torch.equal(rope.lm_head.weight, source.lm_head.weight)
