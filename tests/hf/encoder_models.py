"""Tiny models of transformers' non-text encoders (audio, vision, video, segmentation, codecs, others), run once
with their RoPE recorded: the harness of tests/hf/test_encoders.py.

For a model type, :func:`build` makes a tiny model (one layer, small widths, random weights) from its config
class and the inputs one forward takes; :func:`record` runs that forward with every RoPE function of its modeling
module replaced by a recording wrapper: the module's ``apply_*rot*/rope/pos*`` functions (and static methods) and
the ``forward`` of its classes named ``*Rotary*``/``*Rope*``. A call is recorded only at the outermost level (an
apply function calling ``rotate_half`` is one call). ``python tests/hf/encoder_models.py [TYPE ...]`` prints, for
each type, the calls its forward made: the evidence behind the coverage table's encoder rows.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import sys
import types
import warnings
from typing import Any

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

transformers.logging.set_verbosity_error()

#: small sizes for any config class (only the fields a class has are set)
TINY: dict[str, Any] = dict(
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    num_heads=2,
    head_dim=16,
    depth=1,
    embed_dim=32,
    encoder_layers=1,
    encoder_attention_heads=2,
    d_model=32,
    encoder_ffn_dim=32,
    num_mel_bins=16,
    output_dim=32,
    vocab_size=64,
)

#: model_type -> config keyword arguments on top of TINY (its own sizes, or a RoPE switched on)
_CODEC = dict(
    upsample_groups=32,
    num_filters=8,
    codebook_dim=16,
    vector_quantization_hidden_dimension=16,
    num_quantizers=2,
    codebook_size=16,
    upsampling_ratios=[4, 2],
)
OVERRIDES: dict[str, dict[str, Any]] = {
    **{t: _CODEC for t in ("mimi", "mimi_decoder", "pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_decoder")},
    "wav2vec2-bert": {"position_embeddings_type": "rotary"},
    "timesfm2_5": {"patch_length": 4, "context_length": 64},
    "deepseek_ocr2_sam_vision_model": {
        "image_size": 64,
        "patch_size": 8,
        "output_channels": 16,
        "global_attn_indexes": [0],
        "window_size": 2,
        "mlp_dim": 32,
        "downsample_channels": [16, 32],
    },
    "molmo2_vision": {"image_size": [32, 32], "patch_size": 8, "num_position_embeddings": 16},
    "cosmos3_edge_vision": {"patch_size": 4, "num_patches": 16},
    **dict.fromkeys(
        (
            "unlimited_ocr_sam_vision_model phi4_multimodal_vision "
            "granite_docling_vision step3p5_vision unlimited_ocr_vision_encoder"
        ).split(),
        {"image_size": 32, "patch_size": 8, "output_channels": 32, "global_attn_indexes": [0], "window_size": 2},
    ),
    "gemma3n_audio": {"conf_num_hidden_layers": 1, "conf_num_attention_heads": 2, "sscp_conv_channel_size": [8, 8]},
    "qwen2_5_omni_bigvgan": {
        "mel_dim": 16,  # the tiny DiT's (token2wav feeds it the DiT's mel frames)
        "upsample_initial_channel": 16,
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3, 5]],
        "upsample_rates": [2],
        "upsample_kernel_sizes": [4],
    },
    "pe_audio_encoder": {
        "dac_config": {
            "model_type": "dac",
            "encoder_hidden_size": 4,
            "downsampling_ratios": [2, 2],
            "decoder_hidden_size": 8,
            "n_codebooks": 2,
            "codebook_size": 16,
            "codebook_dim": 4,
            "hidden_size": 16,
            "upsampling_ratios": [2, 2],
            "hop_length": 4,
        }
    },
    "nemotron3_5_transcribe_word_timestamp": {"blank_token_id": 63},
    "muse_glimmer_assistant": {"target_layer_ids": [0]},
    "dots3_note_audio_encoder": {"adapter_input_size": 32, "adapter_out_dim": 32, "downsample_hidden_size": 8},
    "wav2vec2-conformer": {"position_embeddings_type": "rotary"},
    "efficientloftr": {  # 8 heads: its rotary embedding needs head_dim * partial_rotary_factor (4) = hidden_size / 2
        "hidden_size": 32,
        "num_attention_heads": 8,
        "out_features": [8, 8, 16, 32],
        "stage_num_blocks": [1, 1, 1, 1],
        "num_attention_layers": 1,
        "initializer_range": 0.2,  # q and k of order 1 (0.02: of order 1e-9, through the convolutional backbone)
    },
    "qwen2_5_omni_dit": {
        "head_dim": 16,
        "emb_dim": 8,
        "mel_dim": 16,
        "enc_emb_dim": 8,
        "enc_dim": 8,
        "enc_channels": [16, 16, 16, 16, 48],
        "enc_attention_channels": 8,
        "enc_se_channels": 8,
        "num_embeds": 64,
        "block_size": 4,
        "look_ahead_layers": [0],
        "look_backward_layers": [0],
    },
    # no early stop, no pruning; its projector (the angles) drawn with std 1, so that the keypoints turn by radians
    # small acoustic encoders and quantizers (their defaults, 768 to 2048 wide, take a second to initialise)
    **dict.fromkeys(
        ("neucodec", "xcodec2"), {"encoder_hidden_size": 4, "downsampling_ratios": [2, 2], "quantization_dim": 16}
    ),
    "lightglue": {"descriptor_dim": 32, "depth_confidence": -1.0, "width_confidence": -1.0, "initializer_range": 1.0},
    "vjepa2": {
        "crop_size": 32,
        "patch_size": 8,
        "frames_per_clip": 4,
        "tubelet_size": 2,
        "pred_hidden_size": 32,
        "pred_num_hidden_layers": 1,
        "pred_num_attention_heads": 2,
        "pred_num_mask_tokens": 2,
    },
}

#: model_type -> the model class to build, where the config class has several or none of its own
MODEL_CLASS: dict[str, str] = {"sam3_geometry_encoder": "Sam3GeometryEncoder", "sapiens2": "Sapiens2Model"}

_APPLY = re.compile(r"^apply_.*(rot|rope|pos)")
_METHOD = re.compile(r"^_apply_rotary")  # a method of the attention (wav2vec2-Conformer's)
_EMBEDDING = re.compile(r"Rotary|Rope|RoPE")


@dataclasses.dataclass
class Call:
    """One outermost call of a RoPE function or rotary-embedding module: what, from which module, args, result."""

    name: str
    caller: str
    args: tuple
    kwargs: dict
    out: Any


def modeling_module(model_type: str):
    cfg = CONFIG_MAPPING[model_type]
    return importlib.import_module(cfg.__module__.replace("configuration_", "modeling_"))


def model_class(model_type: str):
    module = modeling_module(model_type)
    if model_type in MODEL_CLASS:
        return getattr(module, MODEL_CLASS[model_type])
    cfg = CONFIG_MAPPING[model_type]
    classes = [
        o
        for n, o in vars(module).items()
        if inspect.isclass(o)
        and issubclass(o, transformers.PreTrainedModel)
        and getattr(o, "config_class", None) is cfg
        and "PreTrained" not in n
    ]
    if not classes:
        raise LookupError(f"{model_type}: no model class of its own config class in {module.__name__}")
    return classes[0]


def _tiny_kwargs(cfg, model_type: str | None) -> dict[str, Any]:
    fields = set(inspect.signature(cfg.__init__).parameters) | set(getattr(cfg, "__dataclass_fields__", {}))
    kwargs = {k: v for k, v in TINY.items() if k in fields}
    for key, sub in (getattr(cfg, "sub_configs", None) or {}).items():  # a composite: each part tiny too
        if inspect.isclass(sub) and issubclass(sub, transformers.PreTrainedConfig) and key in fields:
            kwargs[key] = sub(**_tiny_kwargs(sub, getattr(sub, "model_type", None)))
    if "audio_hidden_size" in fields:  # a head reading an audio encoder's states (Nemotron diarization's)
        kwargs["audio_hidden_size"] = TINY["hidden_size"]
    if model_type == "nemotron3_5_transcribe_audio":  # its diarization model: an AutoConfig sub-config
        kwargs["diarization_config"] = tiny_config("nemotron3_diarization")
    if model_type == "unlimited_ocr_vision":  # its SAM tower feeds its CLIP-style encoder: widths must meet
        kwargs["sam_config"] = {
            **tiny_config("unlimited_ocr_sam_vision_model").to_dict(),
            "downsample_channels": [16, 32],
        }
        kwargs["encoder_config"] = tiny_config("unlimited_ocr_vision_encoder").to_dict()
    if model_type in ("neucodec", "xcodec2"):  # their semantic encoder: a tiny wav2vec2-BERT (an AutoConfig part)
        kwargs["semantic_model_config"] = tiny_config("wav2vec2-bert").to_dict()
    if model_type == "pe_audio_video_encoder":  # its audio and video encoders: AutoConfig parts
        kwargs["audio_config"] = tiny_config("pe_audio_encoder").to_dict()
        kwargs["video_config"] = tiny_config("pe_video_encoder")
    if model_type in FRAME_CLASSIFIER:  # a transformers image classifier for its frames, in place of timm's
        kwargs[FRAME_CLASSIFIER[model_type]] = CONFIG_MAPPING["resnet"](
            embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=16
        )
    kwargs.update(OVERRIDES.get(model_type, {}))
    return kwargs


#: model_type -> the key of its sub-config that names a timm image classifier for its video frames (timm needs
#: torchvision, which cannot load with the CPU torch here): a tiny transformers ResNet classifier stands in, which
#: AutoModelForImageClassification builds as it would build timm's; the frames' logits are all the rest reads
FRAME_CLASSIFIER: dict[str, str] = {"pe_video_encoder": "vision_config"}


#: model types whose sizes are tied together in ways TINY breaks: their defaults, with one layer (Gemma 4's and
#: Phi-4's audio encoders: their widths too, 1024 -> 64, tied to each other as their defaults are)
DEFAULT_SIZES: dict[str, dict[str, Any]] = {
    "gemma4_audio": {"num_hidden_layers": 1, "hidden_size": 64, "output_proj_dims": 64},
    "muse_spark_audio": {"hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1], "out_hidden_size": 16},
    "phi4_multimodal_audio": {
        "num_blocks": 1,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "ext_pw_out_channel": 64,
        "depthwise_separable_out_channel": 64,
        "nemo_conv_channels": 64,
    },
}


def tiny_config(model_type: str):
    cfg = CONFIG_MAPPING[model_type]
    if model_type in DEFAULT_SIZES:
        config = cfg(**DEFAULT_SIZES[model_type])
    else:
        config = cfg(**_tiny_kwargs(cfg, model_type))
    # the DiT looks its attention up in ALL_ATTENTION_FUNCTIONS, which holds no "eager"
    config._attn_implementation = (
        "sdpa" if model_type.startswith(("qwen2_5_omni_dit", "qwen2_5_omni_token2wav")) else "eager"
    )
    return config


def _mel_first(config, gen):  # Whisper-style features [B, mel, T]
    return {"input_features": torch.randn(1, config.num_mel_bins, 40, generator=gen)}


def _transducer(config, gen):  # features [B, T, mel] and one decoder token
    mel = config.encoder_config.num_mel_bins
    return {
        "input_features": torch.randn(1, 40, mel, generator=gen),
        "decoder_input_ids": torch.zeros(1, 1, dtype=torch.long),
    }


def _latents(config, gen):  # a codec decoder's latent frames [B, hidden, T]
    return {"latents": torch.randn(1, config.hidden_size, 6, generator=gen)}


#: model_type -> the inputs of one forward, where the generic rule below does not fit
INPUTS: dict[str, Any] = {
    "glmasr_encoder": _mel_first,
    "voxtral_realtime_encoder": _mel_first,
    **dict.fromkeys(("parakeet_rnnt", "parakeet_tdt", "nemotron_asr_streaming"), _transducer),
    **dict.fromkeys(("mimi_decoder", "pocket_tts_audio_tokenizer_decoder"), _latents),
    "gemma3n_audio": lambda c, g: {
        "audio_mel": torch.randn(1, 40, c.input_feat_size, generator=g),
        "audio_mel_mask": torch.zeros(1, 40, dtype=torch.bool),
    },
    **dict.fromkeys(
        ("qwen2_5_omni_audio_encoder", "qwen3_omni_moe_audio_encoder"),
        lambda c, g: {
            "input_features": torch.randn(c.num_mel_bins, 200, generator=g),
            "feature_lens": torch.tensor([200]),
        },
    ),
    "dots3_note_audio_encoder": lambda c, g: {  # features [chunks, mel, frames] and each chunk's samples
        "input_features": torch.randn(1, c.feature_size, 64, generator=g),
        "chunk_sample_lengths": torch.tensor([64 * c.hop_length]),
    },
    "timesfm2_5": lambda c, g: {"past_values": torch.randn(1, 5 * c.patch_length, generator=g)},
    "muse_glimmer_assistant": lambda c, g: {
        "noise_embeds": torch.randn(1, 4, c.hidden_size, generator=g),
        "context_hidden_states": torch.randn(1, 7, len(c.target_layer_ids) * c.hidden_size, generator=g),
    },
    "qwen2_5_omni_bigvgan": lambda c, g: {"mel_spectrogram": torch.randn(1, c.mel_dim, 6, generator=g)},
    "pe_video_encoder": lambda c, g: {"pixel_values_videos": torch.randn(1, 3, 3, 32, 32, generator=g)},
    "pe_audio_video_encoder": lambda c, g: {  # 400 samples of audio, 3 frames of video
        "input_values": torch.randn(1, 1, 400, generator=g),
        "pixel_values_videos": torch.randn(1, 3, 3, 32, 32, generator=g),
    },
    "nemotron3_5_transcribe_audio": lambda c, g: {"input_features": torch.randn(1, 40, 16, generator=g)},
    "gemma4_audio": lambda c, g: {"input_features": torch.randn(1, 40, 128, generator=g)},
    "pe_audio_encoder": lambda c, g: {"input_values": torch.randn(1, 1, 400, generator=g)},
    "sam3_detr_encoder": lambda c, g: {  # one level of 3 x 4 vision features, 5 text tokens
        "vision_features": [torch.randn(1, c.hidden_size, 3, 4, generator=g)],
        "text_features": torch.randn(1, 5, c.hidden_size, generator=g),
        "vision_pos_embeds": [torch.randn(1, c.hidden_size, 3, 4, generator=g)],
    },
    "sam3_detr_decoder": lambda c, g: {  # 3 x 4 encoded vision tokens, 5 text tokens
        "vision_features": torch.randn(1, 12, c.hidden_size, generator=g),
        "text_features": torch.randn(1, 5, c.hidden_size, generator=g),
        "vision_pos_encoding": torch.randn(1, 12, c.hidden_size, generator=g),
        "spatial_shapes": torch.tensor([[3, 4]]),
    },
    "sam3_mask_decoder": lambda c, g: {  # 3 queries; features at three scales, the coarsest encoded
        "decoder_queries": torch.randn(1, 3, c.hidden_size, generator=g),
        "backbone_features": [torch.randn(1, c.hidden_size, 4 * 2**i, 4 * 2**i, generator=g) for i in (2, 1, 0)],
        "encoder_hidden_states": torch.randn(1, 16, c.hidden_size, generator=g),
    },
    "sam3_geometry_encoder": lambda c, g: {  # two boxes (cx, cy, w, h) on a 4 x 4 feature map
        "box_embeddings": torch.rand(1, 2, 4, generator=g) * 0.5 + 0.25,
        "box_mask": torch.ones(1, 2, dtype=torch.bool),
        "box_labels": torch.ones(1, 2, dtype=torch.long),
        "img_feats": (torch.randn(1, c.hidden_size, 4, 4, generator=g),),
        "img_pos_embeds": (torch.randn(1, c.hidden_size, 4, 4, generator=g),),
    },
    "cosmos3_edge_vision": lambda c, g: {  # one image of 4 x 6 patches (multiples of the 2 x 2 merge)
        "pixel_values": torch.randn(24, 3 * c.patch_size**2, generator=g),
        "grid_thw": torch.tensor([[1, 4, 6]]),
    },
    "unlimited_ocr_vision_encoder": lambda c, g: {"patch_embeds": torch.randn(1, c.hidden_size, 4, 4, generator=g)},
    "molmo2_vision": lambda c, g: {"pixel_values": torch.randn(1, 16, 3 * c.patch_size**2, generator=g)},
    "deepseek_ocr2_encoder": lambda c, g: {  # 6 image patches (bidirectional), then 5 queries (causal)
        "inputs_embeds": torch.randn(1, 11, c.hidden_size, generator=g),
        "num_patches": 6,
    },
    "deepseek_ocr2_vision": lambda c, g: {"pixel_values": torch.randn(1, 3, 64, 64, generator=g)},
    "muse_spark_audio": lambda c, g: {"input_values": torch.randn(1, 3840, generator=g)},
    "inkling2_vision": lambda c, g: {  # two images of 2 x 3 and 1 x 2 merged tokens (4 x 6, 2 x 4 patches)
        "pixel_values": torch.rand(
            8, c.patch_size * c.spatial_merge_size, c.patch_size * c.spatial_merge_size, 3, generator=g
        )
        * 2
        - 1,
        "image_grid_thw": torch.tensor([[1, 2, 3], [1, 1, 2]]),
    },
    # two grey 64 x 96 images: an 8 x 12 coarse map (stride 8), 2 x 3 tokens after the 4 x 4 aggregation
    "efficientloftr": lambda c, g: {"pixel_values": torch.rand(1, 2, 3, 64, 96, generator=g)},
    # 6 latent frames of the acoustic and semantic features, the input of their decoder
    **dict.fromkeys(
        ("neucodec", "xcodec2"),
        lambda c, g: {"latents": torch.randn(1, c.hidden_size + c.semantic_model_config.hidden_size, 6, generator=g)},
    ),
    "qwen2_5_omni_dit": lambda c, g: {  # one step of its flow: 12 mel frames from 6 codes (repeats 2)
        "hidden_states": torch.randn(1, 6 * c.repeats, c.mel_dim, generator=g),
        "condition_vector": torch.randn(1, 10, c.mel_dim, generator=g),  # a reference mel
        "speaker_embedding": torch.randn(1, 6 * c.repeats, c.enc_emb_dim, generator=g),
        "quantized_code": torch.randint(0, c.num_embeds, (1, 6), generator=g),
        "time_step": torch.tensor(0.5),
    },
    "qwen2_5_omni_token2wav": lambda c, g: {  # 6 codes, a reference mel, two steps of its flow
        "code": torch.randint(0, c.dit_config.num_embeds, (1, 6), generator=g),
        "conditioning": torch.randn(1, c.dit_config.enc_emb_dim, generator=g),
        "reference_mel": torch.randn(1, 10, c.dit_config.mel_dim, generator=g),
        "num_steps": 2,
    },
    "lightglue": lambda c, g: {"pixel_values": torch.rand(1, 2, 3, 64, 80, generator=g)},  # a pair of images
    "vjepa2": lambda c, g: {"pixel_values_videos": torch.randn(1, 4, 3, 32, 32, generator=g)},  # 2 x 4 x 4 tubelets
    "gemma4_unified_audio": lambda c, g: {"inputs_embeds": torch.randn(1, 5, c.output_proj_dims, generator=g)},
    "wav2vec2-conformer": lambda c, g: {"input_values": torch.randn(1, 4000, generator=g)},
    "wav2vec2-bert": lambda c, g: {"input_features": torch.randn(1, 40, c.feature_projection_input_dim, generator=g)},
    "phi4_multimodal_audio": lambda c, g: {
        "hidden_states": torch.randn(1, 64, c.input_size, generator=g),
        "mask": None,
    },
}


def inputs_for(model_type: str, config, model, gen: torch.Generator) -> dict:
    if model_type in INPUTS:
        return INPUTS[model_type](config, gen)
    params = list(inspect.signature(model.forward).parameters)
    first = params[1] if params[0] == "self" else params[0]
    mel = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", None) or 16
    if first == "input_features":
        return {first: torch.randn(1, 40, mel, generator=gen)}
    if first == "input_values":
        return {first: torch.randn(1, 1, 4000, generator=gen)}
    if first == "pixel_values":
        size = getattr(config, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        return {first: torch.randn(1, getattr(config, "num_channels", 3), size, size, generator=gen)}
    if first in ("inputs_embeds", "hidden_states"):
        return {first: torch.randn(1, 11, config.hidden_size, generator=gen)}
    raise NotImplementedError(f"{model_type}: no inputs for {first}")


def _gemma4_unified_embedder(config):
    """Gemma 4 unified's audio config has no model class: transformers builds its multimodal embedder from it."""
    text = tiny_config("gemma4_unified_text")
    return modeling_module("gemma4_unified_audio").Gemma4UnifiedMultimodalEmbedder(config, text)


class Decoding(torch.nn.Module):
    """A codec's ``decode(latents=...)`` as a forward: the part of NeuCodec and XCodec2 that holds their RoPE (their
    encoders, a convolutional one and a wav2vec2-BERT, apply none of their modeling file's)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, latents):
        return self.model.decode(latents=latents)


def _decoding(config):
    return Decoding(model_class(config.model_type)(config))


#: model_type -> how to build its module, where it has no model class (a part transformers builds from its config)
BUILDERS: dict[str, Any] = {
    "gemma4_unified_audio": _gemma4_unified_embedder,
    **dict.fromkeys(("neucodec", "xcodec2"), _decoding),
}


@functools.cache
def build(model_type: str):
    """The tiny model (eval mode) of ``model_type``, its modeling module and the inputs of one forward."""
    config = tiny_config(model_type)
    cls = BUILDERS.get(model_type) or model_class(model_type)
    torch.manual_seed(0)
    model = cls(config).eval()
    return modeling_module(model_type), model, inputs_for(model_type, config, model, torch.Generator().manual_seed(1))


def _targets(module) -> list[tuple[object, str]]:
    found = [(module, n) for n, v in vars(module).items() if _APPLY.match(n) and inspect.isfunction(v)]
    for cls in vars(module).values():
        if inspect.isclass(cls) and cls.__module__ == module.__name__:
            found += [(cls, n) for n, v in vars(cls).items() if _APPLY.match(n) and isinstance(v, staticmethod)]
            found += [(cls, n) for n, v in vars(cls).items() if _METHOD.match(n) and inspect.isfunction(v)]
            if _EMBEDDING.search(cls.__name__) and issubclass(cls, torch.nn.Module) and "forward" in vars(cls):
                if "Attention" not in cls.__name__:
                    found.append((cls, "forward"))
    return found


def _roi_align_stand_in(features: torch.Tensor, boxes: list[torch.Tensor], size) -> torch.Tensor:
    """Stands in for torchvision's roi_align (torchvision's wheel does not load with the CPU torch here): each box's
    cell of the feature map, average-pooled to ``size``. Not roi_align's bilinear sampling, and no part of any RoPE:
    it lets SAM 3's geometry encoder run its attention layers."""
    size = (size, size) if isinstance(size, int) else tuple(size)
    height, width = features.shape[-2:]
    crops = []
    for image, image_boxes in zip(features, boxes):
        for x0, y0, x1, y1 in image_boxes.tolist():
            x0, y0 = min(max(int(x0), 0), width - 1), min(max(int(y0), 0), height - 1)
            x1, y1 = max(min(int(x1) + 1, width), x0 + 1), max(min(int(y1) + 1, height), y0 + 1)
            crops.append(torch.nn.functional.adaptive_avg_pool2d(image[:, y0:y1, x0:x1], size))
    return torch.stack(crops)


#: model_type -> names its modeling module reads that cannot be had here, and what stands in for them during its run
STAND_INS: dict[str, dict[str, Any]] = {
    "sam3_geometry_encoder": {
        "torchvision": types.SimpleNamespace(ops=types.SimpleNamespace(roi_align=_roi_align_stand_in))
    },
}


@functools.cache
def record(model_type: str) -> tuple[Any, dict, list[Call], Any]:
    """``(model, inputs, calls, output)`` of one forward of the tiny model with its RoPE functions recorded."""
    module, model, inputs = build(model_type)
    calls: list[Call] = []
    depth = [0]
    originals = {}
    for owner, attr in _targets(module):
        raw = vars(owner)[attr]
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw
        originals[(owner, attr)] = raw
        name = f"{owner.__name__}.{attr}" if inspect.isclass(owner) else attr

        def wrapper(*args, __fn=fn, __name=name, **kwargs):
            caller = sys._getframe(1).f_locals.get("self")
            depth[0] += 1
            try:
                result = __fn(*args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                who = type(caller).__name__ if caller is not None else ""
                calls.append(Call(__name, who, args, kwargs, result))
            return result

        setattr(owner, attr, staticmethod(wrapper) if isinstance(raw, staticmethod) else wrapper)
    missing = object()
    saved = {name: getattr(module, name, missing) for name in STAND_INS.get(model_type, {})}
    for name, value in STAND_INS.get(model_type, {}).items():
        setattr(module, name, value)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(**inputs)
    finally:
        for (owner, attr), raw in originals.items():
            setattr(owner, attr, raw)
        for name, value in saved.items():
            if value is missing:
                delattr(module, name)
            else:
                setattr(module, name, value)
    return model, inputs, calls, out


def tiny_sam2_video_config(size: int = 64):
    """A tiny SAM 2 video config: a 4-stage Hiera of one to two blocks, 128-wide features (twice the memory's 64
    channels: with equal widths transformers' object pointers do not stack), a ``size / 16`` memory grid."""
    config = CONFIG_MAPPING["sam2_video"](
        vision_config=dict(
            model_type="sam2_vision_model",
            backbone_config=dict(
                model_type="sam2_hiera_det_model",
                hidden_size=16,
                blocks_per_stage=[1, 1, 2, 1],
                embed_dim_per_stage=[16, 32, 64, 128],
                num_attention_heads_per_stage=[1, 1, 1, 1],
                image_size=[size, size],
                window_size_per_stage=[8, 8, 8, 8],
                global_attention_blocks=[3],
                window_positional_embedding_background_size=[2, 2],
            ),
            backbone_channel_list=[128, 64, 32, 16],
            backbone_feature_sizes=[[size // 4] * 2, [size // 8] * 2, [size // 16] * 2],
            fpn_hidden_size=128,
        ),
        prompt_encoder_config=dict(hidden_size=128, image_size=size, mask_input_channels=4),
        mask_decoder_config=dict(hidden_size=128, mlp_dim=32, num_attention_heads=2, iou_head_hidden_dim=16),
        image_size=size,
        memory_attention_hidden_size=128,
        memory_attention_num_layers=1,
        memory_attention_num_attention_heads=2,
        memory_attention_feed_forward_hidden_size=32,
        memory_attention_rope_feat_sizes=[size // 16, size // 16],
        memory_encoder_hidden_size=128,
        memory_encoder_output_channels=64,
        mask_downsampler_embed_dim=128,
        memory_fuser_embed_dim=128,
        memory_fuser_intermediate_dim=32,
        num_maskmem=3,
    )
    config._attn_implementation = "eager"
    return config


@functools.cache
def sam2_video_session(frames: int = 3):
    """SAM 2 video run as it only runs, through an inference session: a point on frame 0 of a random ``frames``-frame
    clip, then every frame tracked. Returns ``(model, calls, ran)``: the calls of ``apply_rotary_pos_emb_2d`` (with
    the class of the module that made each) and how many times the prompt encoder and the mask decoder ran."""
    module = importlib.import_module("transformers.models.sam2_video.modeling_sam2_video")
    config = tiny_sam2_video_config()
    torch.manual_seed(0)
    model = module.Sam2VideoModel(config).eval()
    size = config.image_size
    video = torch.randn(frames, 3, size, size, generator=torch.Generator().manual_seed(1))
    session = module.Sam2VideoInferenceSession(video=video, video_height=size, video_width=size, dtype=torch.float32)
    obj = session.obj_id_to_idx(1)
    point = {"point_coords": torch.tensor([[[[size * 0.3, size * 0.6]]]]), "point_labels": torch.tensor([[[1]]])}
    session.add_point_inputs(obj, 0, point)
    session.obj_with_new_inputs = [1]
    calls: list[Call] = []
    real = module.apply_rotary_pos_emb_2d

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        caller = sys._getframe(1).f_locals.get("self")
        calls.append(Call("apply_rotary_pos_emb_2d", type(caller).__name__, args, kwargs, out))
        return out

    ran = {"prompt_encoder": 0, "mask_decoder": 0}
    hooks = [
        getattr(model, name).register_forward_hook(lambda *_, n=name: ran.__setitem__(n, ran[n] + 1)) for name in ran
    ]
    module.apply_rotary_pos_emb_2d = recording
    try:
        with torch.no_grad():
            for frame in range(frames):
                model(session, frame_idx=frame)
    finally:
        module.apply_rotary_pos_emb_2d = real
        for hook in hooks:
            hook.remove()
    return model, calls, ran


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype}{list(x.shape)}"
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in x) + ")"
    return type(x).__name__


def main(argv: list[str]) -> int:
    from rotary.hf.vision_tables import ENCODER_STATUS

    types = argv or sorted(ENCODER_STATUS)
    for model_type in types:
        try:
            _, _, calls, _ = record(model_type)
        except Exception as e:  # the probe reports; the tests are what fail
            print(flush=True)
            print(f"{model_type}: FAILED {type(e).__name__}: {str(e)[:300]}")
            continue
        names = sorted({(c.name, c.caller) for c in calls})
        print(f"{model_type}: {len(calls)} calls {names}")
        for c in calls[:2]:
            print("   ", c.name, c.caller, _describe(c.args), "->", _describe(c.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
