"""Silent wrong results and tracebacks found by an adversarial review: each reproduction now gives the
right result or a named error (q is [1, 4, 8, 64] float32, p is arange(8), as in the review)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import rotary
from rotary.models import Decoder, DecoderConfig
from rotary.nn import KVCache, RotaryAttention, RotaryLinearAttention


@pytest.fixture
def q(gen):
    return torch.randn(1, 4, 8, 64, generator=gen)


def small_lm(**over):
    return Decoder(DecoderConfig(**dict(dict(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4), **over))).eval()


def test_offset_and_position_ids_together_is_an_error(q):
    with pytest.raises(ValueError, match="position_ids and offset=100 each give positions; pass one"):
        rotary.RoPE(64)(q, q.clone(), position_ids=torch.arange(8), offset=100)


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
    "kwargs, match",
    [
        (dict(interleaved="false"), "interleaved must be True or False, got 'false'"),
        (dict(interleaved=1), "interleaved must be True or False, got 1"),
        (dict(strict="no"), "strict must be True or False"),
        (dict(dynamic="sometimes"), "'hf'.*'stateless'"),
        (dict(max_position=2.0), "max_position must be a positive int"),
    ],
)
def test_config_values_of_the_wrong_type(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        rotary.RoPE(64, **kwargs)


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


@pytest.mark.parametrize("inplace", ["yes", 1, None])
def test_inplace_must_be_a_bool_on_every_path(inplace, q):
    """The decoding fast paths (found by tests/variants/test_variants_robustness.py) check it too."""
    rope = rotary.RoPE(64)
    tables = rope.tables(torch.arange(8))
    calls = [
        lambda: rope(q, q.clone(), inplace=inplace),
        lambda: rope.rotate(q, inplace=inplace),
        lambda: rotary.rotate([q, q.clone()], tables, inplace=inplace),
        lambda: rotary.rotate([q], tables, inplace=inplace),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=f"inplace must be True or False, got {inplace!r}"):
            call()


def test_inplace_on_overlapping_views_is_refused_but_disjoint_views_work(gen):
    rope = rotary.RoPE(64)
    qkv = torch.randn(1, 8, 8, 64, generator=gen)
    with pytest.raises(ValueError, match="q and k share memory"):
        rope(qkv[:, 0:4], qkv[:, 2:6], inplace=True)
    fused = torch.randn(1, 8, 3, 4, 64, generator=gen)  # [B, S, 3, H, D]: q, k, v interleave in memory
    q, k = fused[:, :, 0], fused[:, :, 1]
    want = rope(q, k, layout="bshd")
    rope(q, k, layout="bshd", inplace=True)  # disjoint, although their extents overlap
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])


def test_linear_attention_agrees_with_softmax_attention_on_masks(gen):
    x = torch.randn(2, 6, 32, generator=gen)
    for attn in (RotaryAttention(32, 2, causal=True), RotaryLinearAttention(32, 2, causal=True)):
        with pytest.raises(ValueError, match="additive float masks are not accepted"):
            attn(x, attention_mask=torch.zeros(2, 6))
        with pytest.raises(ValueError, match="only 0 and 1"):
            attn(x, attention_mask=torch.full((2, 6), 2))
    out = RotaryLinearAttention(32, 2, causal=True)(x[:, :0])
    assert out.shape == (2, 0, 32)


def test_negative_positions_fail_under_compile_too():
    rope = rotary.RoPE(16)
    f = torch.compile(lambda q, p: rope(q, q, position_ids=p), backend="eager", fullgraph=True)
    q = torch.randn(1, 2, 4, 16)
    assert f(q, torch.arange(4))[0].shape == q.shape
    with pytest.raises(RuntimeError, match="position_ids must be >= 0"):
        f(q, torch.tensor([0, -1, 2, 3]))


def test_huge_positions_take_microseconds_and_no_table():
    rope = rotary.RoPE(128)
    start = time.perf_counter()
    cos, _ = rope.cos_sin(torch.tensor([2**31 - 1], dtype=torch.int32))
    q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 1, 128)
    for offset in (2**20, 2**22, 2**40):
        out = rope(q, k, offset=offset)[0]
        ref = rotary.reference.rotate_complex(q.double(), torch.tensor([offset]), rope.inv_freq)
        assert float((out.double() - ref).abs().max()) < 1e-5
    elapsed = time.perf_counter() - start
    assert cos.shape == (1, 128) and all(c.length <= 1 << 16 for c in rope._caches.values())
    assert elapsed < 30  # generous: a table per position would take minutes and gigabytes


def test_tables_cached_under_inference_mode_still_train():
    rope = rotary.RoPE(16)
    with torch.inference_mode():
        rope.rotate(torch.randn(1, 1, 4, 16))
    x = torch.randn(1, 1, 4, 16, requires_grad=True)
    rope.rotate(x).sum().backward()
    assert x.grad is not None


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


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: KVCache().next_positions(3), ValueError, "KVCache is empty"),
        (lambda: KVCache(keys=torch.zeros(1, 1, 1, 4)).update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, dtype=torch.long)), ValueError, "keys / values / positions but not all"),
        (lambda: RotaryAttention(16, 2)(torch.randn(1, 3, 16), cache=[KVCache()]), TypeError, "cache must be a rotary.nn.KVCache or StaticKVCache, got list"),
        (lambda: small_lm().generate(torch.zeros(1, 0, dtype=torch.long), 3), ValueError, "at least one token"),
        (lambda: rotary.RoPE(16).cos_sin(torch.arange(4, dtype=torch.int16)), TypeError, "int64 or int32, got torch.int16"),
        (lambda: rotary.to_half(torch.tensor(1.0)), ValueError, "with a channel axis"),
        (lambda: rotary.permute_qk_weight(torch.randn(8, 4), 0), ValueError, "head_dim must be a positive int, got 0"),
    ],
)
def test_internal_exceptions_became_named_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_a_cache_from_another_layer_shape_is_named():
    cache = KVCache()
    RotaryAttention(32, 4)(torch.randn(1, 3, 32), cache=cache)  # head_dim 8
    other = RotaryAttention(32, 2)  # head_dim 16
    cache.owner = None  # even handed over on purpose, the shapes must agree
    with pytest.raises(ValueError, match="do not match the cache"):
        other(torch.randn(1, 1, 32), cache=cache)


# ---- shared by threads ---------------------------------------------------------------------------
@pytest.fixture
def one_intraop_thread():
    """The Python threads, not intra-op parallelism, are what is tested; restore the setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run_threads(work, n_threads=4):
    errors: list[BaseException] = []

    def target(i):
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _outputs_from_threads(call, count, reps=3, alternate=False):
    """``call(i)`` for every ``i < count``, ``reps`` times in each of 4 threads (``alternate``: every
    other pass in reverse order); the outputs as ``{(thread, rep, i): output}``, all of them present."""
    got = {}

    def work(t):
        for rep in range(reps):
            order = range(count)
            for i in reversed(order) if alternate and not (t + rep) % 2 else order:
                got[(t, rep, i)] = call(i)

    _run_threads(work)
    assert len(got) == 4 * reps * count
    return got


@pytest.mark.parametrize(
    "scaling, dynamic",
    [
        (None, "hf"),  # the cache grows concurrently to different lengths
        ({"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 16}, "stateless"),
        ({"rope_type": "longrope", "original_max_position_embeddings": 16, "factor": 4.0,
          "short_factor": [1.0 + i / 32 for i in range(8)], "long_factor": [1.0 + i for i in range(8)]}, "hf"),
    ],
)
def test_one_rope_shared_by_threads_gives_single_threaded_results(scaling, dynamic, gen, one_intraop_thread):
    lengths = [3, 40, 9, 70, 17, 5, 33, 100, 12, 64]
    inputs = [torch.randn(1, 2, n, 16, generator=gen) for n in lengths]
    offsets = [0, 7, 300, 1, 5000, 2, 90, 0, 65, 16]
    single = rotary.RoPE(16, scaling=scaling, dynamic=dynamic, max_position=4)
    want = [single(x, x, offset=o)[0] for x, o in zip(inputs, offsets)]
    shared = rotary.RoPE(16, scaling=scaling, dynamic=dynamic, max_position=4)
    got = _outputs_from_threads(lambda i: shared(inputs[i], inputs[i], offset=offsets[i])[0], len(lengths), 6, True)
    for (t, rep, i), out in got.items():
        assert torch.equal(out, want[i]), (t, rep, i)


def test_one_decoder_shared_by_threads(gen, one_intraop_thread):
    # length-dependent (long factors past 16 tokens) but not history-dependent: any interleaving of the
    # threads' calls must give the single-threaded logits
    scaling = {"rope_type": "longrope", "original_max_position_embeddings": 16, "factor": 4.0,
               "short_factor": [1.0 + i / 32 for i in range(4)], "long_factor": [1.0 + i for i in range(4)]}
    lm = small_lm(rope_scaling=scaling)
    prompts = [torch.randint(50, (1, n), generator=gen) for n in (4, 30, 9, 50)]
    infer = torch.no_grad()(lm.__call__)  # no_grad is per thread: it wraps each call
    want = [infer(p) for p in prompts]
    got = _outputs_from_threads(lambda i: infer(prompts[i]), len(prompts))
    for (_, _, i), out in got.items():
        assert torch.equal(out, want[i])


# ---- inputs of nn/ and models/ named before torch sees them ----------------------------------------
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
        (dict(attention_mask=torch.tensor([[1, 1], [0, 0]])), ValueError, r"attention_mask row\(s\) \[1\] mark no token"),
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


@pytest.mark.parametrize(
    "cache, new, match",
    [
        # filled by hand with values of another length than the keys
        (dict(keys=torch.zeros(1, 1, 2, 4), values=torch.zeros(1, 1, 3, 4), positions=torch.zeros(1, 2, dtype=torch.long)),
         None, "KVCache is inconsistent: cached values"),
        (dict(keys=torch.zeros(1, 1, 2, 4), values=torch.zeros(1, 1, 2, 4), positions=torch.zeros(1, 2, dtype=torch.int16)),
         None, "KVCache is inconsistent: cached positions must be an int64 tensor"),
        ({}, (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3, 4), torch.arange(2)), "new values .* must match new keys"),
        ({}, (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4, dtype=torch.float64), torch.arange(2)), "share dtype and device"),
        ({}, (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.arange(3)), "S=3 positions but the input has S=2"),
        ({}, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.arange(2)), r"new keys must be a floating \[B, Hk, T, D\]"),
    ],
)
def test_kv_cache_entries_must_describe_the_same_tokens(cache, new, match):
    """Were silently concatenated (a wrong attention later) or failed inside torch.cat."""
    k = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=match):
        KVCache(**cache).update(*(new or (k, k, torch.arange(2, 4))))


def test_repeat_kv_is_public_and_checked():
    from rotary.nn import repeat_kv

    x = torch.arange(2.0).reshape(1, 2, 1, 1)
    assert repeat_kv(x, 3).flatten().tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # head h is KV head h // groups
    with pytest.raises(ValueError, match="groups must be a positive int, got 0"):
        repeat_kv(x, 0)
    with pytest.raises(ValueError, match=r"x must be a \[B, Hk, T, D\] tensor"):
        repeat_kv(x[0], 2)
    with pytest.raises(ValueError, match="groups=100000 would give 200000 heads"):
        repeat_kv(x, 100_000)


@pytest.mark.parametrize("layer", [RotaryAttention, RotaryLinearAttention])
@pytest.mark.parametrize(
    "x, match",
    [
        (torch.randn(1, 3, 16, dtype=torch.bfloat16), "hidden_states is torch.bfloat16 but this layer's weights are torch.float32"),
        (torch.randn(1, 3, 16, dtype=torch.float64), "hidden_states is torch.float64 but this layer's weights are torch.float32"),
        (torch.randint(5, (1, 3, 16)), "hidden_states must be a floating-point tensor, got torch.int64"),
    ],
)
def test_attention_input_dtype_is_named(layer, x, match):
    """Were 'mat1 and mat2 must have the same dtype' from inside F.linear."""
    with pytest.raises(TypeError, match=match):
        layer(16, 2)(x)


def test_attention_under_autocast_takes_mixed_dtypes(gen):
    x = torch.randn(1, 3, 16, generator=gen).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert RotaryAttention(16, 2)(x).shape == (1, 3, 16)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: RotaryLinearAttention(16, 2, eps=-1e-6), "eps must be a finite number >= 0, got -1e-06"),
        (lambda: RotaryLinearAttention(16, 2, eps=float("nan")), "eps must be a finite number >= 0, got nan"),
        (lambda: RotaryLinearAttention(12, 4), "head_dim = hidden_size // num_heads = 3 must be even"),
        (lambda: RotaryLinearAttention(16, 2, bias="no"), "bias must be True or False"),
        (lambda: rotary.nn.linear_attention_reference(*[torch.randn(1, 1, 2, 4)] * 3, torch.ones(2, 4), torch.zeros(2, 4), feature_map="tanh"), "unknown feature_map 'tanh'"),
        (lambda: rotary.nn.alibi_slopes(10**9), "num_heads=1000000000 is more than 65536 heads"),
        (lambda: rotary.nn.RelativePositionBias(4, 10**9), r"max_distance=1000000000\) would learn a table of 29.8 GiB"),
        (lambda: rotary.nn.LearnedPositionEmbedding(10**9, 1024), r"would need 3.7 TiB for its table"),
        (lambda: rotary.nn.SinusoidalPositionEmbedding(8, base=1.0), "base must be a finite number > 1, got 1.0"),
        (lambda: rotary.nn.SinusoidalPositionEmbedding(8, base=float("inf")), "base must be a finite number > 1, got inf"),
        (lambda: rotary.models.decoder.RMSNorm(8, eps=-1.0), "eps must be a finite number > 0, got -1.0"),
        (lambda: rotary.models.decoder.SwiGLU(8, 0), "intermediate_size must be a positive int, got 0"),
    ],
)
def test_layer_parameters_out_of_range_are_named(build, match):
    """Were accepted (NaN outputs, a table with no rotation), a ZeroDivisionError, or an allocation
    the operating system killed the process for."""
    with pytest.raises((TypeError, ValueError), match=match):
        build()


DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 16}


def test_one_hf_dynamic_ntk_rope_shared_by_threads_after_warm_up(gen, one_intraop_thread):
    """transformers' state machine (dynamic="hf") keeps the frequencies of the longest call seen; once a
    call of the longest length has run, every call between the trained length and it uses those same
    frequencies in any order, so each thread's output must equal the single-threaded one."""
    lengths = [17, 100, 40, 64, 23, 99, 16, 70]
    inputs = [torch.randn(1, 2, n, 16, generator=gen) for n in lengths]
    single = rotary.RoPE(16, scaling=DYNAMIC, max_position=4)
    single(inputs[1], inputs[1])  # warm up at the longest length
    want = [single(x, x)[0] for x in inputs]
    assert not torch.equal(want[0], rotary.RoPE(16, scaling=DYNAMIC)(inputs[0], inputs[0])[0])  # not the fresh state
    shared = rotary.RoPE(16, scaling=DYNAMIC, max_position=4)
    shared(inputs[1], inputs[1])
    got = _outputs_from_threads(lambda i: shared(inputs[i], inputs[i])[0], len(lengths), 6, True)
    for (t, rep, i), out in got.items():
        assert torch.equal(out, want[i]), (t, rep, i)


def test_one_hf_dynamic_ntk_rope_shared_by_threads_with_resets(gen, one_intraop_thread):
    """Short calls reset the state and long calls grow it, concurrently: a short call must use the
    trained frequencies, and a long call of length n the frequencies of some length m >= n that a call
    asked for (what some serial order of the same calls gives), never a torn or foreign state."""
    lengths = [5, 30, 9, 60, 12, 45, 3, 80]
    inputs = [torch.randn(1, 2, n, 16, generator=gen) for n in lengths]
    trained = rotary.RoPE(16)  # dynamic NTK below its trained length is plain RoPE
    # the single-threaded result of a length-n input under the frequencies grown to length m
    candidates = {}
    for i, n in enumerate(lengths):
        for m in lengths:
            if n > 16 and m >= n:
                rope = rotary.RoPE(16, scaling=DYNAMIC)
                rope(torch.zeros(1, 1, m, 16), torch.zeros(1, 1, m, 16))
                candidates.setdefault(i, []).append(rope(inputs[i], inputs[i])[0])
    shared = rotary.RoPE(16, scaling=DYNAMIC, max_position=4)
    got = _outputs_from_threads(lambda i: shared(inputs[i], inputs[i])[0], len(lengths), 6, True)
    for (t, rep, i), out in got.items():
        if lengths[i] <= 16:
            assert torch.equal(out, trained(inputs[i], inputs[i])[0]), (t, rep, i)
        else:
            assert any(torch.equal(out, c) for c in candidates[i]), (t, rep, i)


def test_one_dynamic_ntk_decoder_shared_by_threads(gen, one_intraop_thread):
    """A Decoder computes its tables once per forward, so after a warm-up at the longest prompt every
    forward between the trained length and it uses one set of frequencies, in any thread."""
    lm = small_lm(rope_scaling=dict(DYNAMIC))
    prompts = [torch.randint(50, (1, n), generator=gen) for n in (60, 17, 33, 48, 20)]
    infer = torch.no_grad()(lm.__call__)
    infer(prompts[0])
    want = [infer(p) for p in prompts]
    got = _outputs_from_threads(lambda i: infer(prompts[i]), len(prompts))
    for (_, _, i), out in got.items():
        assert torch.equal(out, want[i])


@pytest.mark.parametrize(
    "ids, types, exc, match",
    [
        (torch.tensor([[1, 97]]), None, ValueError, "input_ids hold id 97, but vocab_size is 97"),
        (torch.tensor([[1, 2]]), torch.tensor([[0, 2]]), ValueError, "token_type_ids hold id 2, but type_vocab_size is 2"),
        (torch.tensor([[1, 2]]), torch.tensor([[0, 1, 0]]), ValueError, r"token_type_ids must have the shape of input_ids \(1, 2\)"),
        (torch.tensor([[1, 2]]), torch.tensor([[0, 1]]).float(), ValueError, "token_type_ids must be an integer tensor"),
    ],
)
def test_roformer_ids_outside_their_tables_are_named(ids, types, exc, match):
    """Were ``IndexError: index out of range in self`` from inside the embeddings."""
    from rotary.models import RoFormer, RoFormerConfig

    model = RoFormer(RoFormerConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48))
    with pytest.raises(exc, match=match):
        model(ids, token_type_ids=types)


def test_a_longrope_block_edited_after_construction_changes_nothing(gen):
    scaling = {"rope_type": "longrope", "original_max_position_embeddings": 16, "factor": 4.0,
               "short_factor": [1.0] * 8, "long_factor": [1.0 + i for i in range(8)]}
    rope = rotary.RoPE(16, scaling=scaling)
    q = torch.randn(1, 1, 40, 16, generator=gen)  # past 16 tokens: the long factors, computed lazily
    scaling["long_factor"][0] = 100.0  # edited in place after construction, before first use
    scaling["factor"] = 8.0
    fresh = rotary.RoPE(16, scaling={**scaling, "factor": 4.0, "long_factor": [1.0 + i for i in range(8)]})
    assert torch.equal(rope(q, q)[0], fresh(q, q)[0])
