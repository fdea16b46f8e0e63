"""The tables of the sequence encoders (audio frames, codec steps, patches of bytes, time series): which ones
:meth:`rotary.RoPE.from_hf_config` builds and how they pair their channels, and which of the encoders whose
modeling files hold a rotary embedding apply none in their forward pass, with what they use instead.

Plain data, imported by :mod:`rotary.hf.architectures` (the pairing reader) and :mod:`rotary.hf.vision_tables`
(the encoders' status). Every entry was established by running the type's tiny model with its RoPE functions
recorded, and is checked that way by tests/hf/test_encoders.py (harness: tests/hf/encoder_models.py).
"""

from __future__ import annotations

__all__ = ["COVERAGE", "ENCODER_PART", "NO_ROPE", "REFUSED", "SEQUENCE_ROPE"]

#: model_type -> how its attention pairs the rotated channels (``"half"``: (i, i + r/2), ``"interleaved"``:
#: (2i, 2i + 1)). Each applies a 1-D RoPE over its sequence (audio frames, codec steps, patches), read from
#: its config by :meth:`rotary.RoPE.from_hf_config` exactly as for a text model: ``rope_parameters``, the head
#: width (``head_dim`` or ``hidden_size / num_attention_heads``), ``partial_rotary_factor``.
SEQUENCE_ROPE: dict[str, str] = {
    **dict.fromkeys(
        (
            "dots3_note_audio_encoder glmasr_encoder lasr_ctc muse_glimmer_assistant nemotron3_5_transcribe_audio "
            "nemotron3_5_transcribe_word_timestamp nemotron3_diarization timesfm2_5 lasr_encoder mimi mimi_decoder mimi_encoder nemotron3_5_transcribe_asr_audio "
            "nemotron3_diarization_audio pocket_tts_audio_tokenizer pocket_tts_audio_tokenizer_decoder "
            "pocket_tts_audio_tokenizer_encoder voxtral_realtime_encoder"
        ).split(),
        "half",
    ),
    **dict.fromkeys("blt_global_transformer pe_audio_encoder".split(), "interleaved"),
}

#: model_type of a composite (an encoder and a head, a transducer) -> the key of the sub-config that holds its
#: encoder's RoPE: RoPE.from_hf_config(config) reads it there, as the model builds its encoder from it
ENCODER_PART: dict[str, str] = {
    "lasr_ctc": "encoder_config",
    "nemotron3_diarization": "audio_config",
    # its speech recogniser's encoder; its speaker-diarization model is a nemotron3_diarization of its own
    # (RoPE.from_hf_config(config.diarization_config))
    "nemotron3_5_transcribe_audio": "asr_config",
}

_REL_XL = (
    "no RoPE: its forward pass applies none (run and recorded); its attention adds Transformer-XL-style relative "
    "sinusoidal position scores (a projected relative_k and learned biases bias_u, bias_v), as in the paper "
    "'Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context'; the apply_rotary_pos_emb in its "
    "modeling file is called by no layer"
)
_UNPOSITIONED = (
    "no RoPE: its forward pass applies none (run and recorded); its encoder computes no position embeddings for "
    "its sliding-window attention (the rotary embedding of its modeling file is the decoder's)"
)

_SINUSOIDS = (
    "no RoPE: its forward pass applies none (run and recorded); it adds absolute sinusoidal position embeddings "
    "to its input frames (SinusoidsPositionEmbedding, as Whisper's encoder); the RoPE of its modeling file belongs "
    "to the thinker, talker and vision parts"
)
_REL_LOCAL = (
    "no RoPE: its forward pass applies none (run and recorded); its chunked local attention adds relative "
    "sinusoidal position logits (Gemma3nAudioRelativePositionEmbedding, Conformer-style); the RoPE of its modeling "
    "file belongs to the text and vision parts"
)

_REL_CHUNKED = (
    "no RoPE: its forward pass applies none (run and recorded); its chunked local attention adds relative "
    "sinusoidal position logits (Gemma4AudioRelPositionalEncoding, Conformer-style); the RoPE of its modeling "
    "file belongs to the text and vision parts"
)
_BUCKETS = (
    "no RoPE: its forward pass applies none (run and recorded); its Conformer attention adds a learned relative "
    "position bias per bucket of distances (Phi4MultimodalAudioRelativeAttentionBias, T5-style); the RoPE of its "
    "modeling file belongs to the text model"
)
_CONV_ONLY = (
    "no RoPE: its forward pass applies none (run and recorded); it has no attention at all, a causal "
    "convolutional pyramid over the waveform; the RoPE of its modeling file belongs to the text and vision parts"
)

_SAM3_PART = (
    "no RoPE: its forward pass applies none (run and recorded); its attention takes the sine position embeddings "
    "the model hands it (Sam3SinePositionEmbedding) or none; the RoPE of its modeling file is the ViT backbone's "
    "(sam3_vit_model, built by rotary.hf.vision_rope)"
)

_SAM_VIT = (
    "no RoPE: its forward pass applies none (run and recorded); a SAM ViT, whose attention adds decomposed "
    "relative position biases (learned rel_pos_h, rel_pos_w tables) to absolute position embeddings; the RoPE of "
    "its modeling file belongs to the text model and the vision encoder"
)
_LEARNED = (
    "no RoPE: its forward pass applies none (run and recorded); a SigLIP- or CLIP-style ViT with learned absolute "
    "position embeddings (nn.Embedding over the patch grid); the RoPE of its modeling file belongs to the text model"
)

#: model_type -> what it uses instead of RoPE (its forward pass, run and recorded, applies none)
NO_ROPE: dict[str, str] = {
    **dict.fromkeys(
        (
            "nemotron_asr_streaming nemotron_asr_streaming_encoder parakeet_ctc parakeet_encoder parakeet_rnnt "
            "parakeet_tdt"
        ).split(),
        _REL_XL,
    ),
    "moonshine_streaming_encoder": _UNPOSITIONED,
    **dict.fromkeys("qwen2_5_omni_audio_encoder qwen3_omni_moe_audio_encoder".split(), _SINUSOIDS),
    "gemma3n_audio": _REL_LOCAL,
    "gemma4_audio": _REL_CHUNKED,
    "phi4_multimodal_audio": _BUCKETS,
    "muse_spark_audio": _CONV_ONLY,
    **dict.fromkeys("sam3_detr_decoder sam3_detr_encoder sam3_mask_decoder".split(), _SAM3_PART),
    **dict.fromkeys("deepseek_ocr2_sam_vision_model unlimited_ocr_sam_vision_model".split(), _SAM_VIT),
    **dict.fromkeys(
        (
            "cosmos3_edge_vision granite_docling_vision molmo2_vision phi4_multimodal_vision "
            "unlimited_ocr_vision_encoder"
        ).split(),
        _LEARNED,
    ),
    "qwen2_5_omni_bigvgan": (
        "no RoPE: its forward pass applies none (run and recorded); a BigVGAN vocoder, convolutions and "
        "anti-aliased activations over the mel frames with no attention; the RoPE of its modeling file belongs to the "
        "thinker, talker and DiT parts"
    ),
}

_HIDDEN_ROTATION = (
    "not a RoPE of q and k: with position_embeddings_type='rotary' it rotates the hidden states (pairs (i, i + D/2) "
    "of each head's slice, base rotary_embedding_base) before the q and k projections, so its attention logits "
    "depend on absolute positions (the tests shift every position by 3 and the logits change), which no rotation "
    "of q and k reproduces; its default, 'relative_key' / 'relative', is Transformer-XL-style relative position "
    "scores, no RoPE"
)

#: model_type -> why no RoPE rotary builds reproduces what its code does (run and recorded)
REFUSED: dict[str, str] = dict.fromkeys(("wav2vec2-bert", "wav2vec2-conformer"), _HIDDEN_ROTATION)

#: the coverage table's entry (rotary.hf.coverage): the sequence encoders RoPE.from_hf_config builds
COVERAGE = [("RoPE.from_hf_config", SEQUENCE_ROPE)]
