"""The hybrid position encodings: RoPE plus ALiBi, RoPE plus a learned relative bias."""

import pytest
import torch

from rotary import RoPE
from rotary.models import POSITION_ENCODINGS, Decoder, DecoderConfig
from rotary.nn import ALiBi, RelativePositionBias


def build(encoding: str) -> Decoder:
    torch.manual_seed(0)
    return Decoder(
        DecoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, position_encoding=encoding)
    ).eval()


@pytest.mark.parametrize("encoding, bias", [("rope_alibi", ALiBi), ("rope_relative", RelativePositionBias)])
def test_hybrid_has_both_parts_and_each_changes_the_output(encoding, bias):
    assert encoding in POSITION_ENCODINGS
    model = build(encoding)
    for layer in model.layers:
        assert isinstance(layer.attn.rope, RoPE) and isinstance(layer.attn.position_bias, bias)
    ids = torch.randint(64, (2, 12), generator=torch.Generator().manual_seed(1))
    if bias is RelativePositionBias:  # zero-initialised: give it values so it matters
        with torch.no_grad():
            model.layers[0].attn.position_bias.bias.normal_(0, 1.0)
    out = model(ids)
    for other in ("rope", "alibi" if bias is ALiBi else "none"):
        single = build(other)
        single.load_state_dict(model.state_dict(), strict=False)
        assert not torch.allclose(single(ids), out, atol=1e-4), f"{encoding} equals {other}: one part is missing"


@pytest.mark.parametrize("encoding", ["rope_alibi", "rope_relative"])
def test_hybrid_decodes_with_the_cache_as_in_one_forward(encoding):
    model = build(encoding)
    ids = torch.randint(64, (2, 10), generator=torch.Generator().manual_seed(2))
    full = model(ids)
    cache = model.new_cache()
    steps = torch.cat([model(ids[:, i : i + 1], cache=cache) for i in range(10)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)


def test_relative_bias_learns():
    model = build("rope_relative").train()
    ids = torch.randint(64, (2, 12), generator=torch.Generator().manual_seed(3))
    model.loss(ids).backward()
    assert model.layers[0].attn.position_bias.bias.grad.abs().sum() > 0
