"""Decoder (models/decoder.py): inputs, configurations and caches that are checked, and uses that must work
(threads sharing one model, the meta device, copies and saves)."""

import copy
import io
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rotary
from helpers import NAMED, assert_named, outputs_from_threads, small_lm
from rotary.models import Decoder, DecoderConfig
from rotary.nn import KVCache
from strategies import FAST


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
    rope = rotary.RoPE(
        64, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}, max_position=16
    )
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


def test_one_cache_shared_by_layers_is_refused(gen):
    lm = small_lm()
    ids = torch.randint(50, (1, 5), generator=gen)
    with pytest.raises(ValueError, match="same KVCache object appears for several layers"):
        lm(ids, cache=[KVCache()] * 2)
    caches = lm.new_cache()
    lm(ids, cache=caches)
    with pytest.raises(ValueError, match="already holds another layer's keys"):
        lm(ids[:, :1], cache=caches[::-1])  # swapped between layers


def test_generate_with_right_padding_is_refused(gen):
    lm = small_lm()
    ids = torch.randint(50, (2, 5), generator=gen)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"left padding.*row\(s\) \[0\]"):
        lm.generate(ids, 3, attention_mask=right)
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = lm.generate(ids, 3, attention_mask=left)
    alone = lm.generate(ids[:1, 2:], 3)
    assert torch.equal(out[0, 2:], alone[0])  # a left-padded row continues like its unpadded prompt


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(rope_interleaved="true"), "rope_interleaved must be True or False"),
        (dict(tie_word_embeddings="yes"), "tie_word_embeddings must be True or False"),
        (dict(rope_base="10000"), "rope_base must be a finite number > 0"),
        (dict(rms_norm_eps=-1e-6), "rms_norm_eps must be a finite number > 0"),
        (dict(dropout=1.0), "dropout must be in"),
        (dict(rope_scaling="linear"), "rope_scaling must be a dict"),
    ],
)
def test_decoder_config_values_of_the_wrong_type(over, match):
    with pytest.raises((TypeError, ValueError), match=match):
        small_lm(**over)


def test_models_build_on_the_meta_device():
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    with torch.device("meta"):
        rope = rotary.RoPE(64, scaling=scaling)
        lm = small_lm(rope_scaling=scaling)
    rope.to_empty(device="cpu")
    lm.to_empty(device="cpu")
    ref = rotary.RoPE(64, scaling=scaling)
    q = torch.randn(1, 2, 5, 64)
    assert torch.equal(rope(q, q)[0], ref(q, q)[0])
    lm.load_state_dict(small_lm(rope_scaling=scaling).state_dict())
    assert torch.isfinite(lm(torch.randint(50, (1, 40)))).all()


def test_one_decoder_shared_by_threads(gen, one_intraop_thread):
    # length-dependent (long factors past 16 tokens) but not history-dependent: any interleaving of the
    # threads' calls must give the single-threaded logits
    scaling = {
        "rope_type": "longrope",
        "original_max_position_embeddings": 16,
        "factor": 4.0,
        "short_factor": [1.0 + i / 32 for i in range(4)],
        "long_factor": [1.0 + i for i in range(4)],
    }
    lm = small_lm(rope_scaling=scaling)
    prompts = [torch.randint(50, (1, n), generator=gen) for n in (4, 30, 9, 50)]
    infer = torch.no_grad()(lm.__call__)  # no_grad is per thread: it wraps each call
    want = [infer(p) for p in prompts]
    got = outputs_from_threads(lambda i: infer(prompts[i]), len(prompts))
    for (_, _, i), out in got.items():
        assert torch.equal(out, want[i])


@pytest.mark.parametrize(
    "ids, exc, match",
    [
        (torch.tensor([[1, 50]]), ValueError, "input_ids hold id 50, but vocab_size is 50"),
        (torch.tensor([[1, -100]]), ValueError, "input_ids hold id -100"),
        (torch.tensor([[1, 2]], dtype=torch.int16), TypeError, "input_ids must be int64 or int32, got torch.int16"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_named(ids, exc, match):
    """Were ``IndexError: index out of range in self`` from inside nn.Embedding."""
    lm = small_lm()
    with pytest.raises(exc, match=match):
        lm(ids)
    with pytest.raises(exc, match=match):
        lm.generate(ids, 2)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(generator=3), TypeError, "generator must be a torch.Generator or None, got 3"),
        (dict(use_cache="no"), TypeError, "use_cache must be True or False, got 'no'"),
        (dict(temperature=float("nan")), ValueError, "temperature must be a finite number >= 0"),
        (dict(temperature="1"), ValueError, "temperature must be a finite number >= 0"),
        (
            dict(attention_mask=torch.tensor([[1, 1], [0, 0]])),
            ValueError,
            r"attention_mask row\(s\) \[1\] mark no token",
        ),
    ],
)
def test_generate_arguments_are_checked(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        small_lm().generate(torch.tensor([[1, 2], [3, 4]]), 2, **kwargs)


def test_a_tiny_temperature_samples_the_greedy_token(gen):
    """logits / 1e-40 overflowed to inf, and softmax(inf - inf) = NaN made sampling fail."""
    lm = small_lm()
    ids = torch.randint(50, (2, 4), generator=gen)
    greedy = lm.generate(ids, 3)
    tiny = lm.generate(ids, 3, temperature=1e-40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(tiny, greedy)


DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 16}


def test_one_dynamic_ntk_decoder_shared_by_threads(gen, one_intraop_thread):
    """A Decoder computes its tables once per forward, so after a warm-up at the longest prompt every
    forward between the trained length and it uses one set of frequencies, in any thread."""
    lm = small_lm(rope_scaling=dict(DYNAMIC))
    prompts = [torch.randint(50, (1, n), generator=gen) for n in (60, 17, 33, 48, 20)]
    infer = torch.no_grad()(lm.__call__)
    infer(prompts[0])
    want = [infer(p) for p in prompts]
    got = outputs_from_threads(lambda i: infer(prompts[i]), len(prompts))
    for (_, _, i), out in got.items():
        assert torch.equal(out, want[i])


_LM = {}


def _lm() -> Decoder:
    if "lm" not in _LM:
        torch.manual_seed(0)
        _LM["lm"] = Decoder(DecoderConfig(vocab_size=20, hidden_size=16, num_layers=1, num_heads=2)).eval()
    return _LM["lm"]


@FAST
@given(
    ids=st.lists(st.integers(-3, 23), min_size=0, max_size=5),
    dtype=st.sampled_from([torch.int64, torch.int64, torch.int32, torch.int16, torch.float32]),
    max_new_tokens=st.sampled_from([0, 1, 2, -1, 1.5, True]),
)
def test_decoder_runs_or_names_its_input(ids, dtype, max_new_tokens):
    lm = _lm()
    x = torch.tensor([ids], dtype=dtype)
    # valid (check_token_ids): int64 / int32 ids [B, S], each in 0 .. vocab_size - 1; generate also needs a prompt
    # of at least one token and max_new_tokens an int >= 0
    forward_ok = dtype in (torch.int64, torch.int32) and all(0 <= i < 20 for i in ids)
    generate_ok = forward_ok and len(ids) >= 1 and type(max_new_tokens) is int and max_new_tokens >= 0
    with torch.no_grad():
        try:
            logits = lm(x)
        except NAMED as exc:
            assert not forward_ok, f"valid input_ids were refused: {exc}"
            assert_named(exc, "input_ids")
            return
        assert forward_ok, "invalid input_ids were accepted"
        try:
            out = lm.generate(x, max_new_tokens)
        except NAMED as exc:
            assert not generate_ok, f"a valid prompt was refused: {exc}"
            assert_named(exc, "input_ids", "max_new_tokens", "prompt")
            return
    assert generate_ok, "an invalid prompt or max_new_tokens was accepted"
    assert logits.shape == (1, len(ids), 20) and bool(torch.isfinite(logits).all())
    assert out.shape == (1, len(ids) + max_new_tokens) and torch.equal(out[:, : len(ids)], x.long())
    if max_new_tokens:  # greedy: the first new token is the argmax of the prompt's last logits
        assert int(out[0, len(ids)]) == int(logits[0, -1].argmax())
