"""The sequence encoders (audio, codecs, byte patches) against transformers 5.23's own code, run on tiny models.

Each type of rotary.hf.encoder_tables is built once from a tiny config (one layer, random weights) and run
once with its RoPE functions recorded (tests/hf/encoder_models.py):

- SEQUENCE_ROPE: rotary's ``RoPE.from_hf_config`` of the model's config gives the cos/sin its rotary embedding
  gave, at the positions the model used, and rotates the q and k of every recorded apply call into the model's
  outputs (a wrong pairing, frequency, rotated width or scaling fails);
- NO_ROPE: the forward pass ran and applied no RoPE function at all.
"""

from __future__ import annotations

import pytest
import torch

import rotary
from rotary.hf import architectures
from rotary.hf.encoder_tables import NO_ROPE, SEQUENCE_ROPE
from rotary.hf.vision_tables import ENCODER_STATUS

pytest.importorskip("transformers")
from hf import encoder_models as em  # noqa: E402


def _split(calls):
    tables = [c for c in calls if c.name.endswith(".forward")]
    applies = [c for c in calls if not c.name.endswith(".forward") and "Attention" in c.caller]
    return tables, applies


def _positions(call) -> torch.Tensor:
    bound = dict(zip(("self", "x", "position_ids"), call.args)) | call.kwargs
    return bound["position_ids"]


@pytest.mark.parametrize("model_type", sorted(SEQUENCE_ROPE))
def test_sequence_encoder_rope_matches_the_model(model_type):
    model, _, calls, _ = em.record(model_type)
    tables, applies = _split(calls)
    assert tables and applies, f"{model_type}: the forward applied no RoPE ({[c.name for c in calls]})"
    rope = rotary.RoPE.from_hf_config(model.config)
    positions = _positions(tables[0])
    cos, sin = rope.cos_sin(positions.reshape(-1))
    r = cos.shape[-1]
    theirs_cos, theirs_sin = (t.reshape(-1, t.shape[-1]) for t in tables[0].out)
    # one angle per pair; the model hands its table over in either layout (PE's is (i, i + r/2) for pairs (2i, 2i+1))
    interleaved = SEQUENCE_ROPE[model_type] == "interleaved"
    for ours, theirs in ((cos, theirs_cos[:, :r].float()), (sin, theirs_sin[:, :r].float())):
        mine = ours[:, ::2] if interleaved else ours[:, : r // 2]
        as_half, as_pairs = theirs[:, : r // 2], theirs[:, ::2]
        assert torch.allclose(mine, as_half, rtol=1e-5, atol=1e-5) or torch.allclose(
            mine, as_pairs, rtol=1e-5, atol=1e-5
        )
    assert r == theirs_cos.shape[-1] or rope.head_dim > r  # a partial RoPE rotates the first r channels
    for call in applies:
        q, k = call.args[:2]
        q_out, k_out = call.out[:2]
        ours = rope(q.double(), k.double(), position_ids=positions.reshape(-1))
        for mine, want, x in zip(ours, (q_out, k_out), (q, k)):
            torch.testing.assert_close(mine.float(), want, rtol=1e-5, atol=2e-5)
            assert not torch.allclose(mine.float(), x, atol=1e-3)  # it rotates


@pytest.mark.parametrize("model_type", sorted(NO_ROPE))
def test_encoders_without_rope_apply_none(model_type):
    _, _, calls, out = em.record(model_type)
    assert out is not None
    assert calls == [], f"{model_type} applied {[c.name for c in calls]}"
    assert ENCODER_STATUS[model_type] == NO_ROPE[model_type] and NO_ROPE[model_type].startswith("no RoPE: ")


def test_the_tables_are_disjoint_and_read():
    assert not set(SEQUENCE_ROPE) & set(architectures.UNSUPPORTED)
    assert not set(SEQUENCE_ROPE) & set(architectures.PAIRING)
    assert not set(SEQUENCE_ROPE) & set(ENCODER_STATUS)
    assert set(NO_ROPE) <= set(architectures.UNSUPPORTED)
    for model_type in NO_ROPE:
        with pytest.raises(rotary.ConfigError, match=repr(model_type)):
            rotary.RoPE.from_hf_config({"model_type": model_type, "head_dim": 16})
