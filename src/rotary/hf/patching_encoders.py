"""rotary.hf.patch for the sequence encoders (audio, codecs, time series) of
:data:`rotary.hf.encoder_tables.SEQUENCE_ROPE`: the replacements of their ``apply_rotary_pos_emb``, added to
:data:`rotary.hf.patching.SUPPORTED` when ``rotary.hf`` imports this module. They call :func:`rotary.rotate` on
the model's own tables; tests/hf/test_encoders.py checks each patched tiny model against the unpatched one.
"""

from __future__ import annotations

from ..rotation import rotate
from ..tables import RotaryTables
from . import patching as _p


def _rotate(xs, cos, sin, *, interleaved: bool, unsqueeze_dim: int):
    tables = RotaryTables.from_tensors(cos, sin, interleaved=interleaved, validate=False)
    return tuple(rotate(list(xs), tables, layout=_p.unsqueeze_layout(unsqueeze_dim)))


def _apply_half(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Llama's form: pairs (i, i + r/2) of the first ``r = cos.shape[-1]`` channels; ``position_ids`` unused."""
    return _rotate((q, k), cos, sin, interleaved=False, unsqueeze_dim=unsqueeze_dim)


def _apply_pe(q, k, cos, sin, unsqueeze_dim=1):
    """PE audio: pairs (2i, 2i+1), tables in the half layout ``[θ, θ]`` (the first half holds one angle per pair)."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)
    return _rotate((q, k), cos, sin, interleaved=True, unsqueeze_dim=unsqueeze_dim)


def _apply_context(q, k, cos, sin, unsqueeze_dim=1):
    """Muse Glimmer's assistant: queries take the last ``q_len`` rows of the keys' tables; pairs (i, i + D/2)."""
    n = q.shape[-2] if _p.unsqueeze_layout(unsqueeze_dim) == "bhsd" else q.shape[-3]
    rows = (slice(None),) * (cos.dim() - 2) + (slice(cos.shape[-2] - n, None),)
    (q,) = _rotate((q,), cos[rows], sin[rows], interleaved=False, unsqueeze_dim=unsqueeze_dim)
    (k,) = _rotate((k,), cos, sin, interleaved=False, unsqueeze_dim=unsqueeze_dim)
    return q, k


#: transformers module -> (its model types, the replacement of its apply_rotary_pos_emb)
_FAMILIES = {
    "lasr": (("lasr_ctc", "lasr_encoder"), _apply_half),
    "mimi": (("mimi", "mimi_decoder", "mimi_encoder"), _apply_half),
    "pocket_tts_audio_tokenizer": (
        ("pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_decoder", "pocket_tts_audio_tokenizer_encoder"),
        _apply_half,
    ),
    "timesfm2_5": (("timesfm2_5",), _apply_half),
    "voxtral_realtime": (("voxtral_realtime_encoder",), _apply_half),
    "glmasr": (("glmasr_encoder",), _apply_half),
    "nemotron3_5_transcribe": (
        ("nemotron3_5_transcribe_asr_audio", "nemotron3_5_transcribe_audio", "nemotron3_5_transcribe_word_timestamp"),
        _apply_half,
    ),
    "nemotron3_diarization": (("nemotron3_diarization", "nemotron3_diarization_audio"), _apply_half),
    "pe_audio": (("pe_audio_encoder",), _apply_pe),
    "pe_video": (("pe_video_encoder",), _apply_pe),  # the same apply as PE audio's
    "pe_audio_video": (("pe_audio_video_encoder",), _apply_pe),
    "deepseek_ocr2": (("deepseek_ocr2_encoder", "deepseek_ocr2_vision"), _apply_half),
    "muse_glimmer_assistant": (("muse_glimmer_assistant",), _apply_context),
    # the DiT's head 0, de-interleaved by its attention before this call (encoder_tables.ROTATED_HEADS)
    "qwen2_5_omni": (("qwen2_5_omni_dit", "qwen2_5_omni_token2wav"), _apply_half),
}
for _module, (_types, _replacement) in _FAMILIES.items():
    for _model_type in _types:
        # voxtral_realtime's text model is patched already: its encoder shares the module and the function
        _p.SUPPORTED.setdefault(
            _model_type,
            _p.Family(f"transformers.models.{_module}.modeling_{_module}", {"apply_rotary_pos_emb": _replacement}),
        )
del _module, _types, _replacement, _model_type
