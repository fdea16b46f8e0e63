"""rotary.hf.vision_rope against transformers 5.23's own vision towers.

Each tower in rotary.hf.VISION_ROPE is built once from a tiny config with random weights and run on
grids that differ per axis (non-square images, several images and videos packed together where the
tower takes them). Every call of its RoPE apply function is recorded (q, k, cos, sin in, q and k out);
rotary's tables for the same grid, through rotary.rotate, must give the same q and k, and the tables
must equal the model's cos/sin on the tokens it rotates.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import pytest
import torch

import rotary
from rotary.hf import architectures, patching, vision
from rotary.hf.vision import ENCODER_STATUS, FORMS, VISION_ROPE, vision_rope

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

#: form -> (the apply function its attention calls, the layout of q and k there)
APPLY = {
    "qwen_vl": ("apply_rotary_pos_emb_vision", "shd"),
    "qwen_vl_window": ("apply_rotary_pos_emb_vision", "shd"),
    "kimi": ("apply_rotary_pos_emb_vision", "bshd"),
    "minimax": ("apply_rotary_pos_emb_vision", "shd"),
    "pixtral": ("apply_rotary_pos_emb", "bhsd"),
    "llama4": ("vision_apply_rotary_emb", "bshd"),
    "dinov3": ("apply_rotary_pos_emb", "bhsd"),
    "sam3": ("apply_rotary_pos_emb_2d", "bhsd"),
    "step3p5": ("apply_rotary_pos_emb_vision", "bshd"),
    "inkling2": ("apply_rotary_pos_emb_vision", "shd"),
    "muse": ("apply_rotary_pos_emb_vision", "bshd"),
    "loftr": ("apply_rotary_pos_emb", "bshd"),  # [B, S, 1, hidden]: before the heads split
    "gemma4": ("apply_multidimensional_rope", "bshd"),  # called once for q, once for k
}
#: the towers whose tables are one RotaryTables (Gemma 4's are one per half of the head: tested below), and that a
#: plain forward runs (SAM 2 video's memory attention runs through an inference session: tests/hf/test_encoders.py)
SINGLE = sorted(t for t, form in VISION_ROPE.items() if form not in ("gemma4", "sam2_memory", "edgetam_memory"))
# Gemma 4: one image of 3 x 6 patches (multiples of its 3 x 3 pooling)
GEMMA4_GRID = (3, 6)

# packed towers: two images and a video, h != w everywhere (in patches; multiples of the merge size)
GRID_THW = [[1, 4, 6], [2, 6, 2], [1, 2, 8]]
# GLM-4V's towers take a video as one row per frame (their processors split it; a row with t > 1 fails there)
GRID_FRAMES = [[1, 4, 6], [1, 6, 2], [1, 6, 2], [1, 2, 8]]
GLM = {"glm4v_vision", "glm4v_moe_vision", "glm_ocr_vision", "glm5_next_vision"}
# Kimi-K2.5 pools each clip's frames after the blocks: one frame count per call (two-frame clips)
GRID_CLIPS = [[2, 4, 6], [2, 6, 2], [2, 2, 8]]
TINY = dict(
    depth=2, num_hidden_layers=2, hidden_size=64, embed_dim=64, num_heads=4, num_attention_heads=4,
    intermediate_size=64, patch_size=4, temporal_patch_size=2, in_channels=3, num_channels=3,
    out_hidden_size=64, window_size=16, fullatt_block_indexes=[1], deepstack_visual_indexes=[],
)  # fmt: skip


#: model types whose tower class the lookup below does not find (or finds several of)
MODEL_CLASS = {
    "dinov3_vit": "DINOv3ViTModel",
    "eomt_dinov3": "EomtDinov3ForUniversalSegmentation",
    "sapiens2": "Sapiens2Model",
    "efficientloftr": "EfficientLoFTRModel",
    "pixtral": "PixtralVisionModel",
    "paddleocr_vl_vision": "PaddleOCRVisionModel",
    "ernie4_5_vl_moe_vision": "Ernie4_5_VLMoeVisionTransformerPretrainedModel",
}


def _model_class(model_type: str):
    cfg = CONFIG_MAPPING[model_type]
    module = importlib.import_module(cfg.__module__.replace("configuration_", "modeling_"))
    if model_type in MODEL_CLASS:
        return module, getattr(module, MODEL_CLASS[model_type])
    classes = [
        o
        for o in vars(module).values()
        if inspect.isclass(o)
        and issubclass(o, transformers.PreTrainedModel)
        and o.__annotations__.get("config") is cfg
        and "PreTrained" not in o.__name__
    ]
    return module, classes[0]


def _config(model_type: str):
    cfg = CONFIG_MAPPING[model_type]
    fields = set(inspect.signature(cfg.__init__).parameters) | {f for f in getattr(cfg, "__dataclass_fields__", {})}
    kwargs = {k: v for k, v in TINY.items() if k in fields}
    if model_type == "llama4_vision_model":
        kwargs.update(
            image_size=24, intermediate_size=256, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64
        )
    if model_type in ("dinov3_vit", "eomt_dinov3", "sapiens2"):
        kwargs.update(image_size=32, num_register_tokens=2)
    if model_type == "eomt_dinov3":
        kwargs.update(num_queries=3, num_blocks=1)
    if model_type == "sam3_vit_model":
        kwargs.update(image_size=40, window_size=4, global_attn_indexes=[1], pretrain_image_size=40)
    if model_type == "dots3_note_vision_encoder":  # two dense layers (its default config is a 42-layer MoE)
        kwargs.update(mlp_layer_types=["dense", "dense"], per_layer_config={}, adapter_in_dim=64, adapter_out_dim=64)
    if model_type == "lfm3_vl_vision":  # a short-convolution layer and an attention layer
        kwargs.update(layer_types=["conv", "full_attention"], num_key_value_heads=2)
    if model_type == "gemma4_vision":  # grouped-query attention, 16-channel heads
        kwargs.update(num_key_value_heads=2, head_dim=16)
    if model_type == "exaone4_5_vision":  # grouped-query attention in the tower
        kwargs.update(num_key_value_heads=2)
    if model_type == "qwen2_5_omni_vision_encoder":
        kwargs.update(fullatt_block_indexes=[1])
    if model_type == "efficientloftr":  # 8 heads: head_dim x partial_rotary_factor (4) must be hidden_size / 2
        kwargs.update(num_attention_heads=8, out_features=[8, 8, 16, 64], stage_num_blocks=[1, 1, 1, 1])
        kwargs.update(num_attention_layers=1, initializer_range=0.2)  # q and k of order 1 (0.02: of order 1e-9)
    if VISION_ROPE.get(model_type) == "muse":  # 4 x 4-patch windows, a windowed layer then a global one
        kwargs.update(pos_emb_height=4, pos_emb_width=4, layer_types=["window_attention", "full_attention"])
    if model_type == "inkling2_vision":  # a small projection into a small text width
        kwargs.update(posemb_grid_size=4, projection_hidden_dim=64, text_hidden_size=64)
    config = cfg(**kwargs)
    config._attn_implementation = "eager"
    return config


def _inputs(model_type: str, config, gen: torch.Generator) -> dict:
    form = VISION_ROPE[model_type]
    p = getattr(config, "patch_size", None)  # EfficientLoFTR has none: a convolutional backbone
    if form in ("qwen_vl", "qwen_vl_window", "kimi", "minimax", "muse"):
        grid = torch.tensor(GRID_FRAMES if model_type in GLM else GRID_CLIPS if form == "kimi" else GRID_THW)
        channels = getattr(config, "in_channels", None) or getattr(config, "num_channels", 3)
        temporal = getattr(config, "temporal_patch_size", None) or getattr(config, "patch_temporal", 1) or 1
        n = int(grid.prod(-1).sum())
        shape = {
            "kimi_k25_vision": (n, channels, p, p),  # one image of p x p pixels per patch
            "paddleocr_vl_vision": (1, n, channels, p, p),
        }.get(model_type, (n, channels * temporal * p * p))
        inputs = {"pixels": torch.randn(*shape, generator=gen), "grid_thw": grid}
        if model_type == "video_llama_3_vision":  # each image and video merged by its own size
            inputs["merge_sizes"] = torch.tensor([2, 1, 2])
        return inputs
    if form == "pixtral":  # two images, 3 x 5 and 4 x 2 patches, padded into one batch
        return {
            "pixel_values": torch.randn(2, 3, 4 * p, 5 * p, generator=gen),
            "image_sizes": torch.tensor([[3 * p, 5 * p], [4 * p, 2 * p]]),
        }
    if form == "inkling2":  # two images of 2 x 3 and 1 x 2 merged tokens (4 x 6 and 2 x 4 patches)
        grid, m = torch.tensor([[1, 2, 3], [1, 1, 2]]), config.spatial_merge_size
        side = p * m  # one merged token's pixels, in [-1, 1]
        return {
            "pixel_values": torch.rand(int(grid.prod(-1).sum()), side, side, 3, generator=gen) * 2 - 1,
            "image_grid_thw": grid,
        }
    if form == "loftr":  # two grey 64 x 96 images: an 8 x 12 coarse map (stride 8), 2 x 3 tokens aggregated
        return {"pixel_values": torch.rand(1, 2, 3, 64, 96, generator=gen)}
    if form == "gemma4":  # the processor's patches, row by row, at (x, y) = (column, row)
        h, w = GEMMA4_GRID
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        return {
            "pixel_values": torch.rand(1, h * w, 3 * p * p, generator=gen),
            "pixel_position_ids": torch.stack([xs.flatten(), ys.flatten()], dim=-1)[None],
        }
    if model_type in ("dinov3_vit", "sapiens2", "step3p5_vision"):  # a 5 x 7 grid
        return {"pixel_values": torch.randn(1, 3, 5 * p, 7 * p, generator=gen)}
    size = config.image_size
    return {"pixel_values": torch.randn(1, 3, size, size, generator=gen)}


def _call(model, model_type: str, inputs: dict):
    if "pixels" in inputs:
        name = next(iter(inspect.signature(model.forward).parameters))
        extra = {"merge_sizes": inputs["merge_sizes"]} if "merge_sizes" in inputs else {}
        return model(**{name: inputs["pixels"], "grid_thw": inputs["grid_thw"]}, **extra)
    return model(**inputs)


class NoLoss(torch.nn.Module):
    """Stands in for EoMT's loss (which needs scipy) while the model is built; the forward never calls it."""

    def __init__(self, config, **kwargs):
        super().__init__()
        self.num_labels, self.eos_coef = config.num_labels, 0.1
        self.empty_weight = torch.nn.Buffer(torch.ones(config.num_labels + 1))


@functools.cache
def tower(model_type: str):
    """The tiny tower (built once per test module), its modeling module and its inputs."""
    module, cls = _model_class(model_type)
    config = _config(model_type)
    torch.manual_seed(0)
    loss = getattr(module, "EomtDinov3Loss", None)  # needs scipy, and plays no part in the forward
    if loss is not None:
        module.EomtDinov3Loss = NoLoss
    try:
        model = cls(config).eval()
    finally:
        if loss is not None:
            module.EomtDinov3Loss = loss
    return module, model, _inputs(model_type, config, torch.Generator().manual_seed(1))


@functools.cache
def recorded(model_type: str):
    """The tower's config, its inputs, and every (args, outputs) of its apply function in one forward."""
    module, model, inputs = tower(model_type)
    config = model.config
    name = APPLY[VISION_ROPE[model_type]][0]
    real = getattr(module, name)
    calls = []

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        bound = inspect.signature(real).bind(*args, **kwargs)
        calls.append((tuple(bound.arguments.values()), out))  # q, k, then the tables, however they were passed
        return out

    setattr(module, name, recording)
    try:
        with torch.no_grad():
            _call(model, model_type, inputs)
    finally:
        setattr(module, name, real)
    return config, inputs, calls


def _as_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return {"shd": lambda t: t[None], "bshd": lambda t: t, "bhsd": lambda t: t.transpose(1, 2)}[layout](x)


def _grids(model_type: str, config, inputs, call_q: torch.Tensor, layout: str):
    """The grid argument(s) of rotary's producer for one recorded call, and its prefix."""
    form = VISION_ROPE[model_type]
    p = getattr(config, "patch_size", None)
    if form == "pixtral":
        return [[3, 5], [4, 2]], None
    if form == "dinov3":  # EoMT's mask head needs its config's square grid
        h, w = (n // p for n in inputs["pixel_values"].shape[-2:])
        seq = _as_bshd(call_q, layout).shape[1]
        return (h, w), seq - h * w
    if form == "step3p5":
        return tuple(n // p for n in inputs["pixel_values"].shape[-2:]), None
    if form == "sam3":
        seq = _as_bshd(call_q, layout).shape[1]
        side = int(round(seq**0.5))
        return (side, side), None
    if form == "llama4":
        return None, None
    if form == "inkling2":
        return inputs["image_grid_thw"], None
    if form == "loftr":  # the coarse feature map: the backbone's strides
        stride = int(torch.tensor(config.stage_stride).prod())
        return tuple(n // stride for n in inputs["pixel_values"].shape[-2:]), None
    return inputs["grid_thw"], None


@pytest.mark.parametrize("model_type", SINGLE)
def test_tables_and_rotation_match_the_model(model_type):
    config, inputs, calls = recorded(model_type)
    assert calls, f"{model_type}: the tower applied no RoPE"
    form = VISION_ROPE[model_type]
    layout = APPLY[form][1]
    rope = vision_rope(config)
    assert rope.form == form and isinstance(rope.rope, rotary.AxialRoPE)
    seen = set()
    for args, out in calls:
        q, k = args[0], args[1]
        grid, prefix = _grids(model_type, config, inputs, q, layout)
        tables = rope.tables(grid, prefix=prefix, merge_sizes=inputs.get("merge_sizes"), dtype=torch.float64)
        qb, kb = _as_bshd(q, layout).double(), _as_bshd(k, layout).double()
        assert tables.cos.shape[0] == qb.shape[1], (tables.cos.shape, qb.shape)
        q_rot, k_rot = rotary.rotate([qb, kb], tables, layout="bshd")
        torch.testing.assert_close(q_rot.float(), _as_bshd(out[0], layout).float(), rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(k_rot.float(), _as_bshd(out[1], layout).float(), rtol=1e-5, atol=2e-5)
        assert not torch.allclose(q_rot.float(), qb.float(), atol=1e-3)  # it rotates
        seen.add((tuple(qb.shape[1:3]), prefix))
    if form == "sam3":
        assert len(seen) == 2  # windowed and global layers, each with its own grid
    if model_type == "eomt_dinov3":
        assert len(seen) == 2  # its last block also carries the queries, unrotated, before the patches


@pytest.mark.parametrize("model_type", SINGLE)
def test_positions_differ_per_axis_and_tables_are_the_models_cos_sin(model_type):
    """Where the model hands cos and sin over (not a complex table): they equal rotary's on the rotated tokens."""
    config, inputs, calls = recorded(model_type)
    form = VISION_ROPE[model_type]
    args = calls[0][0]
    if form == "llama4":  # a complex table [S, 1, D/2]: its real part, repeated per pair, is cos
        freqs = args[2].reshape(args[2].shape[0], -1)
        cos, sin = freqs.real.repeat_interleave(2, -1), freqs.imag.repeat_interleave(2, -1)
    else:
        cos, sin = args[2], args[3]
    if form == "loftr":  # [B, S, hidden]: the same for both images of the pair
        assert torch.equal(cos[0], cos[-1])
        cos, sin = cos[0], sin[0]
    cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
    grid, prefix = _grids(model_type, config, inputs, args[0], APPLY[form][1])
    rope = vision_rope(config)
    coords = rope.positions(grid, prefix=prefix, merge_sizes=inputs.get("merge_sizes"))
    tables = rope.tables(grid, prefix=prefix, merge_sizes=inputs.get("merge_sizes"))
    rows = tables.cos.shape[0] - cos.shape[0]  # DINOv3 hands over the patches' rows only
    assert rows == (prefix or 0)
    values = coords.values[rows:]
    assert not torch.equal(values[:, -1], values[:, -2])  # the axes carry different coordinates
    r = tables.cos.shape[-1]
    torch.testing.assert_close(tables.cos[rows:], cos[:, :r].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tables.sin[rows:], sin[:, :r].float(), rtol=1e-5, atol=1e-5)


def test_gemma4_halves_rotated_by_their_tables_match_the_model():
    """Gemma 4's tower rotates x's half and y's half of the head each as a RoPE of its own (pairs (i, i + D/4)):
    rotary's two tables, each through rotary.rotate on its half, give the q and k the tower computes."""
    config, inputs, calls = recorded("gemma4_vision")
    assert len(calls) == 2 * config.num_hidden_layers  # q and k in each layer
    rope = vision_rope(config)
    assert rope.form == "gemma4" and isinstance(rope.rope, rotary.AxialRoPE)
    tx, ty = rope.tables(GEMMA4_GRID, dtype=torch.float64)
    half = config.head_dim // 2
    assert tx.cos.shape == ty.cos.shape == (GEMMA4_GRID[0] * GEMMA4_GRID[1], half)
    for args, out in calls:
        x = args[0].double()  # [B, N, H, D]
        (rx,) = rotary.rotate([x[..., :half]], tx, layout="bshd")
        (ry,) = rotary.rotate([x[..., half:]], ty, layout="bshd")
        torch.testing.assert_close(torch.cat([rx, ry], -1).float(), out.float(), rtol=1e-5, atol=2e-5)
        assert not torch.allclose(rx.float(), x[..., :half].float(), atol=1e-3)  # each half rotates
        assert not torch.allclose(ry.float(), x[..., half:].float(), atol=1e-3)


def test_gemma4_positions_are_x_then_y_and_tables_are_the_models_cos_sin():
    config, inputs, calls = recorded("gemma4_vision")
    rope = vision_rope(config)
    coords = rope.positions(GEMMA4_GRID).values
    assert torch.equal(coords.long(), inputs["pixel_position_ids"][0])  # the processor's (x, y), row by row
    cos, sin = calls[0][0][1][0], calls[0][0][2][0]  # [N, D]: x's quarter twice, then y's twice
    tx, ty = rope.tables(GEMMA4_GRID)
    half = config.head_dim // 2
    for got, want in (
        (tx.cos, cos[:, :half]),
        (ty.cos, cos[:, half:]),
        (tx.sin, sin[:, :half]),
        (ty.sin, sin[:, half:]),
    ):
        torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(tx.cos, ty.cos)  # the halves carry different axes
    # the tower's frequencies: those of a 1-D RoPE over D/2 channels, the same for both axes
    inv = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, half, 2, dtype=torch.float) / half))
    freq = rope.rope.frequencies()
    assert torch.equal(freq[0][freq[0] != 0].float(), inv) and torch.equal(freq[1][freq[1] != 0].float(), inv)


def test_config_defaults_are_transformers():
    for model_type, defaults in vision.CONFIG_DEFAULTS.items():
        config = CONFIG_MAPPING[model_type]()
        assert {key: getattr(config, key) for key in defaults} == defaults, model_type


@pytest.mark.parametrize("model_type", sorted(VISION_ROPE))
def test_a_config_without_rope_keys_gets_transformers_defaults(model_type):
    """A checkpoint's vision config may leave out rope_theta / rope_parameters: the frequencies are then
    those of transformers' default config of that type."""
    full = CONFIG_MAPPING[model_type]().to_dict()
    bare = {k: v for k, v in full.items() if k not in ("rope_parameters", "rope_theta")}
    want, got = vision_rope(full).rope, vision_rope(bare).rope
    assert got.base == want.base and torch.equal(got.frequencies(), want.frequencies())


def test_every_encoder_is_built_or_has_a_status():
    """Every type the text table refuses as "not a decoder of text tokens" is built here or has a status,
    and nothing is both."""
    not_text = {t for t, why in architectures.UNSUPPORTED.items() if why == architectures._NOT_TEXT}
    assert not set(VISION_ROPE) & set(ENCODER_STATUS)
    assert not set(VISION_ROPE) & set(architectures.UNSUPPORTED)
    assert set(ENCODER_STATUS) == not_text
    assert set(VISION_ROPE.values()) == set(FORMS)
    categories = {status.split(":")[0] for status in ENCODER_STATUS.values()}
    assert categories == {
        "vision encoder",
        "audio codec / vocoder / speech tokenizer",
        "wrapper",
        "no RoPE in this part",
        "no RoPE",
        "not a RoPE of q and k",
        "other encoder (byte patches, feature matching, time series, an assistant model)",
    }


@pytest.mark.parametrize(
    "config, match",
    [
        ({"model_type": "llama", "hidden_size": 64}, r"text decoder; build its RoPE with rotary\.RoPE\.from_hf_config"),
        ({"model_type": "gemma3n_vision"}, r"not built: vision encoder"),
        ({"model_type": "gemma4_unified_vision"}, r"not built: no RoPE in this part"),
        ({"model_type": "qwen2_5_omni_audio_encoder"}, r"not built: no RoPE: its forward pass applies none"),
        ({"model_type": "lasr_encoder"}, r"sequence encoder.*rotary\.RoPE\.from_hf_config"),
        ({"model_type": "nope"}, r"'nope' is not a vision encoder rotary builds"),
        ({"model_type": "qwen3_vl_vision", "hidden_size": 64, "num_heads": 4, "rope_parameters": {"rope_type": "yarn"}},
         r"rope_type 'yarn'.*'axial'"),
        ({"model_type": "qwen3_vl_vision", "hidden_size": 72, "num_heads": 4}, r"head_dim 18 is not a multiple of 4"),
        ({"model_type": "eomt_dinov3", "hidden_size": 64, "num_attention_heads": 4,
          "rope_parameters": {"rope_type": "yarn", "rope_theta": 100.0}}, r"rope_type 'yarn'.*'default'"),
        ({"model_type": "qwen3_vl_vision", "num_heads": 4}, r"none of hidden_size"),
        ({"model_type": "efficientloftr", "hidden_size": 64, "num_attention_heads": 4},
         r"head_dim 16 x partial_rotary_factor 4.0 must be hidden_size / 2 = 32"),
    ],
)  # fmt: skip
def test_bad_configs_name_the_producer_or_the_key(config, match):
    with pytest.raises(rotary.ConfigError, match=match):
        vision_rope(config)


@pytest.mark.parametrize(
    "make, model_type",
    [
        (lambda: transformers.Sam3Config(), "sam3_vit_model"),  # vision_config -> backbone_config
        (lambda: transformers.Sam3Config().vision_config, "sam3_vit_model"),
        (lambda: transformers.Qwen2_5OmniConfig().to_dict(), "qwen2_5_omni_vision_encoder"),  # thinker_config
        (lambda: transformers.Qwen3OmniMoeConfig().to_dict(), "qwen3_omni_moe_vision_encoder"),
    ],
)
def test_wrappers_give_their_vision_tower(make, model_type):
    rope = vision_rope(make())
    assert rope.model_type == model_type and rope.form == VISION_ROPE[model_type]


def test_a_multimodal_config_gives_its_vision_tower():
    config = transformers.Qwen2_5_VLConfig(vision_config=dict(hidden_size=64, num_heads=4, depth=1))
    rope = vision_rope(config)
    assert rope.model_type == "qwen2_5_vl_vision" and rope.rope.head_dim == 16
    with pytest.raises(rotary.ConfigError, match=r"vision_rope\(config\)|vision encoder"):
        rotary.RoPE.from_hf_config({"model_type": "qwen2_5_vl_vision", "head_dim": 16})


@pytest.mark.parametrize(
    "grid, match",
    [
        ([[1, 3, 4]], r"multiples of the spatial merge size 2"),
        ([[1, 0, 4]], r"positive ints"),
        ("4x4", r"rows \(t, h, w\)"),
        (torch.ones(2, 3), r"integer rows"),
    ],
)
def test_bad_grids_say_what_to_give(grid, match):
    rope = vision_rope({"model_type": "qwen3_vl_vision", "hidden_size": 64, "num_heads": 4})
    with pytest.raises(rotary.InputError, match=match):
        rope.tables(grid)


def test_loftr_takes_a_coarse_map_at_least_its_aggregation_kernel():
    rope = vision_rope({"model_type": "efficientloftr", "hidden_size": 64, "num_attention_heads": 8})
    assert rope.positions((8, 13)).values.tolist()[:4] == [[1, 1], [1, 2], [1, 3], [2, 1]]  # (8 - 4) // 4 + 1 = 2
    with pytest.raises(
        rotary.InputError, match=r"coarse feature map \(3, 8\) is smaller than its aggregation kernel 4"
    ):
        rope.tables((3, 8))


def test_sam2_memory_takes_its_config_grid_and_memory_frames():
    rope = vision_rope({"model_type": "sam2_video", "memory_attention_rope_feat_sizes": [3, 2]})
    keys = rope.positions(memory_frames=2, object_pointers=1)
    assert keys.values.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]] * 2 + [[0, 0]]
    assert rope.tables(memory_frames=2, object_pointers=1).cos[-1].eq(1).all()  # the pointer: no rotation
    with pytest.raises(rotary.InputError, match=r"rotates the fixed grid .* \(2, 3\); got \(3, 2\)"):
        rope.tables((3, 2))
    with pytest.raises(rotary.InputError, match=r"give memory_frames= too"):
        rope.tables(object_pointers=2)
    with pytest.raises(rotary.InputError, match=r"memory_frames= and object_pointers= are for SAM 2 video"):
        vision_rope({"model_type": "qwen3_vl_vision", "hidden_size": 64, "num_heads": 4}).tables(
            [[1, 2, 2]], memory_frames=1
        )


def test_merge_sizes_are_given_where_the_tower_takes_them():
    per_call = vision_rope({"model_type": "video_llama_3_vision", "hidden_size": 64, "num_attention_heads": 4})
    with pytest.raises(rotary.InputError, match=r"give merge_sizes= with one positive int per grid row \(2\)"):
        per_call.tables([[1, 4, 4], [1, 2, 2]])
    with pytest.raises(rotary.InputError, match=r"multiples of the spatial merge size 4"):
        per_call.tables([[1, 4, 4], [1, 2, 2]], merge_sizes=[1, 4])
    fixed = vision_rope({"model_type": "qwen3_vl_vision", "hidden_size": 64, "num_heads": 4})
    with pytest.raises(rotary.InputError, match=r"merges 2 x 2 blocks \(its config\)"):
        fixed.tables([[1, 4, 4]], merge_sizes=[2])


# ---- rotary.hf.patch on the towers that rotate through apply_rotary_pos_emb_vision ----------------
PATCHED = sorted(t for t in VISION_ROPE if t in patching.SUPPORTED)


def test_patch_covers_the_apply_rotary_pos_emb_vision_towers():
    """Every tower whose modeling module has apply_rotary_pos_emb_vision in transformers' own form is patchable."""
    want = {t for t, form in VISION_ROPE.items() if form in ("qwen_vl", "qwen_vl_window", "kimi")}
    assert len(want) == 21 and "minimax_m3_vl_vision" in PATCHED  # MiniMax: its own function, its own test
    assert want <= set(PATCHED)
    reference = inspect.getsource(tower("qwen2_vl_vision")[0].apply_rotary_pos_emb_vision)
    for model_type in want:
        module = importlib.import_module(patching.SUPPORTED[model_type].module)
        assert inspect.getsource(module.apply_rotary_pos_emb_vision) == reference, model_type


@pytest.mark.parametrize("model_type", PATCHED)
def test_patched_tower_outputs_equal_unpatched(model_type, monkeypatch):
    module, model, inputs = tower(model_type)
    calls = []
    real, real_plan = patching.rotate, rotary.rotation.run_plan
    inside = []  # a plan run by rotate itself is that rotate call, counted once

    def counting(xs, *args, **kwargs):
        calls.append(len(xs))
        inside.append(1)
        try:
            return real(xs, *args, **kwargs)
        finally:
            inside.pop()

    def counting_plan(plan, xs, *args):  # a later block's call with the same signature: its recorded plan
        outs = real_plan(plan, xs, *args)
        if outs and not inside:
            calls.append(len(xs))
        return outs

    monkeypatch.setattr(patching, "rotate", counting)
    monkeypatch.setattr(rotary.rotation, "run_plan", counting_plan)
    with torch.no_grad():
        before = _call(model, model_type, inputs)
        rotary.hf.patch(model)
        try:
            patched = _call(model, model_type, inputs)
        finally:
            rotary.hf.unpatch(model)
        after = _call(model, model_type, inputs)
    layers = len(recorded(model_type)[2])
    if VISION_ROPE[model_type] == "gemma4":  # q and k in calls of their own, each half by its own table
        assert calls == [1] * (2 * layers)
    else:
        assert calls == [2] * layers  # q and k of every block went through rotary, in one call each
    compared = 0
    for name in ("last_hidden_state", "pooler_output", "feature_maps"):  # EfficientLoFTR's: its feature maps
        if getattr(before, name, None) is not None:
            torch.testing.assert_close(getattr(patched, name), getattr(before, name), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(getattr(after, name), getattr(before, name), rtol=0, atol=0)
            compared += 1
    assert compared


def test_gemma4_replacement_equals_transformers(gen):
    """Gemma 4's replacement against transformers' apply_multidimensional_rope on random q (the model's own
    cos/sin of a 3 x 6 image): equal in fp32; in bf16 transformers rounds each product and sum in bf16,
    rotary once from fp32, so they differ by one bf16 rounding."""
    from transformers.models.gemma4 import modeling_gemma4 as theirs

    config = _config("gemma4_vision")
    pos = tower("gemma4_vision")[2]["pixel_position_ids"]
    ours = patching.SUPPORTED["gemma4_vision"].replacements["apply_multidimensional_rope"]
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, pos.shape[1], 4, config.head_dim, generator=gen).to(dtype)
        cos, sin = theirs.Gemma4VisionRotaryEmbedding(config)(x, pos)
        got, want = ours(x, cos, sin, pos), theirs.apply_multidimensional_rope(x, cos, sin, pos)
        assert got.dtype == want.dtype == dtype and not torch.equal(got, x)
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        else:
            torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)


def test_vision_replacement_equals_transformers_in_bf16(gen):
    """The replacement against transformers' apply_rotary_pos_emb_vision on random q/k, fp32 and bf16,
    strided [N, H, D] views (as the towers' unbind gives) and Kimi's [1, N, H, D]."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision as theirs

    ours = patching.SUPPORTED["qwen2_vl_vision"].replacements["apply_rotary_pos_emb_vision"]
    cos_sin = vision_rope({"model_type": "qwen2_vl_vision", "embed_dim": 64, "num_heads": 4}).tables(GRID_THW)
    n = cos_sin.cos.shape[0]
    for dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(n, 3, 4, 16, generator=gen).to(dtype)
        for q, k in ((qkv[:, 0], qkv[:, 1]), (qkv[None, :, 0], qkv[None, :, 1])):
            got, want = ours(q, k, cos_sin.cos, cos_sin.sin), theirs(q, k, cos_sin.cos, cos_sin.sin)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype == dtype and a.shape == b.shape
                tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16: both round the fp32 result once
                torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_minimax_replacement_equals_transformers(gen):
    """MiniMax-M3-VL rotates the first 3·2⌊D/6⌋ channels (78 of 80) in q's dtype: the same in fp32, within a
    bf16 rounding in bf16 (rotary rotates in fp32 and rounds once)."""
    from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import apply_rotary_pos_emb_vision as theirs

    ours = patching.SUPPORTED["minimax_m3_vl_vision"].replacements["apply_rotary_pos_emb_vision"]
    rope = vision_rope({"model_type": "minimax_m3_vl_vision", "hidden_size": 320, "num_attention_heads": 4})
    tables = rope.tables(GRID_THW)
    assert tables.cos.shape == (64, 78)  # 24 + 2 x 12 + 16 patches
    for dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(1, 64, 3, 4, 80, generator=gen).to(dtype)
        q, k = qkv[:, :, 0], qkv[:, :, 1]
        cos, sin = tables.cos.to(dtype), tables.sin.to(dtype)
        for x, a, b in zip((q, k), ours(q, k, cos, sin), theirs(q, k, cos, sin)):
            assert a.dtype == b.dtype == dtype
            tol = 1e-6 if dtype == torch.float32 else 1.6e-2  # bf16: transformers rounds each product
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
            assert a[..., 78:].equal(x[..., 78:]) and not a[..., :78].equal(x[..., :78])  # the tail passes through
