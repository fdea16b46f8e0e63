"""What each Hugging Face architecture (``model_type``) means for its RoPE, and the readers of those keys.

:data:`PAIRING` (checked against transformers' modeling code, tests/test_hf_architectures.py),
:data:`UNSUPPORTED` (what :func:`rotary.hf.config.read_hf_config` refuses, and why), :data:`MROPE_MODELS`,
:data:`NO_ROPE_DEFAULTS` (NoPE layers), :data:`TEXT_MODEL_TYPES` (the text model of multimodal wrappers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._checks import check_bool, is_int, is_number, is_positive_int
from ..rope_types import ConfigError, complain
from .encoder_tables import SEQUENCE_ROPE
from .vision_tables import VISION_ROPE

__all__ = [
    "MROPE_MODELS",
    "NO_ROPE_DEFAULTS",
    "PAIRING",
    "PARTIAL_READERS",
    "TEXT_MODEL_TYPES",
    "UNSUPPORTED",
    "read_mrope",
    "read_pairing",
    "read_rope_layers",
]


# ------------------------------------------------------------------------------------------------
# pairing of the rotated channels, per architecture

HALF, INTERLEAVED, FLAG = "half", "interleaved", "rope_interleave"

#: model_type -> how its attention pairs the rotated channels of q and k as they come out of the
#: projections: ``"half"`` (i, i + r/2), ``"interleaved"`` (2i, 2i + 1), or ``"rope_interleave"``
#: (the config's ``rope_interleave`` flag decides; true by default, as in transformers: MLA
#: checkpoints store their rope channels interleaved and transformers de-interleaves them before
#: rotating, which gives the same attention scores as rotating pairs (2i, 2i + 1)). Every entry is
#: checked against the model's own code in transformers by tests/test_hf_architectures.py.
PAIRING: dict[str, str] = {
    **dict.fromkeys(
        (
            "afmoe apertus arcee aria_text bamba beam bitnet chameleon clvp_encoder cohere_compass_text csm "
            "csm_depth_decoder_model cwm dbrx deepseek_ocr2_text dia dia_decoder dia_encoder diffllama "
            "diffusion_gemma_text doge dots1 embedding_gemma2_text emu3_text_model esm esmc eurobert evolla "
            "EvollaModel exaone4 exaone_moe falcon falcon_h1 flex_olmo flint gemma gemma2 gemma3_text gemma3n_text "
            "gemma4_text gemma4_unified_text glm4_moe gpt_neox gpt_neox_japanese gpt_oss gradium_phonon_tts granite "
            "granite4_vision_text granite_docling_text granite_swa granitemoe granitemoe_swa granitemoehybrid "
            "granitemoeshared gte higgs_audio_v2 hrm_text hunyuan_v1_dense hunyuan_v1_moe hy_v3 hy_v4 hyperclovax "
            "idefics jais2 jetmoe jina_embeddings_v3 kolibri1 kyutai_speech_to_text laguna lfm2 lfm2_moe lfm3 llama "
            "mellum mimo_v2_flash minicpm3 minimax minimax_m2 minimax_m3_vl_text ministral ministral3 mistral mixtral "
            "mllama_text_model modernbert modernbert-decoder molmo2_text moshi muse_glimmer_text muse_spark_text "
            "nemotron neomme nomic_bert olmo olmo2 olmo3 olmo_hybrid olmoe persimmon phi phi3 phi4_multimodal phimoe "
            "pocket_tts qwen2 qwen2_5_vl_text qwen2_moe qwen2_vl_text qwen3 qwen3_moe qwen3_next "
            "qwen3_omni_moe_talker_code_predictor qwen3_omni_moe_talker_text qwen3_vl_text qwen4_exp_text "
            "recurrent_gemma seed_oss smollm3 solar_open stablelm starcoder2 step3p5 t5gemma t5gemma2 "
            "t5gemma2_decoder t5gemma2_text ultrabert unlimited_ocr_text vaultgemma voxtral_realtime_text zamba2 zaya"
        ).split(),
        HALF,
    ),
    **dict.fromkeys(
        (
            "axk2 blt_local_decoder blt_local_encoder blt_patcher codegen cohere cohere2 cohere2_moe deepseek_v32 "
            "deepseek_v4 dots3_note_text ernie4_5 "
            "ernie4_5_moe glm glm4 gptj helium llama4_text longcat_flash moonshine moonshine_streaming "
            "openai_privacy_filter roformer"
        ).split(),
        INTERLEAVED,
    ),
    **dict.fromkeys(
        (
            "axk1 bailing_hybrid deepseek_v2 deepseek_v3 glm4_moe_lite glm_moe_dsa mistral4 mistral_large4_text youtu"
        ).split(),
        FLAG,
    ),
    # the text attention of the vision-language models with multimodal RoPE (MROPE_MODELS)
    **dict.fromkeys(
        (
            "cosmos3_edge_text glm4v_moe_text glm_image_text hunyuan_vl_text paddleocr_vl_text qwen2_5_omni_talker "
            "qwen2_5_omni_text qwen3_5_moe_text qwen3_5_text qwen3_omni_moe_text qwen3_vl_moe_text"
        ).split(),
        HALF,
    ),
    **dict.fromkeys("ernie4_5_vl_moe_text glm4v_text glm_ocr_text".split(), INTERLEAVED),
}

_NOT_TEXT = (
    "is not a decoder of text tokens (its RoPE rotates image, audio or other positions); from_hf_config "
    "builds the RoPE of text attention"
)
_NO_ROPE = (
    "applies no rotary embedding in its attention with transformers' default settings, and rotary has not "
    "checked the settings that turn one on"
)
_NO_ROPE_AT_ALL = (
    "applies no rotary embedding in its attention layers (its modeling file defines one that no layer calls, "
    "and no config key turns it on)"
)
_NOPE_ONLY = (
    "applies no rotary embedding: its softmax attention layers are NoPE by design (its config class refuses any "
    "qk_rope_head_dim but 0) and its other layers are linear attention"
)
_SPEECH_ONLY = (
    "applies RoPE only in its speech encoder (a Conformer with position_embeddings_type='rotary'), not in its "
    "text attention; from_hf_config builds the RoPE of text attention"
)
_NEGATIVE = (
    "rotates by -theta (its rotate_half has the opposite sign), the inverse of the rotation rotary applies; "
    "from_hf_config cannot build it"
)
#: the model types of :data:`PAIRING` whose transformers model reads ``partial_rotary_factor`` with rope_type
#: ``"default"`` (its rotary class's default frequencies, or transformers' generic ones, take the factor). Every other
#: type of PAIRING computes its default frequencies over the whole head and never reads the factor (Llama's code,
#: copied into 138 model types), so a factor in such a config is a mistake its model does not follow (read_hf_config:
#: an error, with strict=False what transformers rotates). Checked against transformers' modeling code by
#: tests/test_hf_config.py.
PARTIAL_READERS = frozenset(
    "bamba clvp_encoder codegen deepseek_v4 diffusion_gemma_text dots3_note_text glm glm4 glm4_moe glm4_moe_lite "
    "glm4v_moe_text glm4v_text glm_image_text glm_ocr_text gpt_neox gpt_neox_japanese gptj laguna mellum "
    "mimo_v2_flash minimax_m2 minimax_m3_vl_text moonshine moonshine_streaming nemotron neomme persimmon phi phi3 "
    "phi4_multimodal qwen3_5_moe_text qwen3_5_text qwen3_next qwen4_exp_text recurrent_gemma roformer solar_open "
    "stablelm step3p5 zaya".split()
)

_COMPONENTS = (
    "is a byte-patching model of three transformers, each with its own head width and RoPE settings: a local "
    "encoder and a local decoder over byte positions and a global transformer over patch positions; build the "
    "RoPE of a local model from its sub-config, RoPE.from_hf_config(config.encoder_config) or "
    "RoPE.from_hf_config(config.decoder_config)"
)
_COORDINATES = (
    "rotates by the 3-D coordinates (x, y, z) and a space id of each atom in its atom encoder, not by token "
    "positions; from_hf_config builds the RoPE of its protein language model, RoPE.from_hf_config(config.esmc_config)"
)

#: model_type -> why from_hf_config does not build its RoPE. Checked by tests/test_hf_architectures.py: every
#: RoPE-applying model_type of transformers is in PAIRING or here (or is a wrapper whose text part is).
UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(
        (
            "chameleon_vqgan cosmos3_edge_vision "
            "deepseek_ocr2_sam_vision_model "
            "edgetam_video_mask_decoder edgetam_video_prompt_encoder "
            "emu3_vqgan gemma3n_audio gemma3n_vision "
            "gemma4_audio gemma4_unified_audio gemma4_unified_vision "
            "glm_image_vision glm_image_vqmodel granite_docling_vision "
            "hunyuan_vl_vision idefics_perciever idefics_vision "
            "lightglue mlcd "
            "mlcd_vision_model mllama_vision_model molmo2_adapter molmo2_vision moonshine_streaming_encoder "
            "muse_spark_audio "
            "nemotron_asr_streaming nemotron_asr_streaming_encoder "
            "neucodec parakeet_ctc parakeet_encoder parakeet_rnnt parakeet_tdt "
            "phi4_multimodal_audio phi4_multimodal_vision "
            "qwen2_5_omni qwen2_5_omni_audio_encoder qwen2_5_omni_bigvgan "
            "qwen3_omni_moe qwen3_omni_moe_audio_encoder "
            "sam2_video_mask_decoder sam2_video_prompt_encoder sam3 "
            "sam3_detr_decoder sam3_detr_encoder sam3_geometry_encoder sam3_mask_decoder "
            "sam3_tracker_video_mask_decoder sam3_tracker_video_prompt_encoder sam3_vision_model "
            "sapiens2_head t5_gemma_module unlimited_ocr_sam_vision_model unlimited_ocr_vision "
            "unlimited_ocr_vision_encoder vjepa2 wav2vec2-bert "
            "wav2vec2-conformer xcodec2"
        ).split(),
        _NOT_TEXT,
    ),
    **dict.fromkeys(
        ("clvp_decoder inkling2_text").split(),
        _NO_ROPE,
    ),
    "glm5_next_text": _NOPE_ONLY,
    "jamba": _NO_ROPE_AT_ALL,
    "moshi_depth": _NO_ROPE_AT_ALL,  # its layers are built with use_rope=False
    "nemotron_h": _NO_ROPE_AT_ALL,
    "nanochat": _NEGATIVE,
    "seamless_m4t": _SPEECH_ONLY,
    "blt": _COMPONENTS,
    "esmfold2": _COORDINATES,
}

#: model_type -> (default ``mrope_section``, slot layout) of the multimodal RoPE its text attention uses
#: (layouts: :mod:`rotary.variants.mrope`); the layout is the model's code's, whatever a
#: ``mrope_interleaved`` key says (transformers ignores it). ``None``: the config must state the sections
#: (HunYuan-VL's model cannot run without them). Checked against each model's own rotary embedding and
#: apply function by tests/variants/test_mrope.py and tests/variants/test_mrope_families.py.
MROPE_MODELS: dict[str, tuple[tuple[int, ...] | None, str]] = {
    "qwen2_vl_text": ((16, 24, 24), "chunked"),
    "qwen2_5_vl_text": ((16, 24, 24), "chunked"),
    "qwen2_5_omni_text": ((16, 24, 24), "chunked"),
    "qwen2_5_omni_talker": ((16, 24, 24), "chunked"),
    "paddleocr_vl_text": ((16, 24, 24), "chunked"),
    "glm4v_text": ((8, 12, 12), "chunked"),
    "glm4v_moe_text": ((8, 12, 12), "chunked"),
    "glm_image_text": ((8, 12, 12), "chunked"),
    "glm_ocr_text": ((8, 12, 12), "chunked"),
    "hunyuan_vl_text": (None, "chunked"),  # XD-RoPE: one section per axis, three or four
    "qwen3_vl_text": ((24, 20, 20), "interleaved"),
    "qwen3_vl_moe_text": ((24, 20, 20), "interleaved"),
    "qwen3_omni_moe_text": ((24, 20, 20), "interleaved"),
    "qwen3_5_text": ((11, 11, 10), "interleaved"),
    "qwen3_5_moe_text": ((11, 11, 10), "interleaved"),
    "cosmos3_edge_text": ((24, 20, 20), "interleaved"),
    "ernie4_5_vl_moe_text": ((22, 22, 20), "paired_hw"),  # sections (h, w, t)
    "qwen4_exp_text": ((11, 11, 10), "interleaved"),
    "qwen3_omni_moe_talker_text": ((24, 20, 20), "interleaved"),
}

#: model_type -> how its config class fills a missing or empty ``no_rope_layers`` (NoPE layers): from
#: ``no_rope_layer_interval`` when the list is ``None`` ("none") or also when it is empty ("falsy"), as
#: transformers' Llama 4 and SmolLM3 configs do
NO_ROPE_DEFAULTS = {"llama4_text": "falsy", "smollm3": "none"}

#: multimodal wrapper model_type -> the model_type of its ``text_config``, for configs whose
#: ``text_config`` does not state one (transformers' default sub-config; checked by the tests)
TEXT_MODEL_TYPES: dict[str, str] = {
    "gemma3": "gemma3_text",
    "llama4": "llama4_text",
    "qwen2_vl": "qwen2_vl_text",
    "qwen2_5_vl": "qwen2_5_vl_text",
    "qwen3_vl": "qwen3_vl_text",
    "mistral3": "mistral",
    "aria": "aria_text",
}


#: (producer, table) pairs for the coverage table (:mod:`rotary.hf.coverage`): a model_type is built by the first
#: table that holds it. Other modules of rotary.hf add their own ``COVERAGE`` (e.g. a vision-encoder table).
COVERAGE = [("MRoPE.from_hf_config", MROPE_MODELS), ("RoPE.from_hf_config", PAIRING)]


def read_pairing(d: Mapping[str, Any], model_type: str, interleaved: bool | None, label: str) -> bool:
    """The pairing of ``model_type`` (or the one stated), or a ConfigError naming what to pass."""
    if model_type in UNSUPPORTED:
        raise ConfigError(f"{label}: model_type {model_type!r} {UNSUPPORTED[model_type]}")
    if model_type in VISION_ROPE:
        raise ConfigError(
            f"{label}: model_type {model_type!r} is a vision encoder (its RoPE rotates image patches); build it "
            "with rotary.hf.vision_rope(vision_config)"
        )
    if interleaved is not None:
        return check_bool(interleaved, "interleaved")
    rule = PAIRING.get(model_type, SEQUENCE_ROPE.get(model_type))
    if rule is None:
        what = f"model_type {model_type!r} is not in rotary's pairing table" if model_type else "it has no model_type"
        raise ConfigError(
            f"{label}: {what}, so the pairing of its rotated channels is unknown (rotary.hf.PAIRING lists the "
            "architectures checked against transformers); pass interleaved=True if its attention rotates pairs "
            "(2i, 2i+1) or interleaved=False for pairs (i, i + rotary_dim/2)"
        )
    if rule == FLAG:
        flag = d.get("rope_interleave", True)
        if not isinstance(flag, bool):
            raise ConfigError(f"{label}: rope_interleave must be true or false, got {flag!r} ({type(flag).__name__})")
        return flag
    return rule == INTERLEAVED


def read_mrope(block: dict[str, Any], model_type: str, label: str, strict: bool) -> tuple[tuple[int, ...] | None, str]:
    """Take the multimodal-RoPE keys out of ``block``: ``(mrope_section, slot layout)`` or ``(None, "chunked")``."""
    if model_type not in MROPE_MODELS:
        if "mrope_section" in block:
            raise ConfigError(
                f"{label}: the block has mrope_section, but model_type {model_type!r} does not use multimodal RoPE "
                f"(rotary reads it for {', '.join(sorted(MROPE_MODELS))}); remove the key or fix the model_type"
            )
        return None, "chunked"
    default, layout = MROPE_MODELS[model_type]
    interleaved = layout == "interleaved"
    if block["rope_type"] == "mrope":
        block["rope_type"] = "default"  # 4.x configs name M-RoPE's (default) frequencies "mrope"
    if model_type == "hunyuan_vl_text" and block["rope_type"] == "xdrope":
        # HunyuanOCR's config.json name, "dynamic" as transformers' config class renames it; with an alpha,
        # that is NTK by alpha (rope_types.canonical_rope_type), as for HunYuan's text models
        block["rope_type"] = "ntk_alpha" if block.get("alpha") else "dynamic"
    section = block.pop("mrope_section", None)
    legacy = block.pop("xdrope_section", None)  # HunYuan-VL's older name, as transformers' config reads it
    if legacy is not None and section is not None and list(legacy) != list(section):
        raise ConfigError(f"{label}: mrope_section {section!r} and xdrope_section {legacy!r} differ; keep one")
    section = legacy if section is None else section
    section = default if section is None else section
    if section is None:
        raise ConfigError(
            f"{label}: {model_type} needs rope_parameters['mrope_section'] (XD-RoPE: slots per axis, e.g. "
            "[16, 16, 16, 16] for head_dim 128); its model cannot run without it"
        )
    if isinstance(section, (list, tuple)) and all(is_number(v) and float(v).is_integer() for v in section):
        section = [int(v) for v in section]  # HunYuan-VL configs write the sections as floats
    if not isinstance(section, (list, tuple)) or not all(is_int(v) and v > 0 for v in section):
        raise ConfigError(f"{label}: mrope_section must be a list of positive ints (t, h, w), got {section!r}")
    flag = block.pop("mrope_interleaved", None)
    if flag is not None and flag is not interleaved:
        complain(
            f"{label}: mrope_interleaved={flag!r}, but {model_type} lays its frequency slots out {layout} whatever "
            "the flag says (transformers ignores it); remove the key",
            strict,
        )
    return tuple(int(v) for v in section), layout


def read_rope_layers(d: Mapping[str, Any], model_type: str, label: str) -> tuple[bool, ...] | None:
    """One flag per layer from ``no_rope_layers`` (1 = RoPE, 0 = NoPE), filled as the model's config class does."""
    flags = d.get("no_rope_layers")
    layers = d.get("num_hidden_layers")
    rule = NO_ROPE_DEFAULTS.get(model_type)
    if (rule == "none" and flags is None) or (rule == "falsy" and not flags):
        interval = d.get("no_rope_layer_interval", 4)
        if not (is_positive_int(layers) and is_positive_int(interval)):
            raise ConfigError(
                f"{label}: {model_type} drops RoPE in every no_rope_layer_interval-th layer, but num_hidden_layers="
                f"{layers!r} / no_rope_layer_interval={interval!r} are not positive ints"
            )
        flags = [int((i + 1) % interval != 0) for i in range(layers)]  # as rotary.variants.default_no_rope_layers
    if flags is None:
        return None
    if not isinstance(flags, (list, tuple)) or any(isinstance(v, bool) or v not in (0, 1) for v in flags):
        raise ConfigError(
            f"{label}: no_rope_layers must be a list of 0/1 flags (1 = the layer uses RoPE), got {flags!r}"
        )
    if is_positive_int(layers):
        if len(flags) < layers:
            raise ConfigError(f"{label}: no_rope_layers has {len(flags)} flags but the model has {layers} layers")
        flags = flags[:layers]  # transformers reads the first num_hidden_layers
    return tuple(v == 1 for v in flags)
