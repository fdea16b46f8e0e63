"""rotary.hf.patch for vision towers: the replacements of their rotary application, added to
:data:`rotary.hf.patching.SUPPORTED` when ``rotary.hf`` imports this module. They call rotary through
:mod:`rotary.hf.patching`'s names, looked up at call time.
"""

from __future__ import annotations

import torch

from ..tables import RotaryTables
from . import patching as _p


def _apply_pixtral(q, k, cos, sin, unsqueeze_dim=1):
    """Pixtral: q, k ``[B, H, S, D]``, one image grid's tables ``[S, D]`` (half layout), ``unsqueeze_dim=0``."""
    if unsqueeze_dim == 0 and cos.dim() == 2:
        return _p.apply_pair(q, k, cos, sin, interleaved=False, layout="bhsd")
    return _p.apply_half(q, k, cos, sin, unsqueeze_dim)


def _apply_vision(q, k, cos, sin):
    """Qwen-VL-style towers: q, k ``[N, H, D]`` or ``[1, N, H, D]`` (Kimi), tables ``[N, D]`` half layout; fp32 math."""
    if q.dim() == 3:
        q, k = _p.apply_pair(q[None], k[None], cos, sin, interleaved=False, layout="bshd")
        return q[0], k[0]
    return _p.apply_pair(q, k, cos, sin, interleaved=False, layout="bshd")


def _apply_vision_pairwise(q, k, cos, sin):
    """Inkling2: q, k ``[N, H, D]``, tables ``[N, D]`` with each angle repeated for its pair (2i, 2i+1); fp32 math."""
    q, k = _p.apply_pair(q[None], k[None], cos, sin, interleaved=True, layout="bshd")
    return q[0], k[0]


def _apply_loftr(q, k, cos, sin, unsqueeze_dim=1):
    """EfficientLoFTR / LightGlue: q, k ``[B, S, 1, hidden]`` or ``[B, H, S, D]``, tables ``[B, S, r]`` pairwise."""
    return _p.apply_pair(q, k, cos, sin, interleaved=True, layout=_p.unsqueeze_layout(unsqueeze_dim))


def _apply_dinov3(q, k, cos, sin, **kwargs):
    """DINOv3 / EoMT: q, k ``[B, H, S, D]``, tables ``[P, D]`` for the last ``P`` tokens; the others untouched."""
    prefix = q.shape[-2] - cos.shape[-2]
    if prefix:
        cos = torch.cat([cos.new_ones(prefix, cos.shape[-1]), cos])
        sin = torch.cat([sin.new_zeros(prefix, sin.shape[-1]), sin])
    return _p.apply_pair(q, k, cos, sin, interleaved=False, layout="bhsd")


def _apply_sam3(q, k, cos, sin):
    """SAM 3's ViT: q, k ``[B, H, S, D]``, tables ``[1, S, D]`` with each angle repeated for its pair; fp32 math."""
    return _p.apply_pair(
        q, k, cos.reshape(cos.shape[-2:]), sin.reshape(sin.shape[-2:]), interleaved=True, layout="bhsd"
    )


def _apply_xy(x, cos, sin, position_ids, unsqueeze_dim=2):
    """Gemma 4's vision attention, q or k ``[B, N, H, D]``: x's half, then y's, each by its half of ``cos/sin``."""
    c = 2 * (x.shape[-1] // (2 * position_ids.shape[-1]))
    parts = [slice(j * c, (j + 1) * c) for j in range(position_ids.shape[-1])]
    tables = [RotaryTables.from_tensors(cos[..., s], sin[..., s], interleaved=False, validate=False) for s in parts]
    return torch.cat(
        [_p.rotate([x[..., s]], t, layout=_p.unsqueeze_layout(unsqueeze_dim))[0] for s, t in zip(parts, tables)], -1
    )


def _apply_llama4_vision(query, key, freqs_ci):
    """Llama 4's vision attention: ``[B, S, H, D]``, complex ``freqs_ci [S, 1, D/2]``, pairs (2i, 2i+1)."""
    freqs = freqs_ci.to(query.device).reshape(query.shape[1], -1)
    tables = _p.complex_tables(freqs)
    q, k = _p.rotate([query, key], tables, layout="bshd", kinds=("q", "k"), names=("query", "key"))
    return q, k


# vision towers with 2-D RoPE: Pixtral's PixtralVisionModel, DINOv3 (and Sapiens2), SAM 3, Inkling2's,
# EfficientLoFTR's, Gemma 4's, and Llama 4 (text,
# vision tower, or both)
_p.SUPPORTED.update(
    {
        "pixtral": _p.Family("transformers.models.pixtral.modeling_pixtral", {"apply_rotary_pos_emb": _apply_pixtral}),
        "dinov3_vit": _p.Family(
            "transformers.models.dinov3_vit.modeling_dinov3_vit", {"apply_rotary_pos_emb": _apply_dinov3}
        ),
        "eomt_dinov3": _p.Family(
            "transformers.models.eomt_dinov3.modeling_eomt_dinov3", {"apply_rotary_pos_emb": _apply_dinov3}
        ),
        "sapiens2": _p.Family(  # DINOv3's apply, the same source
            "transformers.models.sapiens2.modeling_sapiens2", {"apply_rotary_pos_emb": _apply_dinov3}
        ),
        "sam3_vit_model": _p.Family("transformers.models.sam3.modeling_sam3", {"apply_rotary_pos_emb_2d": _apply_sam3}),
        "inkling2_vision": _p.Family(
            "transformers.models.inkling2.modeling_inkling2", {"apply_rotary_pos_emb_vision": _apply_vision_pairwise}
        ),
        "efficientloftr": _p.Family(
            "transformers.models.efficientloftr.modeling_efficientloftr", {"apply_rotary_pos_emb": _apply_loftr}
        ),
        "lightglue": _p.Family(  # Cohere's apply, as EfficientLoFTR's: q, k [B, H, S, D], tables [B, S, D]
            "transformers.models.lightglue.modeling_lightglue", {"apply_rotary_pos_emb": _apply_loftr}
        ),
        "gemma4_vision": _p.Family(
            "transformers.models.gemma4.modeling_gemma4", {"apply_multidimensional_rope": _apply_xy}
        ),
        **{
            model_type: _p.Family(
                "transformers.models.llama4.modeling_llama4",
                {"apply_rotary_emb": _p.apply_llama4_text, "vision_apply_rotary_emb": _apply_llama4_vision},
            )
            for model_type in ("llama4", "llama4_text", "llama4_vision_model")
        },
    }
)

# CPU, one thread, q/k [N, H, D] strided views as the towers give them: transformers' function 25-170 ms,
# rotary's 3-21 ms (fp32 and bf16, N = 1024-4096 patches, D = 72-80; load average 12-14 on 2 cores while
# measured, so ratios only). DINOv3's apply ([1, 6, 1029, 64] and [4, 12, 201, 64]): 1.3-6.4 ms against
# 0.16-0.32 ms; SAM 3's ([25, 16, 576, 64], [1, 16, 5184, 64]): 53-590 ms against 9-82 ms (load 6-7).
# MiniMax-M3-VL's (partial, in q's dtype; [1, N, 16, 80], N = 1024-4096): 13-110 ms against 2-21 ms (load 6-7);
# in bf16 rotary rotates in fp32 and rounds once, so its bf16 output differs from transformers' by rounding.
#: transformers modeling module -> the model_types whose vision tower rotates q and k with its
#: ``apply_rotary_pos_emb_vision`` (the same function in each: fp32, pairs (i, i + D/2)): the tower on its
#: own, and the multimodal model holding it (whose text attention, where _p.SUPPORTED has it, is patched too)
_VISION_TOWERS = {
    "qwen2_vl": ("qwen2_vl", "qwen2_vl_vision"),
    "qwen2_5_vl": ("qwen2_5_vl", "qwen2_5_vl_vision"),
    "qwen3_vl": ("qwen3_vl", "qwen3_vl_vision"),
    "qwen3_vl_moe": ("qwen3_vl_moe", "qwen3_vl_moe_vision"),
    "qwen3_5": ("qwen3_5", "qwen3_5_vision"),
    "qwen3_5_moe": ("qwen3_5_moe", "qwen3_5_moe_vision"),
    "qwen2_5_omni": ("qwen2_5_omni_vision_encoder",),
    "qwen3_omni_moe": ("qwen3_omni_moe_vision_encoder",),
    "qwen4_exp": ("qwen4_exp_vision",),
    "glm4v": ("glm4v", "glm4v_vision"),
    "glm4v_moe": ("glm4v_moe", "glm4v_moe_vision"),
    "glm_ocr": ("glm_ocr", "glm_ocr_vision"),
    "glm5_next": ("glm5_next_vision",),
    "ernie4_5_vl_moe": ("ernie4_5_vl_moe", "ernie4_5_vl_moe_vision"),
    "paddleocr_vl": ("paddleocr_vl", "paddleocr_vl_vision"),
    "kimi_k25": ("kimi_k25", "kimi_k25_vision"),
    "cohere_compass": ("cohere_compass_vision",),
    "exaone4_5": ("exaone4_5_vision",),
    "dots3_note": ("dots3_note_vision_encoder",),
    "lfm3_vl": ("lfm3_vl_vision",),
    "video_llama_3": ("video_llama_3_vision",),
    "muse_glimmer": ("muse_glimmer_vision",),
    "muse_spark": ("muse_spark_vision",),
    "step3p7": ("step3p5_vision",),  # [B, S, H, D]: one image grid per call, a batch shares it
    "minimax_m3_vl": ("minimax_m3_vl_vision",),  # its own form: the first 3·2⌊D/6⌋ channels, in q's dtype
}
for _name, _types in _VISION_TOWERS.items():
    for _model_type in _types:
        _module = f"transformers.models.{_name}.modeling_{_name}"
        _text = _p.SUPPORTED.get(_model_type)
        if _text is not None and _text.module != _module:
            continue  # a namesake in another module: leave that family as it is
        _replacements = dict(_text.replacements) if _text is not None else {}
        _replacements["apply_rotary_pos_emb_vision"] = _apply_vision
        _p.SUPPORTED[_model_type] = _p.Family(_module, _replacements, _text.qk_norm if _text is not None else None)
del _name, _types, _model_type, _module, _text, _replacements
