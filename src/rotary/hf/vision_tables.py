"""The tables of the vision (and other non-text) encoders: which ones :func:`rotary.hf.vision_rope` builds
and in what form, and why each other RoPE-applying encoder is not built. Plain data, imported by
:mod:`rotary.hf.architectures` (to point a vision type at its producer) and :mod:`rotary.hf.vision`."""

from __future__ import annotations

from .encoder_tables import LEARNED_FREQUENCIES, NO_ROPE, NOT_BUILT, REFUSED

__all__ = ["COVERAGE", "ENCODER_STATUS", "FORMS", "VISION_ROPE"]

#: form -> what the tower does (the coverage table shows it beside each model_type)
FORMS: dict[str, str] = {
    "qwen_vl": (
        "2-D axial RoPE over (h, w), pairs (i, i + D/2), h's frequencies then w's (base^(-4k/D) each); "
        "patches in spatial_merge_size blocks, images and videos packed (grid_thw)"
    ),
    "qwen_vl_window": "qwen_vl, with the patches reordered into the tower's attention windows (window_size)",
    "kimi": "2-D axial RoPE, pairs (i, i + D/2), the pairs dealt to w and h in turn (w, h, w, h, …); grid_thw",
    "minimax": (
        "3-D axial RoPE over (t, h, w) on the first 3·2⌊D/6⌋ channels, pairs (i, i + r/2), t's, h's, w's "
        "frequencies in turn; the rest pass through; grid_thw"
    ),
    "pixtral": "2-D axial RoPE, pairs (i, i + D/2), one frequency set dealt to h and w in turn; images packed",
    "llama4": "2-D axial RoPE over (y + 1, x + 1), pairs (2i, 2i+1), x's block first; the class token last, unrotated",
    "dinov3": "2-D axial RoPE over patch centres in [-1, 1], pairs (i, i + D/2); class and register tokens first, "
    "unrotated",
    "sam3": "2-D axial RoPE over (w, h) scaled to the window size, pairs (2i, 2i+1); windowed and global layers",
    "step3p5": (
        "2-D axial RoPE over (h, w), pairs (i, i + D/2), w's frequencies then h's (base^(-4k/D) each); one image "
        "grid per call (a batch shares it), patches row by row, no merge"
    ),
    "sam2_memory": (
        "the memory attention's 2-D axial RoPE over (h, w) of the memory_attention_rope_feat_sizes grid, row by row, "
        "pairs (2i, 2i+1), w's frequencies then h's (base^(-4k/D) each); the keys repeat the grid's table once per "
        "memory frame and leave the object-pointer tokens after them unrotated"
    ),
    "edgetam_memory": (
        "sam2_memory's RoPE (pairs (2i, 2i+1), w's frequencies then h's) over the memory_attention_rope_feat_sizes "
        "grid "
        "for the queries; each memory frame's keys: its perceiver_resampler_num_latents latents unrotated, then the "
        "memory_attention_rope_k_sizes grid row by row; the object-pointer tokens after them unrotated"
    ),
    "muse": (
        "2-D axial RoPE over (row + 1, col + 1), pairs (i, i + D/2), w's frequencies then h's (base^(-4k/D) each); "
        "patches read window by window (pos_emb_height x pos_emb_height, no merge before the attention), images "
        "and videos packed (grid_thw)"
    ),
    "inkling2": (
        "2-D axial RoPE over (h, w), pairs (2i, 2i+1), w's frequencies then h's (base^(-4k/D) each); per image a "
        "class token at (0, 0), then its patches at (row + 1, col + 1) in spatial_merge_size blocks; images packed "
        "(image_grid_thw, counted in merged tokens)"
    ),
    "loftr": (
        "2-D axial RoPE over (row + 1, col + 1) of the aggregated coarse feature map (q_aggregation_kernel_size, "
        "q_aggregation_stride), on the whole hidden width before the heads split (each head turns by its own "
        "slice of the frequencies), pairs (2i, 2i+1) dealt to h and w in turn, base^(-4k/hidden_size)"
    ),
    "gemma4": (
        "2-D axial RoPE over (x, y) = (column, row), each axis on its own half of the head: x rotates "
        "channels [0, D/2), y channels [D/2, D), pairs (i, i + D/4) within each half, base^(-4k/D) for both; "
        "one image per call, patches row by row; one table per half"
    ),
}

#: model_type -> its form (:data:`FORMS`); :func:`vision_rope` builds each
VISION_ROPE: dict[str, str] = {
    **dict.fromkeys(
        (
            "qwen2_vl_vision qwen3_vl_vision qwen3_vl_moe_vision qwen3_5_vision qwen3_5_moe_vision "
            "qwen3_omni_moe_vision_encoder qwen4_exp_vision glm4v_vision glm4v_moe_vision glm_ocr_vision "
            "glm5_next_vision ernie4_5_vl_moe_vision paddleocr_vl_vision cohere_compass_vision "
            "dots3_note_vision_encoder lfm3_vl_vision video_llama_3_vision"
        ).split(),
        "qwen_vl",
    ),
    **dict.fromkeys("qwen2_5_vl_vision qwen2_5_omni_vision_encoder exaone4_5_vision".split(), "qwen_vl_window"),
    "kimi_k25_vision": "kimi",
    "minimax_m3_vl_vision": "minimax",
    "pixtral": "pixtral",
    "llama4_vision_model": "llama4",
    **dict.fromkeys("dinov3_vit eomt_dinov3 sapiens2".split(), "dinov3"),
    "sam3_vit_model": "sam3",
    "gemma4_vision": "gemma4",
    "step3p5_vision": "step3p5",
    "inkling2_vision": "inkling2",
    "efficientloftr": "loftr",
    **dict.fromkeys(("muse_glimmer_vision", "muse_spark_vision"), "muse"),
    **dict.fromkeys(("sam2_video", "sam3_tracker_video"), "sam2_memory"),
    "edgetam_video": "edgetam_memory",
}

_AUDIO = "audio encoder: RoPE over audio frames; not built from its config yet"
_VIDEO = "video encoder: RoPE over video positions; not built from its config yet"
_SEGMENT = (
    "segmentation / tracking part (mask decoder, prompt encoder, memory attention): RoPE over feature-map "
    "positions; not built yet"
)
_CODEC = "audio codec / vocoder / speech tokenizer: RoPE over frames inside the codec; not built yet"
_VISION_LATER = "vision encoder: RoPE over image patches; not built from its config yet"
_NO_ROPE_TOWER = "no RoPE in this part: the RoPE in its modeling file belongs to another part of the model"
_WRAPPER = (
    "wrapper: a model of several parts; vision_rope(config) builds its vision tower (vision_config, "
    "backbone_config), the other parts from their own sub-configs"
)
_OTHER = "other encoder (byte patches, feature matching, time series, an assistant model): its RoPE is not built yet"

#: model_type -> why :func:`vision_rope` does not build it (category first). Every RoPE-applying model
#: type that is not a text decoder and not in :data:`VISION_ROPE` is here (checked by the tests).
ENCODER_STATUS: dict[str, str] = {
    **dict.fromkeys(
        ("gemma3n_vision",),
        _VISION_LATER,
    ),
    **dict.fromkeys(
        (
            "chameleon_vqgan emu3_vqgan gemma4_unified_vision glm_image_vision glm_image_vqmodel hunyuan_vl_vision "
            "idefics_perciever "
            "idefics_vision mllama_vision_model molmo2_adapter sapiens2_head t5_gemma_module"
        ).split(),
        _NO_ROPE_TOWER,
    ),
    **dict.fromkeys("qwen2_5_omni qwen3_omni_moe sam3 sam3_vision_model".split(), _WRAPPER),
    **{  # built by rotary.RoPEMixed from the checkpoint's weights, not by vision_rope from the config
        t: "other encoder (byte patches, feature matching, time series, an assistant model): not read from its "
        "config, its frequencies are learned: " + how
        for t, how in LEARNED_FREQUENCIES.items()
    },
    **NO_ROPE,  # in a modeling file with a rotary embedding, but their forward pass applies none
    **REFUSED,  # what their code does is not a rotation of q and k
    **NOT_BUILT,  # exactly why each of the others is not built yet
}


# ------------------------------------------------------------------------------------------------
# reading the config

#: the coverage table's entry (rotary.hf.coverage): the vision towers vision_rope builds
COVERAGE = [("rotary.hf.vision_rope", VISION_ROPE)]
