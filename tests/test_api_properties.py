"""Property tests of nn/, models/, analysis and reference: arbitrary arguments give either the right
result (checked against the slow reference forms or a direct formula) or a named error from rotary
(ValueError/TypeError whose message names the parameter), never a raw torch error or a wrong tensor.

The hypothesis profile of tests/conftest.py draws the same examples every run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary import analysis, reference
from rotary.models import Decoder, DecoderConfig
from rotary.nn import KVCache, RotaryAttention, alibi_slopes, repeat_kv

NAMED = (ValueError, TypeError)
FAST = settings(max_examples=25, deadline=None)

odd_values = st.sampled_from([0, -1, 1, 2, 3, 4, 7, 8, 2**20, 2.0, 1.5, True, None, "4", float("nan"), float("inf")])
dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool])


def _named(exc: BaseException, *names: str) -> None:
    message = str(exc)
    assert any(name in message for name in names), f"the error names none of {names}: {message}"


@FAST
@given(
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    groups=odd_values,
    dtype=dtypes,
)
def test_repeat_kv_equals_repeat_interleave_or_names_the_argument(shape, groups, dtype):
    x = torch.zeros(shape, dtype=dtype) if dtype != torch.bool else torch.zeros(shape, dtype=torch.bool)
    try:
        out = repeat_kv(x, groups)
    except NAMED as exc:
        _named(exc, "groups", "x must be")
        return
    assert x.dim() == 4 and isinstance(groups, int) and not isinstance(groups, bool) and groups >= 1
    assert torch.equal(out, x.repeat_interleave(groups, dim=1))


@FAST
@given(num_heads=odd_values)
def test_alibi_slopes_are_a_geometric_sequence_or_a_named_error(num_heads):
    try:
        slopes = alibi_slopes(num_heads)
    except NAMED as exc:
        _named(exc, "num_heads")
        return
    assert slopes.shape == (num_heads,) and bool((slopes > 0).all()) and bool((slopes <= 1).all())
    if num_heads & (num_heads - 1) == 0:  # a power of two: ratio 2^(-8/n), starting at it
        ratio = 2.0 ** (-8.0 / num_heads)
        want = torch.tensor([ratio ** (i + 1) for i in range(num_heads)])
        torch.testing.assert_close(slopes, want)


@FAST
@given(
    batch=st.integers(0, 2),
    seq_len=st.integers(0, 5),
    width=st.sampled_from([16, 16, 8, 32]),
    dtype=dtypes,
    rank=st.sampled_from([3, 3, 3, 2, 4]),
)
def test_rotary_attention_runs_or_names_hidden_states(batch, seq_len, width, dtype, rank):
    attn = RotaryAttention(16, 2, causal=True)
    shape = [batch, seq_len, width][:rank] + [2] * max(0, rank - 3)
    x = torch.ones(shape, dtype=dtype)
    try:
        out = attn(x)
    except NAMED as exc:
        _named(exc, "hidden_states")
        return
    assert rank == 3 and width == 16 and dtype == torch.float32
    assert out.shape == x.shape and bool(torch.isfinite(out).all())


@FAST
@given(
    new_len=st.integers(0, 3),
    values_len=st.integers(0, 3),
    heads=st.sampled_from([1, 2]),
    value_dtype=st.sampled_from([torch.float32, torch.float32, torch.float64, torch.int64]),
    positions=st.sampled_from(["match", "short", "float", "2d", "negative"]),
)
def test_kv_cache_update_appends_or_names_the_mismatch(new_len, values_len, heads, value_dtype, positions):
    cache = KVCache()
    first = torch.randn(1, 2, 2, 4)
    cache.update(first, first, torch.arange(2))
    keys = torch.randn(1, heads, new_len, 4)
    values = torch.ones(1, heads, values_len, 4, dtype=value_dtype)
    ids = {
        "match": torch.arange(2, 2 + new_len),
        "short": torch.arange(2, 2 + new_len + 1),
        "float": torch.arange(2, 2 + new_len).float(),
        "2d": torch.arange(2, 2 + new_len)[None],
        "negative": torch.arange(-new_len, 0),
    }[positions]
    try:
        k, v, p = cache.update(keys, values, ids)
    except NAMED as exc:
        _named(exc, "keys", "values", "positions", "position_ids", "KVCache")
        return
    assert heads == 2 and values_len == new_len and value_dtype == torch.float32
    assert positions in ("match", "2d") or (positions == "negative" and new_len == 0)
    assert torch.equal(k, torch.cat((first, keys), dim=2)) and torch.equal(v, torch.cat((first, values), dim=2))
    assert p.tolist() == [[0, 1] + list(range(2, 2 + new_len))]


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
    try:
        with torch.no_grad():
            logits = lm(x)
            out = lm.generate(x, max_new_tokens)
    except NAMED as exc:
        _named(exc, "input_ids", "max_new_tokens", "prompt")
        return
    assert dtype in (torch.int64, torch.int32) and all(0 <= i < 20 for i in ids) and len(ids) >= 1
    assert logits.shape == (1, len(ids), 20) and bool(torch.isfinite(logits).all())
    assert max_new_tokens in (0, 1, 2) and max_new_tokens is not True
    assert out.shape == (1, len(ids) + max_new_tokens) and torch.equal(out[:, : len(ids)], x.long())
    if max_new_tokens:  # greedy: the first new token is the argmax of the prompt's last logits
        assert int(out[0, len(ids)]) == int(logits[0, -1].argmax())


@FAST
@given(
    head_dim=st.sampled_from([2, 4, 8, 6]),
    positions=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
    base=st.sampled_from([10.0, 500.0, 10000.0, 1e6]),
    interleaved=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_reference_forms_agree_with_each_other_and_with_rope(head_dim, positions, base, interleaved, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, len(positions), head_dim, generator=g, dtype=torch.float64)
    p = torch.tensor(positions)
    rope = rotary.RoPE(head_dim, base=base, interleaved=interleaved)
    inv_freq = rope.inv_freq.double()
    by_matrix = reference.rotate_matrix(x, p, inv_freq, interleaved=interleaved)
    by_complex = reference.rotate_complex(x, p, inv_freq, interleaved=interleaved)
    by_numpy = torch.from_numpy(reference.rotate_numpy(x.numpy(), p.numpy(), inv_freq.numpy(), interleaved=interleaved))
    torch.testing.assert_close(by_complex, by_matrix, rtol=0, atol=1e-10)
    torch.testing.assert_close(by_numpy, by_matrix, rtol=0, atol=1e-10)
    torch.testing.assert_close(x.norm(dim=-1), by_matrix.norm(dim=-1), rtol=0, atol=1e-10)  # a rotation
    out = rope.rotate(x[:, None], position_ids=p)[:, 0]
    torch.testing.assert_close(out, by_matrix, rtol=0, atol=1e-9)


@FAST
@given(head_dim=odd_values, base=odd_values, distances=st.sampled_from([None, [0, 3], [-2, 5], [1.5], "abc", [], range(4)]))
def test_decay_bound_matches_its_formula_or_names_the_argument(head_dim, base, distances):
    try:
        bound = analysis.decay_bound(head_dim, base, distances)
    except NAMED as exc:
        _named(exc, "head_dim", "base", "distances")
        return
    m = list(range(257)) if distances is None else list(distances)
    assert bound.shape == (len(m),) and bound.dtype == torch.float64
    half = head_dim // 2
    for j, dist in enumerate(m[:3]):  # (1 / (d/2)) Σ_j |Σ_{i<j} e^{i m θ_i}|, written out
        theta = [base ** (-2.0 * i / head_dim) for i in range(half)]
        partial, total = 0j, 0.0
        for t in theta:
            partial += complex(torch.polar(torch.tensor(1.0, dtype=torch.float64), torch.tensor(dist * t, dtype=torch.float64)))
            total += abs(partial)
        assert float(bound[j]) == pytest.approx(total / half, rel=1e-9, abs=1e-12)


@FAST
@given(
    seq_len=st.sampled_from([1, 2, 3, 5, 0, -1, 2.5, True, "4", 10**6]),
    samples=st.sampled_from([1, 3, 0, -2, 1.5, 10**9]),
    distances=st.sampled_from([[0, 2], [0], [-1], [0.5], []]),
)
def test_scores_and_decay_measurements_or_a_named_error(seq_len, samples, distances):
    rope = rotary.RoPE(8)
    q = torch.randn(8, generator=torch.Generator().manual_seed(0))
    try:
        scores = analysis.score_matrix(rope, q, q, seq_len)
    except NAMED as exc:
        _named(exc, "seq_len")
    else:
        assert isinstance(seq_len, int) and not isinstance(seq_len, bool) and 1 <= seq_len <= 4096
        qr = rope.rotate(q.double().expand(1, 1, seq_len, 8).contiguous())[0, 0]
        torch.testing.assert_close(scores, qr @ qr.T)
    try:
        pca = analysis.position_pca(rope, seq_len)
    except NAMED as exc:
        _named(exc, "seq_len")
    else:
        assert isinstance(seq_len, int) and 3 <= seq_len <= 4096 and pca[0].shape == (seq_len, 2)
    try:
        decay = analysis.measured_decay(rope, distances, samples=samples)
    except NAMED as exc:
        _named(exc, "samples", "distances")
    else:
        assert isinstance(samples, int) and 1 <= samples <= 10**6 and distances and min(distances) >= 0
        assert decay.shape == (len(distances),) and bool((decay >= 0).all())


@FAST
@given(model=st.sampled_from([None, 3, "model", torch.nn.Linear(2, 2), torch.nn.Sequential(), [torch.nn.Linear(2, 2)]]))
def test_hf_entry_points_name_what_is_not_a_transformers_model(model):
    from rotary import hf

    for call in (hf.patch, hf.unpatch, hf.is_patched):
        try:
            result = call(model)
        except NAMED as exc:
            _named(exc, "transformers model", "not patched")
        else:  # only is_patched answers, and only for a module
            assert call is hf.is_patched and isinstance(model, torch.nn.Module) and result is False


@FAST
@given(
    rope=st.sampled_from([None, "rope", 64, torch.nn.Linear(2, 2)]),
    seq_len=st.sampled_from([4, 0, 2.5, 10**7]),
)
def test_analysis_names_a_rope_that_is_not_one(rope, seq_len):
    q = torch.ones(8)
    calls = {
        "score_matrix": lambda: analysis.score_matrix(rope, q, q, 4),
        "position_pca": lambda: analysis.position_pca(rope, 4),
        "measured_decay": lambda: analysis.measured_decay(rope, [0, 1]),
        "verify": lambda: analysis.verify(rope, seq_len=4),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"{name} measures a rotary.RoPE, got rope={type(rope).__name__}"):
            call()
    try:
        checks = analysis.verify(rotary.RoPE(8), seq_len=seq_len)
    except NAMED as exc:
        _named(exc, "seq_len")
    else:
        assert seq_len == 4 and all(c.passed for c in checks)
