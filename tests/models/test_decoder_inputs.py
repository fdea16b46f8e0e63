"""Decoder (models/decoder.py): inputs, configurations and caches that are checked, and uses that must work
(threads sharing one model, the meta device, copies and saves)."""

import copy
import io
import pickle

import pytest
import torch

import rotary
from helpers import small_lm


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


@pytest.mark.parametrize("over", [{"position_encoding": "xpos"}, {"no_rope_layers": [1, 0]}])
def test_variant_decoders_build_on_the_meta_device(over):
    with torch.device("meta"):
        lm = small_lm(**over)
    lm.to_empty(device="cpu")
    ref = small_lm(**over)
    lm.load_state_dict(ref.state_dict())
    ids = torch.randint(50, (1, 9))
    assert torch.equal(lm(ids), ref(ids))
