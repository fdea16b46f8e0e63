"""A model of ``rotary experiment`` as a Hugging Face transformers checkpoint (``rotary export``).

The experiment's Decoder is Llama's architecture weight for weight: a RoPE model maps onto ``LlamaForCausalLM``
(interleaved q/k rows permuted to the half pairing), a NoPE model onto SmolLM3 (``no_rope_layers``); other
encodings raise :class:`ExportError`. The tokenizer is one token per byte. More: docs/sweep.md, "The
experiment's models as checkpoints".
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError
from ...models import Decoder

__all__ = ["ExportError", "byte_tokenizer", "export_model", "hf_config_of", "load_experiment_model", "to_hf_state_dict"]

#: the position encodings a transformers checkpoint can state, and the architecture that states each
EXPORTABLE = {"rope": "LlamaForCausalLM", "none": "SmolLM3ForCausalLM"}


class ExportError(InputError):
    """A model that cannot be written as a transformers checkpoint; the message says why."""


def load_experiment_model(directory: str | os.PathLike) -> tuple[Decoder, int]:
    """The trained model in ``RUN/models/NAME`` (or its ``checkpoint.pt``), eval mode on the CPU, and its length;
    ExportError when there is no checkpoint of ``rotary experiment`` there.
    """
    from ..experiments.config import ExperimentConfig
    from ..experiments.plan import ModelSpec
    from ..experiments.train import CHECKPOINT, decoder_config, trained_scaling

    path = Path(directory)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise ExportError(
            f"{directory}: no {CHECKPOINT} there; give a model directory of a run, RUN/models/NAME "
            "(rotary experiment writes one per model)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        spec = ModelSpec(**state["spec"])
        config = ExperimentConfig.from_dict(state["config"])
        scaling = trained_scaling(spec, config)
        model = Decoder(decoder_config(spec.encoding, config, scaling, spec.rope_base, stage=spec.stage))
        model.load_state_dict(state["model"])
    except Exception as exc:  # a truncated file, another program's checkpoint, a state dict of another shape
        raise ExportError(
            f"{path} is not a readable checkpoint of rotary experiment ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); give RUN/models/NAME of a run"
        ) from None
    return model.eval(), spec.length


def _check_exportable(model: Decoder) -> None:
    c = model.config
    if c.position_encoding not in EXPORTABLE:
        raise ExportError(
            f"position_encoding={c.position_encoding!r} has no transformers Llama equivalent (exported: "
            f"{', '.join(EXPORTABLE)}); a checkpoint of it would compute other logits"
        )
    if c.no_rope_layers is not None and not all(c.no_rope_layers) and c.attn_temperature_tuning:
        raise ExportError(
            "this model's NoPE layers scale their queries by Llama 4's temperature, which no Llama-layout "
            "config states; export a model without no_rope_layers (or with attn_temperature_tuning=False)"
        )
    if c.position_encoding == "rope" and model.rope.log_frequency_scale is not None:
        raise ExportError("this model's RoPE learns its frequencies; a transformers config states fixed ones")


def hf_config_of(model: Decoder, original_length: int) -> dict[str, Any]:
    """The config.json (5.x form) of the transformers model equal to ``model`` (``position_encoding`` ``"rope"``
    or ``"none"``; other encodings raise ExportError), with ``original_length`` as ``max_position_embeddings``.

    >>> from rotary.models import DecoderConfig
    >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2))
    >>> c = hf_config_of(m, 128)
    >>> c["architectures"], c["rope_parameters"], c["max_position_embeddings"]
    (['LlamaForCausalLM'], {'rope_type': 'default', 'rope_theta': 10000.0}, 128)
    """
    _check_exportable(model)
    c = model.config
    rope = {"rope_type": "default", "rope_theta": float(c.rope_base)}
    if c.rope_scaling:
        block = {k: v for k, v in c.rope_scaling.items() if k != "type"}
        block.setdefault("rope_type", c.rope_scaling.get("type", "default"))
        theta = float(block.pop("rope_theta", c.rope_base))
        if block["rope_type"] == "ntk":  # static NTK (rotary's, not transformers'): plain RoPE at the raised base
            width = c.head_dim * block.pop("partial_rotary_factor", 1.0)
            theta = theta * block.pop("factor") ** (width / (width - 2))
            block["rope_type"] = "default"
        rope = {**block, "rope_theta": theta}
        if rope["rope_type"] not in _transformers_rope_types():
            raise ExportError(
                f"this model's rope_type {rope['rope_type']!r} is rotary's own; transformers reads "
                f"{', '.join(sorted(_transformers_rope_types()))}"
            )
    config: dict[str, Any] = {
        "architectures": [EXPORTABLE[c.position_encoding]],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(original_length),
        "rms_norm_eps": c.rms_norm_eps,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": bool(c.tie_word_embeddings),
        "rope_parameters": rope,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "dtype": "float32",
    }
    if c.position_encoding == "none":
        config.update(
            model_type="smollm3",
            no_rope_layers=[0] * c.num_layers,
            use_sliding_window=False,
            sliding_window=None,
        )
    return config


def _transformers_rope_types() -> set[str]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return {"default", *ROPE_INIT_FUNCTIONS}


def to_hf_state_dict(model: Decoder) -> dict[str, torch.Tensor]:
    """``model``'s weights under Llama's names (q/k rows in Llama's half pairing), copies on the CPU."""
    from ...pairing import permute_qk_weight

    _check_exportable(model)
    c = model.config
    permute = c.position_encoding == "rope" and c.rope_interleaved
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.attn_norm.weight
        out[p + "post_attention_layernorm.weight"] = layer.mlp_norm.weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            weight = getattr(layer.attn, name).weight
            if permute and name in ("q_proj", "k_proj"):
                weight = permute_qk_weight(weight.detach(), c.head_dim, "half")
            out[p + f"self_attn.{name}.weight"] = weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[p + f"mlp.{name}.weight"] = getattr(layer.mlp, name).weight
    return {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in out.items()}


def byte_tokenizer():
    """A ``PreTrainedTokenizerFast`` with one token per byte, id = byte value, no special tokens.

    >>> byte_tokenizer()("pass é")["input_ids"] == list("pass é".encode())
    True
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_to_char = pre_tokenizers.ByteLevel.alphabet()  # 256 printable stand-ins, in no particular order
    chars = _byte_chars()
    assert set(chars) == set(byte_to_char)
    tokenizer = Tokenizer(models.BPE(vocab={ch: b for b, ch in enumerate(chars)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, clean_up_tokenization_spaces=False)


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map (what the ByteLevel pre-tokenizer emits), byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def export_model(source: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the experiment model in ``source`` (``RUN/models/NAME``) as a transformers checkpoint in ``out``:
    ``config.json``, ``model.safetensors`` and a byte-level tokenizer, renamed into place at the end.

    Raises:
        ExportError: ``source`` holds no exportable checkpoint; ``out`` exists and is not an empty directory.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line says what was written

    target = Path(out)
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise ExportError(f"{out} already exists; give a new directory for the checkpoint")
    model, length = load_experiment_model(source)
    config_dict = hf_config_of(model, length)
    weights = to_hf_state_dict(model)
    parent = target.parent
    try:  # a failure names OUT as given, not only the folder above it
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    except OSError as exc:
        raise ExportError(
            f"{out}: cannot create it in {parent} ({exc.strerror or exc}); give a new directory"
        ) from None
    try:
        (staging / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n", encoding="utf-8")
        hf_config = AutoConfig.from_pretrained(staging)
        hf_model = AutoModelForCausalLM.from_config(hf_config)
        missing, unexpected = hf_model.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"} if config_dict["tie_word_embeddings"] else set()
        if set(missing) - tied or unexpected:
            raise ExportError(
                f"the {type(hf_model).__name__} of transformers does not take this model's weights "
                f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})"
            )
        hf_model.save_pretrained(staging, safe_serialization=True)
        byte_tokenizer().save_pretrained(staging)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
