"""rotary.hf.architectures.PAIRING against transformers' own modeling code, for every model_type of the pinned
transformers whose modeling code applies RoPE.

For each architecture the table lists, a tiny model (random weights, hidden size 64) is built from
its config class and run once on 11 tokens. Every call its attention makes to the module's RoPE
function (``apply_rotary_pos_emb``, ``apply_rotary_emb``, ``apply_rotary_pos_emb_interleave``, ...) is
recorded with its inputs and outputs. Two things are then read off the model's own code:

- the pairing: the Jacobian of the function's output with respect to one token of its input q
  shows which input channels are rotated together (2i and 2i+1, or i and i + r/2), whatever
  permutation the function applies on the way (DeepSeek de-interleaves before rotating);
- the rotation itself: the rotated vectors must equal those rotary's ``RoPE.from_hf_config`` of the
  same config gives for the same input at the positions the model ran at (its position_ids), channel for
  channel, up to one permutation of the channels applied to every vector alike (DeepSeek's apply
  function returns its rotated channels de-interleaved). A wrong pairing, frequency, rotated width,
  attention scaling or a constant shift of every position all fail it
  (``test_a_constant_position_shift_fails_the_rotation_check``).

Architectures the table refuses (rotary.hf.config.UNSUPPORTED) are checked to be refused, and every
RoPE-applying model_type must be in one of the tables (or be a multimodal wrapper whose text part is).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import sys
import warnings

import pytest
import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES, model_type_to_module_name

import rotary
from helpers import build_tiny
from rotary.hf.config import PAIRING, UNSUPPORTED, read_hf_config
from rotary.hf.coverage import rope_model_types
from rotary.hf.encoder_tables import SEQUENCE_ROPE
from rotary.hf.layers import read_hf_layers
from rotary.hf.own_keys import ROPE_SWITCHES
from rotary.hf.vision import VISION_ROPE

transformers.logging.set_verbosity_error()

S = 11  # tokens: a length no head count or width of the tiny models equals, so its axis is unambiguous

#: small sizes for any config class (only the fields a class has are set)
TINY = dict(
    hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    head_dim=16, vocab_size=128, max_position_embeddings=256, moe_intermediate_size=32, num_experts=4,
    num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
    q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
    n_embd=64, n_head=4, n_layer=2, n_positions=256, rotary_dim=8, pad_token_id=0,
    vocab_size_per_layer_input=128, hidden_size_per_layer_input=16, expert_ffn_hidden_size=32,
)  # fmt: skip

#: one small transformer of an encoder-decoder model (T5Gemma's sides, Dia's decoder)
_TINY_SIDE = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 128,
}

_BLT_SIDE = {"hidden_size": 64, "hidden_size_global": 128, "num_hidden_layers": 1, "intermediate_size": 64}

_SEAMLESS_SIDES = ("encoder", "decoder", "speech_encoder", "t2u_encoder", "t2u_decoder")

#: per model_type: the defaults of its config class that TINY would break
OVERRIDES: dict[str, dict] = {
    "mimo_v2_flash": {"num_key_value_heads": 2},
    "recurrent_gemma": {"num_hidden_layers": 3},  # blocks recurrent, recurrent, attention
    "hrm_text": {"H_cycles": 1, "L_cycles": 1, "L_bp_cycles": [1]},
    "longcat_flash": {  # its tables are head_dim wide and rotate the qk_rope_head_dim slice; 4 zero experts, not 256
        "head_dim": 8,
        "num_layers": 1,
        "ffn_hidden_size": 64,
        "zero_expert_num": 4,
        "moe_topk": 2,
    },
    "glm5_next_text": {"qk_rope_head_dim": 0},  # its config refuses any other width (NoPE attention)
    "dbrx": {
        "d_model": 64,
        "n_heads": 4,
        "n_layers": 2,
        "max_seq_len": 256,
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
    },
    "step3p5": {"sliding_window": 4},
    "chameleon": {  # its image tokenizer (no attention) at its smallest: 29 M parameters to draw otherwise
        "vocabulary_map": {"<image>": 3},
        "vq_config": {
            "base_channels": 32,
            "embed_dim": 32,
            "num_embeddings": 32,
            "channel_multiplier": [1, 1],
            "num_res_blocks": 1,
            "latent_channels": 32,
            "resolution": 32,
        },
    },
    "seamless_m4t": {  # 24 layers of 8192-wide FFNs on each of four sides: 4.6 s to build for one RoPE-free forward
        **{f"{side}_layers": 1 for side in _SEAMLESS_SIDES},
        **{f"{side}_attention_heads": 4 for side in _SEAMLESS_SIDES},
        **{f"{side}_ffn_dim": 64 for side in _SEAMLESS_SIDES if side != "speech_encoder"},
        "speech_encoder_intermediate_size": 64,  # the speech encoder's FFN width has a name of its own
    },
    "idefics": {
        "vision_config": {
            "embed_dim": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "image_size": 16,
            "patch_size": 8,
        }
    },
    "moshi_depth": {
        "num_codebooks": 12,
        "input_size": 64,
    },  # its positions are codebook indices: one per token of the probe
    "clvp_encoder": {"hidden_size": 256, "projection_dim": 64, "intermediate_size": 64},  # 32 of 64 channels rotated
    "kyutai_speech_to_text": {
        "num_codebooks": 2,
        "codebook_vocab_size": 128,
        "audio_pad_token_id": 384,
        "audio_bos_token_id": 127,
        "bos_token_id": 1,
        "ffn_dim": 64,
    },
    # its decoder reads num_key_value_heads, which its config class does not define (a config.json states it)
    "moonshine_streaming": {
        "num_key_value_heads": 4,
        "encoder_config": {
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
        },
    },
    "dia": {
        "encoder_config": {
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 16,
        },
        "decoder_config": dict(
            _TINY_SIDE,
            cross_num_attention_heads=4,
            cross_num_key_value_heads=4,
            cross_head_dim=16,
            cross_hidden_size=64,
        ),
    },
    # hybrids: one recurrent layer and one attention layer, so that the attention runs
    # (Bamba's and GraniteMoeHybrid's Mamba-2 layers with 16-token chunks and states, not 256)
    "bamba": {"attn_layer_indices": [1], "mamba_chunk_size": 16, "mamba_d_state": 16},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "nemotron_h": {"layers_block_type": ["linear_attention", "full_attention"]},
    "granitemoehybrid": {
        "mamba_chunk_size": 16,
        "mamba_d_state": 16,
        "layer_types": ["linear_attention", "full_attention"],
        "num_hidden_layers": 2,
        "position_embedding_type": "rope",
    },
    "esm": {"position_embedding_type": "rotary"},
    "deepseek_ocr2_text": {"mlp_layer_types": ["dense", "sparse"]},
    "cohere_compass_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        },
    },
    "diffusion_gemma_text": {"top_k_experts": 2},
    "pocket_tts": {"flow_head_config": {"condition_dim": 64}},
    "gradium_phonon_tts": {"flow_head_config": {"condition_dim": 64}},
    "qwen3_omni_moe_talker_text": {
        "shared_expert_intermediate_size": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]},
    },
    "t5gemma2_decoder": {"dropout_rate": 0.0},
    "t5gemma2_text": {"dropout_rate": 0.0},
    "zaya": {"num_experts_per_tok": 1},
    "zamba2": {
        "layers_block_type": ["linear_attention", "hybrid"],
        "mamba_headdim": 16,
        "n_mamba_heads": 8,
        "use_mem_rope": True,
    },
    "t5gemma2": {
        "encoder": {
            "text_config": dict(_TINY_SIDE, dropout_rate=0.0),
            "vision_config": {
                "hidden_size": 64,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "image_size": 16,
                "patch_size": 8,
            },
        },
        "decoder": dict(_TINY_SIDE, dropout_rate=0.0),
    },
    "t5gemma": {"encoder": _TINY_SIDE, "decoder": _TINY_SIDE},
    # the byte-patching model: a head width of its own per component (local encoder 16, local decoder 8, global
    # transformer 32) and RoPE settings of its own per local model, so that each call tells whose it is
    "blt": {
        "vocab_size": 260,
        "patch_in_forward": False,
        "patching_mode": "space",
        "encoder_hash_byte_group_vocab": 64,
        "encoder_config": {
            **_BLT_SIDE,
            "num_attention_heads": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
        },
        "decoder_config": {
            **_BLT_SIDE,
            "num_attention_heads": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 2000.0},
        },
        "global_config": {
            "hidden_size": 128,
            "num_attention_heads": 4,
            "num_hidden_layers": 1,
            "intermediate_size": 64,
        },
        "patcher_config": {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 1,
            "intermediate_size": 64,
        },
    },
    # multimodal models: small encoders, so that the text model's probe is quick
    "csm": {
        # its audio codec (Mimi, not run by the text forward) at its smallest: 80 M parameters to draw otherwise
        "codec_config": {
            "hidden_size": 32,
            "num_filters": 4,
            "upsample_groups": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "codebook_dim": 16,
            "vector_quantization_hidden_dimension": 16,
            "codebook_size": 64,
        },
        "num_codebooks": 2,
        "text_vocab_size": 128,
        "depth_decoder_config": {
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "backbone_hidden_size": 64,
            "num_codebooks": 2,
        },
    },
    "evolla": {
        "protein_encoder_config": {
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "intermediate_size": 64,
        }
    },
    "phi4_multimodal": {
        "vision_config": {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4},
        "audio_config": {"hidden_size": 64, "intermediate_size": 64, "num_blocks": 1, "num_attention_heads": 4},
    },
    "gemma3n_text": {"num_kv_shared_layers": 0, "layer_types": ["sliding_attention", "full_attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "qwen4_exp_text": {
        "layer_types": ["linear_attention", "indexed_attention"],
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]},
    },
    # one sliding-window layer (the "main" RoPE) and one compressed layer (the YaRN "compress" RoPE), 8 of 16
    # channels rotated
    "deepseek_v4": {
        "layer_types": ["sliding_attention", "heavily_compressed_attention"],
        "partial_rotary_factor": 0.5,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 4},
    },
    # multimodal RoPE: sections that fit head_dim 16 (8 frequency slots)
    "qwen2_vl_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
    "qwen2_5_vl_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
    "qwen3_vl_text": {
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        }
    },
    # the other multimodal-RoPE text models (rotary.hf.MROPE_MODELS; per-axis positions: tests/variants/
    # test_mrope_families.py): sections that fit head_dim 16, the rotated width of their checkpoints
    **{
        t: {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
        for t in "paddleocr_vl_text qwen2_5_omni_text".split()
    },
    **{
        t: {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [1, 2, 1],
                "partial_rotary_factor": 0.5,
            }
        }
        for t in "glm4v_moe_text glm4v_text glm_image_text glm_ocr_text".split()
    },
    **{
        t: {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}}
        for t in "cosmos3_edge_text qwen3_omni_moe_text qwen3_vl_moe_text".split()
    },
    **{
        t: {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 1, 1],
                "partial_rotary_factor": 0.5,
            }
        }
        for t in "qwen3_5_moe_text qwen3_5_text".split()
    },
    "ernie4_5_vl_moe_text": {
        "moe_intermediate_size": [32, 32],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]},
    },
    "qwen2_5_omni_talker": {
        "embedding_size": 64,  # the thinker's hidden size, which the talker's input projection reads
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    },
    "hunyuan_vl_text": {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2, 2]}
    },
}
#: model types run at positions 0 .. S-1: CLVP's apply function indexes tables of S rows by position, and CSM's
#: depth decoder numbers its tokens itself (it warns that position_ids given to it are ignored)
POSITIONS_FROM_0 = {"clvp_encoder", "csm_depth_decoder_model"}
#: model types whose decoder takes one token per audio channel (Dia: 9 channels by default)
AUDIO_CHANNELS = {"dia": 9, "dia_decoder": 9, "kyutai_speech_to_text": 3}  # Kyutai: text and 2 codebooks
#: model types whose text model is run on embeddings (inputs_embeds), not token ids
EMBEDDINGS_IN = {"qwen3_omni_moe_talker_text", "qwen3_omni_moe_talker_code_predictor"}
#: model types that only run inside another model: (the model that runs them, its sub-config of them). BLT's local
#: encoder and decoder run inside the byte-patching model; its calls at their head width and head count are theirs
RUN_INSIDE = {"blt_local_encoder": ("blt", "encoder_config"), "blt_local_decoder": ("blt", "decoder_config")}
#: per model_type: the text model class to build when the base model is not the one to build
MODEL_CLASSES: dict[str, str] = {}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one intra-op thread is ~40x faster than a pool contending with the other test worker."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(model_type: str, *, every_layer_type: bool = False):
    cls = CONFIG_MAPPING[model_type]
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in TINY.items() if k in fields}
    if "qk_rope_head_dim" in fields:  # MLA: the rope slice is its own width
        kwargs.pop("head_dim", None)
    if "layer_types" in fields:
        kwargs["layer_types"] = None
        if every_layer_type:  # hybrids whose first layers are recurrent: one layer of each type
            kinds = sorted(set(cls().layer_types or ()))
            kwargs.update(layer_types=kinds, num_hidden_layers=len(kinds))
    kwargs.update(OVERRIDES.get(model_type, {}))
    config = cls(**kwargs)
    config._attn_implementation = "eager"
    return config


def _text_model_class(model_type: str, config):
    """The model class of ``model_type`` that takes ``input_ids`` (its base model, else any class of the module)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_CLASSES.get(model_type) or MODEL_MAPPING_NAMES.get(model_type)
    candidates = [getattr(transformers, name)] if name and hasattr(transformers, name) else []
    module = importlib.import_module(
        f"transformers.models.{model_type_to_module_name(model_type)}.modeling_{model_type_to_module_name(model_type)}"
    )
    candidates += [
        c
        for c in vars(module).values()
        if isinstance(c, type)
        and issubclass(c, transformers.PreTrainedModel)
        and c.__dict__.get("config_class") is type(config)
    ]
    for cls in candidates:
        if "input_ids" in inspect.signature(cls.forward).parameters:
            return cls
    return None


@dataclasses.dataclass
class Call:
    fn: object
    args: tuple
    kwargs: dict
    result: object
    caller: str
    start: int = 0  # the position of the first token: the position_ids the model was given start there


def _rope_functions(module) -> list[tuple[object, str]]:
    """(owner, name) of the module's RoPE-applying functions: module-level ones and static methods."""
    pattern = re.compile(r"^apply_.*(rot|rope|pos)")
    found = [
        (module, n) for n, v in vars(module).items() if pattern.match(n) and callable(v) and not isinstance(v, type)
    ]
    for cls in vars(module).values():
        if isinstance(cls, type) and cls.__module__ == module.__name__:
            found += [(cls, n) for n, v in vars(cls).items() if pattern.match(n) and isinstance(v, staticmethod)]
    return found


def model_inputs(model_type: str, config, model, ids: torch.Tensor) -> dict:
    """The keyword arguments that run ``model`` (of ``model_type``) on the tokens ``ids [1, S]``."""
    accepted = inspect.signature(model.forward).parameters
    start = 0 if model_type in POSITIONS_FROM_0 else 3
    inputs = {"input_ids": ids, "position_ids": torch.arange(start, start + S)[None], "use_cache": False}
    if "decoder_input_ids" in accepted:  # an encoder-decoder: the same tokens at the same positions on both sides
        inputs["decoder_input_ids"] = ids
        if "decoder_position_ids" in accepted:
            inputs["decoder_position_ids"] = inputs["position_ids"]
    if model_type in EMBEDDINGS_IN:  # a model that takes embeddings (it has no token embedding of its own)
        del inputs["input_ids"]
        inputs["inputs_embeds"] = torch.randn(1, S, config.hidden_size, generator=torch.Generator())
    if model_type in AUDIO_CHANNELS:  # Dia's decoder reads one token per audio channel: [B, S, channels]
        key = "decoder_input_ids" if "decoder_input_ids" in inputs else "input_ids"
        inputs[key] = ids[..., None].repeat(1, 1, AUDIO_CHANNELS[model_type])
    if model_type == "idefics":  # cross-attends to images: 4 image embeddings every token may see
        width = config.vision_config.embed_dim
        inputs["image_encoder_embeddings"] = torch.randn(1, 1, 4, width, generator=torch.Generator())
        inputs["image_attention_mask"] = torch.ones(1, S, 1, dtype=torch.long)
    if model_type == "voxtral_realtime_text":  # its layers are conditioned on the audio's time embedding
        inputs["t_cond"] = torch.randn(1, config.hidden_size, generator=torch.Generator())
    if "last_hidden_state" in accepted:  # Moshi's depth decoder: the main model's state it conditions on
        inputs["last_hidden_state"] = torch.randn(1, S, config.input_size, generator=torch.Generator())
    if "encoder_hidden_states" in accepted:  # a decoder alone: some encoder output to attend to
        width = getattr(config, "cross_hidden_size", None) or config.hidden_size
        inputs["encoder_hidden_states"] = torch.randn(1, 5, width, generator=torch.Generator())
    kwargs_ok = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    inputs = {k: v for k, v in inputs.items() if k in accepted or (kwargs_ok and k != "position_ids")}
    if "position_ids" not in inputs:  # both sides at the model's own positions, 0 .. S-1 (Dia's encoder takes none)
        inputs.pop("decoder_position_ids", None)
    return inputs


def _snapshot(value):
    """``value`` with every tensor in it (in tuples, lists and dicts) copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    return value


def record_rope_calls(model_type: str, config) -> list[Call]:
    """Run a tiny model of ``config`` once and record the calls its attention makes to the RoPE functions."""
    name = model_type_to_module_name(model_type)
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    calls: list[Call] = []
    depth = [0]
    originals = {}
    for owner, attr in _rope_functions(module):
        raw = vars(owner)[attr]
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw
        originals[(owner, attr)] = raw

        def wrapper(*args, __fn=fn, **kwargs):
            caller = sys._getframe(1).f_locals.get("self")
            # the inputs and outputs as they were at the call: the model may change them in place afterwards
            seen = (_snapshot(args), _snapshot(kwargs)) if depth[0] == 0 else None
            depth[0] += 1
            try:
                result = __fn(*args, **kwargs)
            finally:
                depth[0] -= 1
            if seen is not None:
                name = type(caller).__name__ if caller is not None else ""
                calls.append(Call(__fn, seen[0], seen[1], _snapshot(result), name))
            return result

        setattr(owner, attr, staticmethod(wrapper) if isinstance(raw, staticmethod) else wrapper)
    try:
        cls = _text_model_class(model_type, config)
        assert cls is not None, f"no model class of {model_type} takes input_ids"
        model = build_tiny(cls, config)
        ids = torch.randint(1, 100, (1, S), generator=torch.Generator().manual_seed(0))
        inputs = model_inputs(model_type, config, model, ids)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(**inputs)
        for call in calls:
            call.start = int(inputs["position_ids"][0, 0]) if "position_ids" in inputs else 0
    finally:
        for (owner, attr), raw in originals.items():
            setattr(owner, attr, raw)
    # the RoPE of the attention scores (DeepSeek-V3.2's lightning indexer rotates its own keys separately)
    return [c for c in calls if ("Attention" in c.caller or "MLA" in c.caller) and "Indexer" not in c.caller]


def _tensors(call: Call) -> list[tuple[object, torch.Tensor, torch.Tensor]]:
    """(where, input, output) for each rotated tensor: outputs matched to the inputs of the same shape, in order."""
    inputs = [(i, v) for i, v in enumerate(call.args)] + list(call.kwargs.items())
    inputs = [(k, v) for k, v in inputs if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 3]
    outputs = call.result if isinstance(call.result, (tuple, list)) else [call.result]
    pairs, used = [], set()
    for out in outputs:
        for key, x in inputs:
            if key not in used and isinstance(out, torch.Tensor) and x.shape == out.shape:
                pairs.append((key, x, out))
                used.add(key)
                break
    return pairs


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its token axis (length S) second to last, as [1, heads, S, D]."""
    axes = [i for i, n in enumerate(x.shape[:-1]) if n == S]
    assert len(axes) == 1, f"cannot tell the token axis of a {tuple(x.shape)} tensor"
    x = x.movedim(axes[0], -2)
    return x.reshape(1, -1, S, x.shape[-1])


def jacobian_pairing(call: Call) -> tuple[str, int]:
    """The pairing the call applies to its first rotated input, read from the Jacobian of one token.

    Input channels j and j' are partners when they reach the same two output channels; a pass-through
    channel (or a pair whose angle is 0) reaches one. Returns ("half" | "interleaved" | a description,
    rotated channels).
    """
    key, x, out = _tensors(call)[0]
    x = x.detach().clone().requires_grad_(True)
    args, kwargs = list(call.args), dict(call.kwargs)
    if isinstance(key, int):
        args[key] = x
    else:
        kwargs[key] = x
    with torch.enable_grad():
        result = call.fn(*args, **kwargs)
    result = result[0] if isinstance(result, (tuple, list)) else result
    out, xb = _bhsd(result), x
    rows = []
    for c in range(out.shape[-1]):  # the last token (position 13: every pair has turned)
        (grad,) = torch.autograd.grad(out[0, 0, S - 1, c], xb, retain_graph=True)
        rows.append(_bhsd(grad)[0, 0, S - 1])
    jac = torch.stack(rows)  # [D_out, D_in]
    reach = [frozenset((jac[:, j].abs() > 1e-12).nonzero().flatten().tolist()) for j in range(jac.shape[1])]
    partner = {
        j: k
        for j in range(len(reach))
        for k in range(len(reach))
        if j != k and len(reach[j]) == 2 and reach[j] == reach[k]
    }
    if not partner:
        return "no rotation", 0
    offsets = {abs(j - k) for j, k in partner.items()}
    if offsets == {1} and all(min(j, k) % 2 == 0 for j, k in partner.items()):
        return "interleaved", len(partner)
    if len(offsets) == 1 and all(min(j, k) < offsets.copy().pop() for j, k in partner.items()):
        return "half", len(partner)
    return f"neither: partners {sorted(partner.items())[:8]}", len(partner)


def _ropes(config) -> dict[str | None, rotary.RoPE]:
    """rotary's RoPE of ``config``, per layer type when it has one block per layer type."""
    return _ropes_as(config, interleaved=None)


def _ropes_as(config, *, interleaved: bool | None) -> dict[str | None, rotary.RoPE]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny configs' unusual values are not what is tested here
        if interleaved is None:
            settings = read_hf_layers(config, strict=False)
        else:  # bypass the table (for an architecture it refuses)
            d = dict(config.to_dict(), model_type="probe")
            block = d.get("rope_parameters") or {}
            kinds = sorted({t for t in d.get("layer_types") or [] if isinstance(block.get(t), dict)}) or [None]
            settings = {t: read_hf_config(d, layer_type=t, strict=False, interleaved=interleaved) for t in kinds}
        return {
            layer_type: rotary.RoPE(
                s.head_dim,
                base=s.base,
                rotary_dim=s.rotary_dim,
                scaling=s.scaling,
                interleaved=s.interleaved,
                max_position=64,
                strict=False,
            )
            for layer_type, s in settings.items()
        }


def same_up_to_channel_order(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Whether ``theirs[..., c]`` equals ``ours[..., perm[c]]`` for one permutation ``perm`` of the channels.

    Channels are equal within 1e-4 of the largest value across all heads and tokens; the permutation is found by
    bipartite matching (channels that are equal to each other, such as all-zero keys, may be matched either way).
    """
    if ours.shape != theirs.shape:
        return False
    a = ours.double().reshape(-1, ours.shape[-1]).T  # [D, heads * tokens]
    b = theirs.double().reshape(-1, theirs.shape[-1]).T
    tol = 1e-4 * max(float(b.abs().max()), 1.0)
    close = ((a[None, :, :] - b[:, None, :]).abs().amax(-1) <= tol).tolist()  # [their channel][our channel]
    owner: dict[int, int] = {}  # our channel -> their channel matched to it

    def augment(c: int, seen: set[int]) -> bool:  # Kuhn's augmenting path
        for o, ok in enumerate(close[c]):
            if ok and o not in seen:
                seen.add(o)
                if o not in owner or augment(owner[o], seen):
                    owner[o] = c
                    return True
        return False

    return all(augment(c, set()) for c in range(len(close)))


#: model types whose apply function rotates the last rotated-width channels of the whole head ([nope | rope])
TRAILING_SLICE = {"deepseek_v4"}
#: model types whose attention also rotates its output back by -theta at the query position (DeepSeek-V4: keys
#: are values, so the values carry the rotation and the output's rope slice is rotated back)
ROTATES_OUTPUT_BACK = {"deepseek_v4"}


def rotation_matches(
    call: Call, rope: rotary.RoPE, *, trailing: bool = False, conjugate: bool = False, shift: int = 0
) -> bool:
    """Whether ``call`` rotated its tensors as ``rope`` does at the positions the model ran at, plus ``shift``."""
    cos, sin = rope.cos_sin(torch.arange(call.start + shift, call.start + shift + S))
    sin = -sin if conjugate else sin
    for _, x, out in _tensors(call):
        x4, out4 = _bhsd(x.float()), _bhsd(out.float())
        if x4.shape[-1] < cos.shape[-1]:
            return False
        if trailing and x4.shape[-1] > cos.shape[-1]:
            cut = x4.shape[-1] - cos.shape[-1]
            rotated = rotary.apply_rotary(x4[..., cut:].contiguous(), cos, sin, interleaved=rope.interleaved)
            ours = torch.cat([x4[..., :cut], rotated], dim=-1)
        else:
            ours = rotary.apply_rotary(x4, cos, sin, interleaved=rope.interleaved)
        if not same_up_to_channel_order(ours, out4):
            return False
    return True


@functools.cache
def probe(model_type: str) -> tuple[list[Call], object]:
    """The recorded RoPE calls of a tiny model of ``model_type``, built once per model type and config class."""
    if CONFIG_MAPPING[model_type].model_type != model_type:  # an alias (EvollaModel -> evolla): one probe
        return probe(CONFIG_MAPPING[model_type].model_type)
    if model_type in RUN_INSIDE:  # the host model's calls at the component's heads and head width
        host, key = RUN_INSIDE[model_type]
        calls, config = probe(host)
        sub = getattr(config, key)
        shape = (sub.num_attention_heads, sub.hidden_size // sub.num_attention_heads)
        return [
            c for c in calls if all(S in x.shape[:-1] and _bhsd(x).shape[1::2] == shape for _, x, _ in _tensors(c))
        ], sub
    config = tiny_config(model_type)
    calls = record_rope_calls(model_type, config)
    if not calls:  # hybrids whose first two layers are recurrent
        config = tiny_config(model_type, every_layer_type=True)
        calls = record_rope_calls(model_type, config)
    return calls, config


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type",
    sorted(PAIRING),
)
def test_pairing_and_rotation_match_transformers(model_type):
    calls, config = probe(model_type)
    assert calls, f"{model_type}: the attention made no call to a RoPE function"
    ropes = _ropes(config)
    table = "interleaved" if next(iter(ropes.values())).interleaved else "half"
    pairing, rotated = jacobian_pairing(calls[0])
    assert pairing == table, (
        f"{model_type}: transformers rotates {pairing} pairs ({rotated} channels); the table says {table}"
    )
    trailing = model_type in TRAILING_SLICE
    forward = [any(rotation_matches(call, rope, trailing=trailing) for rope in ropes.values()) for call in calls]
    if model_type in ROTATES_OUTPUT_BACK:  # every call rotates forward, or back by -theta (the output)
        back = [any(rotation_matches(c, r, trailing=trailing, conjugate=True) for r in ropes.values()) for c in calls]
        assert sum(back) == sum(forward) // 2, f"{model_type}: {sum(back)} calls rotate back, {sum(forward)} forward"
        forward = [f or b for f, b in zip(forward, back)]
    for i, call in enumerate(calls):
        assert forward[i], (
            f"{model_type}: call {i} ({call.caller}) rotates differently from rotary's RoPE of the same config "
            f"(layer types {list(ropes)})"
        )


@pytest.mark.parametrize("model_type", ["llama", "deepseek_v3", "glm"])
def test_a_constant_position_shift_fails_the_rotation_check(model_type):
    """The check compares rotations at the model's own positions: the same rotation one or three positions
    later, or the other pairing, does not pass (half pairing, DeepSeek's de-interleaving, GLM's interleaving)."""
    calls, config = probe(model_type)
    (rope,) = _ropes(config).values()
    assert all(rotation_matches(call, rope) for call in calls)
    for shift in (1, 3):
        assert not any(rotation_matches(call, rope, shift=shift) for call in calls), f"shift {shift} passed"
    (other,) = _ropes_as(config, interleaved=not rope.interleaved).values()
    assert not any(rotation_matches(call, other) for call in calls)


def _text_part_type(model_type: str) -> str | None:
    """The model_type of a multimodal wrapper's default text_config (what read_hf_config reads), else None."""
    if "text_config" not in (getattr(CONFIG_MAPPING[model_type], "sub_configs", None) or {}):
        return None
    try:
        return getattr(CONFIG_MAPPING[model_type]().text_config, "model_type", None)
    except Exception:  # a wrapper whose defaults transformers cannot build: it needs its own entry
        return None


def test_every_rope_model_type_is_in_a_table():
    missing = []
    for model_type in rope_model_types():
        if (
            model_type in PAIRING
            or model_type in UNSUPPORTED
            or model_type in VISION_ROPE
            or model_type in SEQUENCE_ROPE
        ):
            continue  # VISION_ROPE: vision towers, built by rotary.hf.vision_rope (tests/hf/test_vision_encoders.py)
        text_type = _text_part_type(model_type)
        if text_type in PAIRING or text_type in UNSUPPORTED:
            continue  # a multimodal wrapper: read_hf_config reads its text_config
        missing.append(model_type)
    assert not missing, (
        f"model types that apply RoPE but are in neither rotary.hf.config.PAIRING nor UNSUPPORTED: {missing}"
    )
    stale = sorted(
        (set(PAIRING) | set(UNSUPPORTED) | set(VISION_ROPE) | set(SEQUENCE_ROPE)) - set(CONFIG_MAPPING_NAMES)
    )
    assert not stale, f"table entries that transformers {transformers.__version__} does not know: {stale}"


def _category(reason: str) -> str:
    return next(
        name
        for name in (
            "_NOT_TEXT",
            "_NO_ROPE",
            "_NO_ROPE_AT_ALL",
            "_NOPE_ONLY",
            "_SPEECH_ONLY",
            "_NEGATIVE",
            "_COMPONENTS",
            "_COORDINATES",
        )
        if getattr(rotary.hf.architectures, name) == reason
    )


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED))
def test_refused_architectures_are_refused_for_the_stated_reason(model_type):
    reason = UNSUPPORTED[model_type]
    for interleaved in (None, False):  # stating a pairing does not make an unsupported RoPE right
        with pytest.raises(rotary.ConfigError, match=re.escape(f"model_type {model_type!r} {reason}")):
            read_hf_config({"model_type": model_type, "head_dim": 64}, interleaved=interleaved)
    category = _category(reason)
    if category == "_NOT_TEXT":
        try:
            config = tiny_config(model_type)
        except Exception:
            config = CONFIG_MAPPING[model_type]()
        text_type = _text_part_type(model_type)
        assert _text_model_class(model_type, config) is None or (text_type and text_type not in rope_model_types()), (
            f"{model_type} has a model class that takes input_ids and a RoPE-applying text part"
        )
    elif category in ("_NO_ROPE", "_NO_ROPE_AT_ALL", "_NOPE_ONLY", "_SPEECH_ONLY"):
        calls, _ = probe(model_type)
        assert not calls, f"{model_type}: the attention applied RoPE ({len(calls)} calls)"
    elif category == "_NEGATIVE":
        calls, config = probe(model_type)
        (rope,) = _ropes_as(config, interleaved=False).values()
        for call in calls:
            # rotating by -theta: the conjugate rotation, i.e. sin negated
            assert rotation_matches(call, rope, conjugate=True)
            assert not rotation_matches(call, rope)
    elif category == "_COMPONENTS":  # BLT: every component rotates at its own sub-config's heads and head width
        calls, config = probe(model_type)
        parts = {key: getattr(config, key) for key in ("encoder_config", "decoder_config", "global_config")}
        shapes = {k: (c.num_attention_heads, c.hidden_size // c.num_attention_heads) for k, c in parts.items()}
        assert len(set(shapes.values())) == 3, shapes
        seen = {(x.shape[1], x.shape[-1]) for call in calls for _, x, _ in _tensors(call)}
        assert seen == set(shapes.values()), f"{model_type}: calls at (heads, width) {seen}, components {shapes}"
        # the sub-configs the reason names are what from_hf_config builds, checked against these calls
        assert {RUN_INSIDE[t][1] for t in RUN_INSIDE} == {"encoder_config", "decoder_config"}
        assert all(t in PAIRING for t in RUN_INSIDE)
        for key in ("encoder_config", "decoder_config"):
            assert rotary.RoPE.from_hf_config(parts[key]).head_dim == shapes[key][1]
    elif category == "_COORDINATES":  # ESMFold2: the angles follow each atom's coordinates, not its index
        name = model_type_to_module_name(model_type)
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        assert [n for n in vars(module) if "RotaryEmbedding" in n] == ["EsmFold2RotaryEmbedding"]
        embedding = module.EsmFold2RotaryEmbedding(CONFIG_MAPPING[model_type]().atom_encoder)
        coords = torch.randn(1, 5, 3, generator=torch.Generator().manual_seed(0))
        coords[0, 4] = coords[0, 1]  # atoms 1 and 4: the same place, different indices
        uid = torch.zeros(1, 5, dtype=torch.long)
        cos, sin = embedding(coords, uid, dtype=torch.float32)
        assert torch.equal(cos[0, 1], cos[0, 4]) and torch.equal(sin[0, 1], sin[0, 4])
        assert not torch.allclose(cos[0, 1], cos[0, 2])  # another place, other angles
        shifted, _ = embedding(coords + 1.0, uid, dtype=torch.float32)
        assert not torch.allclose(shifted, cos)  # the same atom order, moved in space: other angles
        # the RoPE from_hf_config builds instead: its protein language model's
        esmc = CONFIG_MAPPING[model_type]().esmc_config
        assert esmc.model_type in PAIRING and rotary.RoPE.from_hf_config(esmc).head_dim > 0


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(ROPE_SWITCHES))
def test_a_model_whose_rope_is_switched_off_applies_none_and_is_refused(model_type):
    flag, on, default = ROPE_SWITCHES[model_type]
    config = tiny_config(model_type)
    assert getattr(config, flag) == on and getattr(CONFIG_MAPPING[model_type](), flag) == default
    off = (not on) if isinstance(on, bool) else default
    setattr(config, flag, off)
    assert not record_rope_calls(model_type, config), f"{model_type} applied RoPE with {flag}={off!r}"
    with pytest.raises(rotary.ConfigError, match=re.escape(f"{flag}={off!r}")):
        read_hf_config(config)


#: the multimodal-RoPE text types this file adds (their rotary embedding class): checked with positions that differ
#: per axis, which the probe's text positions (t = h = w) cannot tell apart from 1-D RoPE
MROPE_EMBEDDINGS = {
    "qwen4_exp_text": ("qwen4_exp", "Qwen4ExpTextRotaryEmbedding"),
    "qwen3_omni_moe_talker_text": ("qwen3_omni_moe", "Qwen3OmniMoeTalkerRotaryEmbedding"),
}


@pytest.mark.parametrize("model_type", sorted(MROPE_EMBEDDINGS))
def test_mrope_tables_match_transformers_on_positions_that_differ_per_axis(model_type):
    module, name = MROPE_EMBEDDINGS[model_type]
    config = tiny_config(model_type)
    theirs = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)(config)
    positions = torch.randint(0, 50, (3, 2, 7), generator=torch.Generator().manual_seed(0))
    cos, sin = theirs(torch.zeros(2, 7, 16), positions)  # (only its dtype and device are read)
    tables = rotary.MRoPE.from_hf_config(config).tables(positions)
    assert not torch.equal(positions[0], positions[1])
    # transformers' tables repeat the r/2 angles in the half layout; rotary's hold each once per pair slot
    half = cos.shape[-1] // 2
    torch.testing.assert_close(tables.cos[..., :half], cos[..., :half], rtol=0, atol=1e-6)
    torch.testing.assert_close(tables.sin[..., :half], sin[..., :half], rtol=0, atol=1e-6)
    torch.testing.assert_close(tables.cos[..., half:], cos[..., half:], rtol=0, atol=1e-6)
