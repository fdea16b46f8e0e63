"""The tables of the sequence encoders (audio frames, codec steps, byte patches, time series): which ones
:meth:`rotary.RoPE.from_hf_config` builds and how they pair, and which encoders apply no RoPE in their forward
pass, with what they use instead. Each entry was established by running the type's tiny model with its RoPE
functions recorded, and is checked that way by tests/hf/test_encoders.py.
"""

from __future__ import annotations

__all__ = [
    "COVERAGE",
    "ENCODER_PART",
    "LEARNED_FREQUENCIES",
    "NOT_BUILT",
    "NO_ROPE",
    "REFUSED",
    "ROTATED_HEADS",
    "SEQUENCE_ROPE",
]

#: model_type -> how its attention pairs the rotated channels (``"half"``: (i, i + r/2), ``"interleaved"``:
#: (2i, 2i + 1)). Each applies a 1-D RoPE over its sequence (audio frames, codec steps, patches; DeepSeek-OCR2's
#: vision encoder, a Qwen2-style decoder, over its image patches then its learned queries), read from
#: its config by :meth:`rotary.RoPE.from_hf_config` exactly as for a text model: ``rope_parameters``, the head
#: width (``head_dim`` or ``hidden_size / num_attention_heads``), ``partial_rotary_factor``.
SEQUENCE_ROPE: dict[str, str] = {
    **dict.fromkeys(
        (
            "deepseek_ocr2_encoder deepseek_ocr2_vision dots3_note_audio_encoder glmasr_encoder lasr_ctc "
            "muse_glimmer_assistant nemotron3_5_transcribe_audio "
            "nemotron3_5_transcribe_word_timestamp nemotron3_diarization timesfm2_5 lasr_encoder mimi mimi_decoder "
            "mimi_encoder nemotron3_5_transcribe_asr_audio "
            "nemotron3_diarization_audio pocket_tts_audio_tokenizer pocket_tts_audio_tokenizer_decoder "
            "pocket_tts_audio_tokenizer_encoder voxtral_realtime_encoder"
        ).split(),
        "half",
    ),
    **dict.fromkeys(
        "blt_global_transformer pe_audio_encoder pe_audio_video_encoder pe_video_encoder".split(), "interleaved"
    ),
    # Qwen2.5-Omni's DiT (and token2wav, through its dit_config): the first head only (ROTATED_HEADS)
    **dict.fromkeys("qwen2_5_omni_dit qwen2_5_omni_token2wav".split(), "interleaved"),
}

#: model_type -> how many of its attention's heads, the first ones, the RoPE rotates; the others pass through
#: unrotated. Qwen2.5-Omni's DiT rotates head 0 only (``query[:, :1]``, "due to training process", says its code):
#: pairs (2i, 2i+1) of that head's channels, which its code de-interleaves (channels 0, 2, 4, …, then 1, 3, 5, …)
#: before Llama's half-split apply and leaves in that order, the same permutation for q and k, so every score is
#: that of the interleaved RoPE. Rotate ``q[:, :1]`` and ``k[:, :1]`` ([B, H, S, D]) with RoPE.from_hf_config's.
ROTATED_HEADS: dict[str, int] = {"qwen2_5_omni_dit": 1, "qwen2_5_omni_token2wav": 1}

#: model_type of a composite (an encoder and a head, a transducer) -> the key of the sub-config that holds its
#: encoder's RoPE: RoPE.from_hf_config(config) reads it there, as the model builds its encoder from it
ENCODER_PART: dict[str, str] = {
    "lasr_ctc": "encoder_config",
    "deepseek_ocr2_vision": "encoder_config",  # its SAM tower (sam_config) applies none
    "nemotron3_diarization": "audio_config",
    # its speech recogniser's encoder; its speaker-diarization model is a nemotron3_diarization of its own
    # (RoPE.from_hf_config(config.diarization_config))
    "nemotron3_5_transcribe_audio": "asr_config",
    "qwen2_5_omni_token2wav": "dit_config",  # its BigVGAN (bigvgan_config) applies none
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

_TRACKER_PARTS = (
    "no RoPE: its forward pass applies none (SAM 2 video run through its inference session, a point on the first "
    "frame and every frame tracked, with apply_rotary_pos_emb_2d recorded: the prompt encoder and the mask decoder "
    "ran on every frame and every call came from the memory attention); its two-way transformer adds the point "
    "embeddings (random Fourier features of the coordinates, Sam2VideoPositionalEmbedding) to q and k. SAM 3's "
    "tracker's and EdgeTAM's are the same code (the tests compare it); the RoPE of its modeling file is the memory "
    "attention's"
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
    "sam3_geometry_encoder": (
        "no RoPE: its forward pass applies none (run and recorded, with torchvision's roi_align, which its box pooling "
        "calls and which cannot load here, replaced by an average pool of each box's cells: no part of any RoPE); its "
        "self-attention over the box prompts adds sine embeddings of the box centres (Sam3SinePositionEmbedding), its "
        "cross-attention the image's sine position embeddings to the keys; the RoPE of its modeling file is the ViT "
        "backbone's (sam3_vit_model, built by rotary.hf.vision_rope)"
    ),
    **dict.fromkeys("deepseek_ocr2_sam_vision_model unlimited_ocr_sam_vision_model".split(), _SAM_VIT),
    **dict.fromkeys(
        (
            "cosmos3_edge_vision granite_docling_vision molmo2_vision phi4_multimodal_vision "
            "unlimited_ocr_vision_encoder"
        ).split(),
        _LEARNED,
    ),
    "unlimited_ocr_vision": (
        "no RoPE: its forward pass applies none (run and recorded); its SAM tower (decomposed relative position "
        "biases over absolute position embeddings) feeds its CLIP-style encoder (learned absolute position "
        "embeddings, interpolated), and neither applies one; the RoPE of its modeling file belongs to the text model"
    ),
    "gemma4_unified_audio": (
        "no RoPE: its forward pass applies none (run and recorded); it has no model class of its own: transformers "
        "builds Gemma4UnifiedMultimodalEmbedder from it, an RMS norm and a linear projection of audio soft tokens "
        "into the text model, with no attention; the RoPE of its modeling file belongs to the text and vision parts"
    ),
    **dict.fromkeys(
        (
            "edgetam_video_mask_decoder edgetam_video_prompt_encoder sam2_video_mask_decoder sam2_video_prompt_encoder "
            "sam3_tracker_video_mask_decoder sam3_tracker_video_prompt_encoder"
        ).split(),
        _TRACKER_PARTS,
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

_LEARNED_CLASS_ANGLES = (
    "vision encoder: not built from its config: its patches are rotated as Qwen-VL's tower (2-D axial RoPE over (h, "
    "w) row by row, "
    "pairs (i, i + D/2), h's frequencies then w's, base^(-4k/D); run and recorded, rotary's AxialRoPE gives the "
    "same tables), but its class token, first, is rotated by angles that are a learned parameter "
    "(MLCDVisionModel.class_pos_emb, one angle per pair, D/2 of them), checkpoint weights rather than config keys"
)

_UNEQUAL_PAIR_ANGLES = (
    "not a RoPE of q and k: VJEPA2RopeAttention's rotate_queries_or_keys, on each axis's 2·⌊D/6⌋ channels (depth, "
    "height, width), pairs channels (2i, 2i+1) (rotate_pairwise) but lays its angles out as (f_0 … f_{n-1}, f_0 … "
    "f_{n-1}) (repeat, not repeat_interleave), so the two channels of a pair turn by different angles: the matrix "
    "[[cos a, -sin a], [sin b, cos b]] is no rotation (it changes the norm of q and k: by up to 0.16 in the tests' "
    "tiny model), and its base 10000 is fixed in the code, not a config key"
)

_HEAD_INDEX = (
    "audio codec / vocoder / speech tokenizer: not a RoPE over its frames (its decoder run and recorded): its "
    "rotary embedding is given position_ids = arange(num_attention_heads), and its apply (unsqueeze_dim=2) turns "
    "every frame of head h of q and k by the angles of position h (pairs (i, i + D/2), rope_theta): the same "
    "rotation for a head's queries and keys at every frame, which cancels in each attention score (the tests: the "
    "logits equal those of the unrotated q and k), so its attention carries no position from it. rotary's "
    "RoPE(head_dim, base=rope_theta) at positions 0 .. H-1 along the head axis reproduces the rotation; its "
    "semantic encoder is a wav2vec2-BERT model (semantic_model_config, a type of its own) and its acoustic "
    "encoder is convolutional"
)

#: model_type -> why no RoPE rotary builds reproduces what its code does (run and recorded)
REFUSED: dict[str, str] = {
    "vjepa2": _UNEQUAL_PAIR_ANGLES,
    **dict.fromkeys(("wav2vec2-bert", "wav2vec2-conformer"), _HIDDEN_ROTATION),
    **dict.fromkeys(("mlcd", "mlcd_vision_model"), _LEARNED_CLASS_ANGLES),
    **dict.fromkeys(("neucodec", "xcodec2"), _HEAD_INDEX),
}

_AUDIO = "audio encoder: "
_VISION = "vision encoder: "
_OTHER = "other encoder (byte patches, feature matching, time series, an assistant model): "
_NO_TORCHVISION = (
    "timm needs torchvision, whose wheel on PyPI for the pinned torch 2.13.0 (torchvision 0.28.0) is a CUDA build: "
    "its operators do not load with the CPU torch rotary is tested with (its _C.so needs libtorch_cuda.so), and the "
    "CPU build is published only on PyTorch's own package index"
)
#: model_type -> exactly why it is not built (category first, as ENCODER_STATUS's): the types whose RoPE rotary
#: has not reproduced yet, each with what its code does as far as it is known
NOT_BUILT: dict[str, str] = {
    "gemma3n_vision": _VISION
    + (
        "cannot be run here: a MobileNet-V5 built through timm (TimmWrapper), and "
        + _NO_TORCHVISION
        + "; no model class of its own"
    ),
}

#: model_type -> how rotary builds its RoPE, whose frequencies are checkpoint weights rather than config keys:
#: the form of RoPE-Mixed (rotary.RoPEMixed, the paper "Rotary Position Embedding for Vision Transformer"), a
#: frequency vector over the axes per pair, loaded from the model's parameter (run and recorded; checked by
#: tests/hf/test_encoders.py)
LEARNED_FREQUENCIES: dict[str, str] = {
    "lightglue": (
        "its self-attention turns pair j (channels 2j, 2j+1) of every head of q and k by w_j · (x, y), the keypoint's "
        "normalized coordinates and w = positional_encoder.projector.weight [head_dim/2, 2], a learned linear "
        "projection; rotary.RoPEMixed(head_dim, num_attention_heads, interleaved=True, rotate=False) with inv_freq "
        "set to w.T for every head ([H, 2, head_dim/2]) and the keypoints as its coordinates gives the same q and k"
    ),
}

#: the coverage table's entries (rotary.hf.coverage): the sequence encoders RoPE.from_hf_config builds, and
#: the encoders whose learned frequencies rotary.RoPEMixed takes
COVERAGE = [("RoPE.from_hf_config", SEQUENCE_ROPE), ("rotary.RoPEMixed (learned frequencies)", LEARNED_FREQUENCIES)]
