"""The sequence encoders (audio, codecs, byte patches) against transformers 5.23's own code, run on tiny models.

Each type of rotary.hf.encoder_tables is built once from a tiny config (one layer, random weights) and run
once with its RoPE functions recorded (tests/hf/encoder_models.py):

- SEQUENCE_ROPE: rotary's ``RoPE.from_hf_config`` of the model's config gives the cos/sin its rotary embedding
  gave, at the positions the model used, and rotates the q and k of every recorded apply call into the model's
  outputs (a wrong pairing, frequency, rotated width or scaling fails);
- NO_ROPE: the forward pass ran and applied no RoPE function at all.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys

import pytest
import torch

import rotary
from rotary.hf import architectures, vision_tables
from rotary.hf.encoder_tables import LEARNED_FREQUENCIES, NO_ROPE, NOT_BUILT, REFUSED, ROTATED_HEADS, SEQUENCE_ROPE
from rotary.hf.vision_tables import ENCODER_STATUS

transformers = pytest.importorskip("transformers")
from hf import encoder_models as em  # noqa: E402

#: the encoders rotary.hf.patch covers
PATCHED = sorted(t for t in SEQUENCE_ROPE if t in rotary.hf.SUPPORTED)


def _positions(call) -> torch.Tensor:
    bound = dict(zip(("self", "x", "position_ids"), call.args)) | call.kwargs
    return bound["position_ids"].reshape(-1)


def _check_tables(rope, call, interleaved: bool) -> None:
    """rotary's cos/sin at the positions of one call of the model's rotary embedding equal what it gave:
    one angle per pair, in either layout the model hands its table over in (PE's is (i, i + r/2) for its
    pairs (2i, 2i+1))."""
    cos, sin = rope.cos_sin(_positions(call))
    r = cos.shape[-1]
    for ours, theirs in zip((cos, sin), call.out):
        theirs = theirs.reshape(-1, theirs.shape[-1])[:, :r].float()
        mine = ours[:, ::2] if interleaved else ours[:, : r // 2]
        close = [torch.allclose(mine, t, rtol=1e-5, atol=1e-5) for t in (theirs[:, : r // 2], theirs[:, ::2])]
        assert any(close), (mine[:2], theirs[:2])


def _interleave(x: torch.Tensor) -> torch.Tensor:
    """The inverse of Qwen2.5-Omni's deinterleave_head_dim: channels (0, 2, 4, …, 1, 3, 5, …) back in order."""
    half = x.shape[-1] // 2
    return torch.stack([x[..., :half], x[..., half:]], dim=-1).flatten(-2)


@pytest.mark.parametrize("model_type", sorted(SEQUENCE_ROPE))
def test_sequence_encoder_rope_matches_the_model(model_type, rotate_calls):
    """Every apply call of the forward, rotated by rotary at the positions of the rotary-embedding call before it
    (a codec's encoder and decoder each make their own), gives the model's q and k; hf.patch keeps the outputs."""
    model, _, calls, _ = em.record(model_type)
    rope = rotary.RoPE.from_hf_config(model.config)
    positions, applied, rotated = None, 0, False
    for call in calls:
        if call.name.endswith(".forward"):  # the model's rotary embedding: its table for the next layers
            _check_tables(rope, call, SEQUENCE_ROPE[model_type] == "interleaved")
            positions = _positions(call)
            continue
        assert "Attention" in call.caller and positions is not None, (call.name, call.caller)
        q, k = call.args[:2]
        if model_type in ROTATED_HEADS:  # the DiT hands over its first heads, de-interleaved: as the model has them
            heads = getattr(model.config, "dit_config", model.config).num_attention_heads  # token2wav: its DiT's
            assert q.shape[1] == ROTATED_HEADS[model_type] < heads, q.shape
            q, k = (_interleave(x) for x in (q, k))
        # the queries hold the last positions when the keys also cover a context (Muse Glimmer's assistant)
        ours = [rope.rotate(x.double(), position_ids=positions[-x.shape[-2] :]) for x in (q, k)]
        if model_type in ROTATED_HEADS:  # its code leaves them de-interleaved (the same order for q and k)
            ours = [torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1) for x in ours]
        for mine, want, x in zip(ours, call.out[:2], (q, k)):
            torch.testing.assert_close(mine.float(), want, rtol=1e-5, atol=2e-5)
            rotated |= not torch.allclose(mine.float(), x, atol=1e-3)
        applied += 1
    assert applied, f"{model_type}: the forward applied no RoPE ({[c.name for c in calls]})"
    assert rotated  # on inputs that are not all zero (a random codec's decoder may get zeros)
    if model_type in PATCHED:  # in the same test: the tiny model is built once per xdist worker
        _check_patch(model_type, rotate_calls)


#: the video trackers' parts, with no model class: run inside SAM 2 video's inference session (tested below)
TRACKER_PARTS = sorted(t for t in NO_ROPE if t.endswith(("_video_mask_decoder", "_video_prompt_encoder")))


@pytest.mark.parametrize("model_type", sorted(set(NO_ROPE) - set(TRACKER_PARTS)))
def test_encoders_without_rope_apply_none(model_type):
    _, _, calls, out = em.record(model_type)
    assert out is not None
    assert calls == [], f"{model_type} applied {[c.name for c in calls]}"
    assert ENCODER_STATUS[model_type] == NO_ROPE[model_type] and NO_ROPE[model_type].startswith("no RoPE: ")


@pytest.mark.parametrize("model_type", ["wav2vec2-bert", "wav2vec2-conformer"])
def test_a_rotation_of_the_hidden_states_is_refused_with_the_numbers(model_type):
    """wav2vec2-BERT / -Conformer with position_embeddings_type='rotary': the recorded rotation is a RoPE of the
    hidden states (rotary's own, at positions 0..S-1, gives the same), applied before the q and k projections:
    the attention logits then change when every position shifts by 3, which a RoPE of q and k never does."""
    model, _, calls, _ = em.record(model_type)
    config = model.config
    (table,) = [c for c in calls if c.name.endswith(".forward")]  # computed once, for every layer
    applies = [c for c in calls if c.name.endswith("._apply_rotary_embedding")]
    assert len(applies) == config.num_hidden_layers
    heads, width = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    rope = rotary.RoPE(width, base=config.rotary_embedding_base)
    attention, hidden, _ = applies[0].args
    b, s, _ = hidden.shape
    ours = rope.rotate(hidden.double().view(b, s, heads, width), position_ids=torch.arange(s), layout="bshd")
    torch.testing.assert_close(ours.reshape(b, s, -1).float(), applies[0].out, rtol=1e-5, atol=1e-5)

    def logits(shift: int) -> torch.Tensor:
        x = rope.rotate(hidden.double().view(b, s, heads, width), position_ids=torch.arange(s) + shift, layout="bshd")
        x = x.reshape(b, s, -1).float()
        q = attention.linear_q(x).view(b, s, heads, width).transpose(1, 2)
        k = attention.linear_k(x).view(b, s, heads, width).transpose(1, 2)
        return q @ k.transpose(-1, -2)

    with torch.no_grad():
        assert (logits(3) - logits(0)).abs().max() > 1e-2  # absolute positions: not a RoPE of q and k
    assert ENCODER_STATUS[model_type] == REFUSED[model_type]
    with pytest.raises(rotary.ConfigError, match=repr(model_type)):
        rotary.RoPE.from_hf_config(config)


@pytest.mark.parametrize("model_type", ["mlcd", "mlcd_vision_model"])
def test_a_learned_class_token_angle_is_refused_with_the_numbers(model_type):
    """MLCD: rotary's 2-D axial RoPE (Qwen-VL's tower's, row by row) gives the cos/sin of its patches and rotates
    them into the model's q and k; its class token's angles are its parameter class_pos_emb (checkpoint weights),
    not a rotation rotary derives from the config, so vision_rope refuses it."""
    model, inputs, calls, _ = em.record(model_type)
    config = model.config
    (table,) = [c for c in calls if c.name.endswith(".forward")]
    applies = [c for c in calls if c.name == "apply_rotary_pos_emb_vision"]
    assert len(applies) == config.num_hidden_layers
    q, k, cos, sin = applies[0].args
    head_dim = q.shape[-1]
    h, w = (n // config.patch_size for n in inputs["pixel_values"].shape[-2:])
    rope = rotary.AxialRoPE(head_dim, axes=2, base=config.rope_parameters["rope_theta"])
    tables = rope.tables(rope.grid(h, w), dtype=torch.float64)
    cos, sin = cos.reshape(-1, head_dim), sin.reshape(-1, head_dim)
    torch.testing.assert_close(tables.cos.float(), cos[1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tables.sin.float(), sin[1:], rtol=1e-5, atol=1e-5)
    for x, want in zip((q, k), applies[0].out):  # the patches, rotated by rotary, are the model's
        mine = rotary.rotate([x[:, 1:].double()], tables, layout="bshd")[0]
        torch.testing.assert_close(mine.float(), want[:, 1:], rtol=1e-5, atol=2e-5)
    (learned,) = [p for n, p in model.named_parameters() if n.endswith("class_pos_emb")]
    angles = learned.detach().reshape(-1).repeat(2)  # one angle per pair (i, i + D/2)
    torch.testing.assert_close(cos[0], angles.cos(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin[0], angles.sin(), rtol=1e-6, atol=1e-6)
    assert (sin[0].abs() > 1e-3).any()  # the class token is rotated: no unrotated prefix token reproduces it
    assert ENCODER_STATUS[model_type] == REFUSED[model_type]
    with pytest.raises(rotary.ConfigError, match=repr(model_type)):
        rotary.hf.vision_rope({**config.to_dict(), "model_type": model_type})


@pytest.mark.parametrize("model_type", ["neucodec", "xcodec2"])
def test_a_rotation_by_head_index_is_refused_with_the_numbers(model_type):
    """NeuCodec / XCodec2's decoder: its rotary embedding gets positions 0 .. H-1 (one per head), and its apply
    turns every frame of head h by position h's angles: rotary's RoPE along the head axis reproduces q and k, and
    the logits equal the unrotated ones (a rotation shared by a head's queries and keys cancels)."""
    model, _, calls, _ = em.record(model_type)
    config = model.config
    (table,) = [c for c in calls if c.name.endswith(".forward")]
    applies = [c for c in calls if c.name == "apply_rotary_pos_emb"]
    heads, frames = config.num_attention_heads, 6
    assert table.args[2].tolist() == [list(range(heads))] and len(applies) == config.num_hidden_layers
    rope = rotary.RoPE(config.head_dim, base=config.rope_parameters["rope_theta"])
    q, k = applies[0].args[:2]  # [B, H, S, D]
    assert q.shape == (1, heads, frames, config.head_dim)
    for x, want in zip((q, k), applies[0].out):  # the heads as the positions: layout bshd reads H as S
        mine = rope.rotate(x.double(), position_ids=torch.arange(heads), layout="bshd")
        torch.testing.assert_close(mine.float(), want, rtol=1e-5, atol=2e-5)
    assert not torch.allclose(applies[0].out[0], q, atol=1e-3)  # head 1 turns
    logits, unrotated = applies[0].out[0] @ applies[0].out[1].transpose(-1, -2), q @ k.transpose(-1, -2)
    torch.testing.assert_close(logits, unrotated, rtol=1e-5, atol=1e-5)  # no position reaches the scores
    assert ENCODER_STATUS[model_type] == REFUSED[model_type]
    with pytest.raises(rotary.ConfigError, match=repr(model_type)):
        rotary.RoPE.from_hf_config(config)


def test_lightglue_is_rope_mixed_with_its_learned_frequencies(rotate_calls):
    """LightGlue's angles are its projector's weights times each keypoint's (x, y): rotary.RoPEMixed with those weights
    as its frequencies (every head) rotates q and k into the model's, at keypoints whose x and y differ; hf.patch
    keeps its fp32 outputs."""
    _, model, inputs = em.build("lightglue")
    _, _, calls, _ = em.record("lightglue")
    keypoints = []
    hook = model.positional_encoder.register_forward_hook(lambda m, args, out: keypoints.append(args[0]))
    try:
        with torch.no_grad():
            model(**inputs)  # the recorded forward again (deterministic), for the keypoints it encodes
    finally:
        hook.remove()
    (xy,) = keypoints  # [2 images, S, 2]: normalized (x, y)
    assert not torch.allclose(xy[..., 0], xy[..., 1])
    weight = model.positional_encoder.projector.weight.detach()  # [D/2, 2]
    heads, head_dim = model.config.num_attention_heads, 2 * weight.shape[0]
    mixed = rotary.RoPEMixed(head_dim, heads, interleaved=True, rotate=False)
    with torch.no_grad():
        mixed.inv_freq.copy_(weight.T.expand(heads, 2, head_dim // 2))
    applies = [c for c in calls if c.name == "apply_rotary_pos_emb"]
    assert len(applies) == model.config.num_hidden_layers  # the self-attention of each layer (not the cross)
    for call in applies:
        for x, want in zip(call.args[:2], call.out):  # [B, H, S, D]
            with torch.no_grad():
                mine = mixed.rotate(x.double(), xy.double(), layout="bhsd")
            scale = x.abs().max()  # fp32 rounding of values of this size
            torch.testing.assert_close(mine.float() / scale, want / scale, rtol=1e-5, atol=2e-6)
            assert (mine.float() - x).abs().max() > 0.1 * x.abs().max()  # it rotates
    assert "lightglue" in LEARNED_FREQUENCIES and ENCODER_STATUS["lightglue"].endswith(LEARNED_FREQUENCIES["lightglue"])
    _check_patch("lightglue", rotate_calls)


def _check_memory_attention(rope, calls, grid_tokens: int) -> set:
    """Every recorded apply_rotary_pos_emb_2d call of a memory attention: rotary's tables (the queries' grid; the
    keys' grid once per memory frame, then the object pointers unrotated) give its cos/sin and its q and k."""
    queries = rope.tables(dtype=torch.float64)
    values = rope.positions().values
    assert queries.cos.shape[0] == grid_tokens and not torch.equal(values[:, 0], values[:, 1])
    seen = set()
    for call in calls:
        assert call.caller.endswith("RoPEAttention"), call.caller  # the memory attention's, nothing else
        q, k, cos, sin = call.args[:4]  # [B, H, S, D]; tables [1, S, D], each angle twice (pairs (2i, 2i+1))
        torch.testing.assert_close(queries.cos.float(), cos[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(queries.sin.float(), sin[0], rtol=1e-5, atol=1e-5)
        pointers = call.kwargs.get("num_k_exclude_rope", 0)
        frames = (k.shape[-2] - pointers) // grid_tokens
        keys = rope.tables(memory_frames=frames, object_pointers=pointers, dtype=torch.float64)
        for x, tables, want in ((q, queries, call.out[0]), (k, keys, call.out[1])):
            (mine,) = rotary.rotate([x.double()], tables, layout="bhsd")
            torch.testing.assert_close(mine.float(), want, rtol=1e-5, atol=2e-5)
            assert not torch.allclose(mine.float(), x, atol=1e-3)
        seen.add((frames, pointers))
    return seen


def test_sam2_video_memory_attention_through_its_inference_session():
    """SAM 2 video, run through an inference session (three frames, a point on the first): vision_rope's
    'sam2_memory' form gives every rotation of its memory attention, over the current frame (self-attention) and over
    one then two memory frames with their object pointers (cross-attention); its prompt encoder and mask decoder ran
    on every frame and applied none."""
    model, calls, ran = em.sam2_video_session()
    rope = rotary.hf.vision_rope(model.config)
    assert rope.form == "sam2_memory" and rope.fixed_grid == (4, 4)
    seen = _check_memory_attention(rope, calls, 16)
    assert seen == {(1, 0), (1, 2), (2, 4)}  # self-attention; one memory frame + 2 pointer tokens; two + 4
    assert ran == {"prompt_encoder": 3, "mask_decoder": 3}
    for model_type in TRACKER_PARTS:
        assert ENCODER_STATUS[model_type] == NO_ROPE[model_type]


def _classes(module, prefix: str) -> dict[str, str]:
    """The source of each class of a modeling module, by name without ``prefix``, with the model's name replaced (in
    its docstrings too). One parse of the file (inspect.getsource parses it again for every class)."""
    text = open(module.__file__, encoding="utf-8").read()
    lines, found = text.splitlines(), {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name.startswith(prefix):
            source = "\n".join(lines[node.lineno - 1 : node.end_lineno]).replace(prefix, "X")
            found[node.name[len(prefix) :]] = re.sub(r"[A-Z0-9_]+'s attention layer", "X's attention layer", source)
    return found


def test_sam3_tracker_and_edgetam_share_sam2_videos_parts():
    """SAM 3's tracker and EdgeTAM: their prompt encoders and mask decoders (and every module inside them) are SAM 2
    video's code, run in its session above; SAM 3's tracker's memory attention is too."""
    import transformers.models.edgetam_video.modeling_edgetam_video as edgetam
    import transformers.models.sam2_video.modeling_sam2_video as sam2
    import transformers.models.sam3_tracker_video.modeling_sam3_tracker_video as sam3

    parts = "PromptEncoder MaskDecoder MaskEmbedding PositionalEmbedding TwoWayTransformer TwoWayAttentionBlock".split()
    parts += ["Attention", "FeedForward", "LayerNorm"]
    reference = _classes(sam2, "Sam2Video")
    for module, prefix, extra in (
        (sam3, "Sam3TrackerVideo", ["MemoryAttention", "MemoryAttentionLayer", "RoPEAttention"]),
        (edgetam, "EdgeTamVideo", []),
    ):
        theirs = _classes(module, prefix)
        for part in parts + extra:
            assert theirs[part] == reference[part], (prefix, part)


def test_sam3_tracker_video_memory_attention_run_on_its_own():
    """SAM 3's tracker: its memory attention, built from a tiny config and run on a frame and two memory frames with
    four object-pointer tokens, rotates as vision_rope's 'sam2_memory' form says (the whole tracker needs SAM 3's ViT,
    too large to build in a test; the rest is SAM 2 video's code, checked above)."""
    import transformers.models.sam3_tracker_video.modeling_sam3_tracker_video as module

    config = transformers.Sam3TrackerVideoConfig(
        memory_attention_hidden_size=64,
        memory_attention_num_layers=1,
        memory_attention_num_attention_heads=2,
        memory_attention_feed_forward_hidden_size=32,
    )
    config.memory_attention_rope_feat_sizes = [5, 3]  # (w, h): a 3 x 5 grid (its image_size sets it at init)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attention = module.Sam3TrackerVideoMemoryAttention(config).eval()
    gen = torch.Generator().manual_seed(1)
    tokens, pointers = 15, 4
    current = torch.randn(tokens, 1, 64, generator=gen)
    memory = torch.randn(2 * tokens + pointers, 1, 64, generator=gen)  # [S, B, C], the memory encoder's 64 channels
    calls, real = [], module.apply_rotary_pos_emb_2d

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        caller = type(sys._getframe(1).f_locals.get("self")).__name__
        calls.append(em.Call("apply_rotary_pos_emb_2d", caller, args, kwargs, out))
        return out

    module.apply_rotary_pos_emb_2d = recording
    try:
        with torch.no_grad():
            attention(current, memory, torch.randn_like(current), torch.randn_like(memory), num_object_pointer_tokens=4)
    finally:
        module.apply_rotary_pos_emb_2d = real
    rope = rotary.hf.vision_rope(config)
    assert rope.fixed_grid == (3, 5)
    assert _check_memory_attention(rope, calls, tokens) == {(1, 0), (2, pointers)}


def test_edgetam_video_memory_attention_run_on_its_own():
    """EdgeTAM video: its memory attention, built from a tiny config and run on a 3 x 5 frame and two memory frames
    (each: 3 perceiver latents, then a 2 x 4 grid) with 4 object-pointer tokens, rotates as vision_rope's
    'edgetam_memory' form says (the whole model needs timm: see its backbone; the rest is SAM 2 video's code)."""
    import transformers.models.edgetam_video.modeling_edgetam_video as module

    config = transformers.EdgeTamVideoConfig(
        memory_attention_hidden_size=64,
        memory_attention_num_layers=1,
        memory_attention_num_attention_heads=2,
        memory_attention_mlp_hidden_size=32,
        memory_attention_rope_feat_sizes=[5, 3],  # (w, h)
        memory_attention_rope_k_sizes=[4, 2],
        perceiver_resampler_num_latents=3,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attention = module.EdgeTamVideoMemoryAttention(config).eval()
    gen = torch.Generator().manual_seed(1)
    tokens, frames, pointers = 15, 2, 4
    current = torch.randn(tokens, 1, 64, generator=gen)
    memory = torch.randn(frames * (3 + 8) + pointers, 1, 64, generator=gen)  # [S, B, C]
    calls = []
    reals = {
        name: getattr(module, name)
        for name in ("apply_rotary_pos_emb_2d_self_attn", "apply_rotary_pos_emb_2d_cross_attn")
    }

    def recorder(name):
        def recording(*args, **kwargs):
            out = reals[name](*args, **kwargs)
            bound = inspect.signature(reals[name]).bind(*args, **kwargs)
            bound.apply_defaults()
            calls.append((name, bound.arguments, out))
            return out

        return recording

    for name in reals:
        setattr(module, name, recorder(name))
    try:
        with torch.no_grad():
            attention(
                current,
                memory,
                torch.randn_like(current),
                torch.randn_like(memory),
                num_object_pointer_tokens=pointers,
                num_spatial_memory_tokens=frames,
            )
    finally:
        for name, real in reals.items():
            setattr(module, name, real)
    rope = rotary.hf.vision_rope(config)
    assert rope.form == "edgetam_memory" and rope.fixed_grid == (3, 5) and rope.memory_keys == ((2, 4), 3)
    queries = rope.tables(dtype=torch.float64)
    keys = rope.tables(memory_frames=frames, object_pointers=pointers, dtype=torch.float64)
    assert [name for name, *_ in calls] == list(reals)  # self-attention, then cross-attention
    for name, kwargs, out in calls:
        q, k, cos, sin = (kwargs[key] for key in ("q", "k", "cos", "sin"))
        torch.testing.assert_close(queries.cos.float(), cos[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(queries.sin.float(), sin[0], rtol=1e-5, atol=1e-5)
        if name.endswith("cross_attn"):
            assert k.shape[-2] == frames * 11 + pointers and kwargs["repeat_freqs_k"] == frames
        for x, tables, want in ((q, queries, out[0]), (k, keys if name.endswith("cross_attn") else queries, out[1])):
            (mine,) = rotary.rotate([x.double()], tables, layout="bhsd")
            torch.testing.assert_close(mine.float(), want, rtol=1e-5, atol=2e-5)
            assert not torch.allclose(mine.float(), x, atol=1e-3)


def test_vjepa2_turns_the_two_channels_of_a_pair_by_different_angles():
    """V-JEPA 2's refusal, with the numbers: every call of its rotate_queries_or_keys in one forward changes the norms
    of the q and k rows it is given (a rotation never does), at positions that differ per axis."""
    module, model, inputs = em.build("vjepa2")
    real, calls = module.rotate_queries_or_keys, []

    def recording(x, pos):
        out = real(x, pos)
        calls.append((x, pos, out))
        return out

    module.rotate_queries_or_keys = recording
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        module.rotate_queries_or_keys = real
    assert len(calls) == 3 * 2 * (model.config.num_hidden_layers + model.config.pred_num_hidden_layers)  # d, h, w
    assert len({tuple(pos.reshape(-1).tolist()) for _, pos, _ in calls[:3]}) == 3  # depth, height, width
    for x, pos, out in calls:
        change = (out.norm(dim=-1) - x.norm(dim=-1)).abs()
        change = change[(pos != 0).expand_as(change)]  # the rows at a position other than 0
        assert change.max() > 1e-2, change.max()  # no rotation: norms change
    assert ENCODER_STATUS["vjepa2"] == REFUSED["vjepa2"]
    with pytest.raises(rotary.ConfigError, match="'vjepa2'"):
        rotary.hf.vision_rope(model.config)


def test_every_encoder_left_says_exactly_why():
    """No encoder keeps a generic status ("not built yet" for a whole kind): each is built, applies no RoPE, is
    refused, or has its own reason in NOT_BUILT."""
    generic = {getattr(vision_tables, n) for n in ("_AUDIO", "_VIDEO", "_SEGMENT", "_CODEC", "_VISION_LATER", "_OTHER")}
    assert not [t for t, why in ENCODER_STATUS.items() if why in generic]
    assert set(NOT_BUILT) <= set(architectures.UNSUPPORTED)
    assert not set(NOT_BUILT) & (set(NO_ROPE) | set(REFUSED) | set(SEQUENCE_ROPE))
    assert all(ENCODER_STATUS[t] == why for t, why in NOT_BUILT.items())


def test_the_tables_are_disjoint_and_read():
    assert not set(SEQUENCE_ROPE) & set(architectures.UNSUPPORTED)
    assert not set(SEQUENCE_ROPE) & set(architectures.PAIRING)
    assert not set(SEQUENCE_ROPE) & set(ENCODER_STATUS)
    assert set(NO_ROPE) <= set(architectures.UNSUPPORTED)
    for model_type in NO_ROPE:
        with pytest.raises(rotary.ConfigError, match=repr(model_type)):
            rotary.RoPE.from_hf_config({"model_type": model_type, "head_dim": 16})


# ---- rotary.hf.patch on the sequence encoders (run inside test_sequence_encoder_rope_matches_the_model) ----------


def _tensors(out) -> dict[str, torch.Tensor]:
    items = out.items() if hasattr(out, "items") else enumerate(out if isinstance(out, tuple) else (out,))
    return {str(k): v for k, v in items if isinstance(v, torch.Tensor)}


def test_patch_covers_the_sequence_encoders():
    assert set(SEQUENCE_ROPE) - set(PATCHED) <= {"blt_global_transformer", "dots3_note_audio_encoder"}


def _check_patch(model_type: str, rotate_calls: list) -> None:
    """fp32: the patched model's outputs equal the unpatched ones, every apply call's q and k went through
    rotary's rotation (``rotate_calls``: the tensors rotary rotated), and unpatch restores transformers' function
    (outputs bit-identical to before)."""
    _, model, inputs = em.build(model_type)
    applies = [c for c in em.record(model_type)[2] if not c.name.endswith(".forward")]
    with torch.no_grad():
        torch.manual_seed(0)
        before = _tensors(model(**inputs))
        rotary.hf.patch(model)
        try:
            torch.manual_seed(0)
            start = len(rotate_calls)
            patched = _tensors(model(**inputs))
            rotated = len(rotate_calls) - start
        finally:
            rotary.hf.unpatch(model)
        torch.manual_seed(0)
        after = _tensors(model(**inputs))
    assert rotated == 2 * len(applies) and applies  # q and k of every attention, through rotary
    assert before and before.keys() == patched.keys() == after.keys()
    for name, want in before.items():
        torch.testing.assert_close(patched[name], want, rtol=1e-5, atol=1e-5)
        assert after[name].equal(want)
