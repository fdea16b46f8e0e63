"""A causal LM checkpoint, its RoPE, and the models of each scaling built by transformers from an edited config.

The traps of scaling a pretrained model's RoPE in transformers, and how each is avoided: docs/sweep.md. In
short, config.json is edited *before* transformers builds the model, the new block carries ``rope_theta``
over, dynamic NTK gets a fresh model per length, and :func:`check_tables` compares the model's cos/sin with
rotary's tables.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError
from ...hf.config import ConfigError

__all__ = [
    "ALL_SCALINGS",
    "Checkpoint",
    "build_model",
    "check_tables",
    "factor_for",
    "open_checkpoint",
    "scaled_config",
    "scaling_block",
]

#: every scaling ``--scalings`` knows, in the order reports list them
ALL_SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
#: what each name means, for errors and the docs
SCALING_NAMES = {
    "none": "plain RoPE (rope_type default)",
    "linear": "Position Interpolation (rope_type linear)",
    "ntk": "NTK-aware scaling, NTK-alpha (plain RoPE at base x factor ** (d / (d - 2)))",
    "dynamic": "dynamic NTK (rope_type dynamic)",
    "yarn": "YaRN (rope_type yarn)",
    "llama3": "Llama 3.1's frequency bands (rope_type llama3)",
    "longrope": "LongRoPE (rope_type longrope, the model's own short/long factors)",
}
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class Checkpoint:
    """A causal LM's config.json (as written, never modified) and what the sweep reads from it.

    ``form``: ``"5.x"`` (``rope_parameters``) or ``"4.x"`` (``rope_scaling``); ``original_length``: the context
    the scalings extend; ``layer_types``/``blocks``: the layer types whose RoPE the scalings change (``[None]``:
    one RoPE) and their blocks; ``rotary_dims``: each type's rotated width; ``weights_bytes`` 0 for a hub id.
    """

    source: str
    config: dict[str, Any]
    model_type: str
    form: str
    original_length: int
    layer_types: tuple[str | None, ...]
    blocks: dict[str | None, dict[str, Any]]
    sliding_window: int | None
    nope_layers: tuple[int, ...] = ()
    num_layers: int = 0
    vocab_size: int = 0
    weights_bytes: int = 0
    rotary_dims: dict[str | None, int] = field(default_factory=dict)

    def admitted(self) -> tuple[str, ...]:
        """The scalings this checkpoint admits: all but LongRoPE, which needs the model's own factors."""
        return tuple(s for s in ALL_SCALINGS if s != "longrope" or self.has_longrope_factors)

    @property
    def has_longrope_factors(self) -> bool:
        return all("short_factor" in b and "long_factor" in b for b in self.blocks.values())


def _read_config(model: str) -> tuple[dict[str, Any], int]:
    """config.json and the weights' size, of a local directory or (network allowing) a hub id."""
    path = Path(model)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise InputError(f"{model}: no config.json in this directory; give a transformers checkpoint directory")
        weights = [path / name for name in _WEIGHT_FILES if (path / name).is_file()]
        if not weights:
            raise InputError(
                f"{model}: a config.json but no weights (none of {', '.join(_WEIGHT_FILES)}); give a checkpoint "
                "directory written by save_pretrained"
            )
        size = sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".bin"))
        try:
            return json.loads(config_file.read_text(encoding="utf-8")), size
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{config_file}: not a JSON config ({exc}); give a transformers checkpoint") from None
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", model) or model.startswith("."):
        what = "not a directory" if path.exists() else "no such directory"
        raise InputError(f"{model}: {what}; give a checkpoint directory written by save_pretrained (or a hub id)")
    try:  # a hub id: transformers downloads the config, where the network allows it
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model).to_dict(), 0
    except Exception as exc:  # OSError, an offline hub, a repo without a config: one line
        raise InputError(
            f"{model}: neither a local checkpoint directory nor a hub id transformers can load "
            f"({type(exc).__name__}); give a directory with config.json and weights"
        ) from None


def open_checkpoint(model: str, *, original_length: int | None = None) -> Checkpoint:
    """Read ``model``'s config (a directory or a hub id) and its RoPE; ``original_length`` defaults to
    ``original_max_position_embeddings``, else ``max_position_embeddings``. InputError when there is no checkpoint
    there, a model without RoPE, or a multimodal config.
    """
    from ...hf import read_hf_layers
    from ...rope import RoPE

    config, weights_bytes = _read_config(model)
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(f"{model}: config.json has no model_type; give a transformers checkpoint")
    if "text_config" in config:
        raise InputError(
            f"{model}: a multimodal config ({model_type}); rotary sweep measures causal language models, "
            "give the checkpoint of its text model"
        )
    layers = config.get("num_hidden_layers", 0)
    try:
        found = read_hf_layers(config)
    except ConfigError as exc:
        raise InputError(
            f"{model}: {model_type} applies no RoPE rotary can read in its {layers} layers ({exc}); rotary sweep "
            "measures RoPE scalings"
        ) from None
    settings = next(iter(found.values()))
    flags = settings.rope_layers
    nope = tuple(i for i, f in enumerate(flags or ()) if not f)
    if flags is not None and not any(flags):
        raise InputError(
            f"{model}: no layer of this {model_type} applies RoPE (no_rope_layers is 0 for layers 0-{len(flags) - 1}); "
            "there is no RoPE to scale"
        )
    layer_types: tuple[str | None, ...] = tuple(found)
    if None not in found and "full_attention" in found:
        layer_types = ("full_attention",)  # Gemma 3: the global layers carry the long range; local ones keep theirs
    blocks, rotary_dims = {}, {}
    for kind in layer_types:
        s = found[kind]
        if s.mrope_section is not None:
            raise InputError(f"{model}: {model_type} rotates by multimodal positions (M-RoPE); not a text model")
        blocks[kind] = {**s.scaling, "rope_theta": s.base}
        rotary_dims[kind] = RoPE.from_hf_config(config, layer_type=kind, strict=False).rotary_dim
    first = blocks[layer_types[0]]
    length = original_length or first.get("original_max_position_embeddings") or settings.max_position_embeddings
    if not isinstance(length, int) or length < 2:
        raise InputError(
            f"{model}: the config states no context length (max_position_embeddings); give --original-length"
        )
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False:
        window = None
    return Checkpoint(
        source=model,
        config=config,
        model_type=model_type,
        form="5.x" if "rope_parameters" in config else "4.x",
        original_length=int(length),
        layer_types=layer_types,
        blocks=blocks,
        sliding_window=window if isinstance(window, int) else None,
        nope_layers=nope,
        num_layers=int(layers or 0),
        vocab_size=int(config.get("vocab_size") or 0),
        weights_bytes=weights_bytes,
        rotary_dims=rotary_dims,
    )


def factor_for(length: int, original_length: int) -> float:
    """The scaling factor at ``length``: ``length / original_length``, at least 1.

    >>> factor_for(8192, 2048), factor_for(1024, 2048)
    (4.0, 1.0)
    """
    return max(1.0, length / original_length)


def scaling_block(scaling: str, factor: float, original_length: int, current: dict[str, Any]) -> dict[str, Any]:
    """The RoPE block (without ``rope_theta``) of ``scaling`` at ``factor``, keeping the model's own parameters;
    InputError for an unknown scaling or LongRoPE without the model's factors.

    >>> scaling_block("yarn", 4.0, 2048, {"rope_type": "default"})
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 2048}
    """
    if scaling not in ALL_SCALINGS:
        raise InputError(f"unknown scaling {scaling!r}; known: {', '.join(ALL_SCALINGS)}")
    same = current.get("rope_type") == scaling
    if scaling in ("none", "ntk"):  # NTK-aware scaling is plain RoPE at a raised base (scaled_config raises it)
        return {"rope_type": "default"}
    if scaling in ("linear", "dynamic"):
        return {"rope_type": scaling, "factor": factor}
    block: dict[str, Any] = {"rope_type": scaling, "factor": factor}
    if scaling == "yarn" and same:
        block.update({k: current[k] for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim") if k in current})
    if scaling == "llama3":
        block["low_freq_factor"] = current.get("low_freq_factor", 1.0) if same else 1.0
        block["high_freq_factor"] = current.get("high_freq_factor", 4.0) if same else 4.0
    if scaling == "longrope":
        if "short_factor" not in current or "long_factor" not in current:
            raise InputError(
                "scaling 'longrope' needs the model's own short_factor and long_factor (LongRoPE searches them per "
                "model); this checkpoint has none: choose among none, linear, ntk, dynamic, yarn, llama3"
            )
        block["short_factor"], block["long_factor"] = list(current["short_factor"]), list(current["long_factor"])
    block["original_max_position_embeddings"] = original_length
    return block


def scaled_config(checkpoint: Checkpoint, scaling: str, factor: float) -> dict[str, Any]:
    """config.json of ``checkpoint`` with ``scaling`` at ``factor``, in its own form (see docs/sweep.md).

    >>> ck = Checkpoint("m", {"model_type": "llama", "rope_theta": 5e5, "max_position_embeddings": 8192},
    ...                 "llama", "4.x", 8192, (None,), {None: {"rope_type": "default", "rope_theta": 5e5}}, None)
    >>> c = scaled_config(ck, "yarn", 2.0)
    >>> c["rope_theta"], c["rope_scaling"]
    (500000.0, {'rope_type': 'yarn', 'factor': 2.0, 'original_max_position_embeddings': 8192})
    """
    config = copy.deepcopy(checkpoint.config)
    length = checkpoint.original_length
    for kind in checkpoint.layer_types:
        current = checkpoint.blocks[kind]
        block = scaling_block(scaling, factor, length, current)
        theta = current["rope_theta"]
        if scaling == "ntk":
            width = checkpoint.rotary_dims[kind]
            theta = theta * factor ** (width / (width - 2))
        if checkpoint.form == "5.x":
            keep = {k: current[k] for k in ("rope_theta", "partial_rotary_factor") if k in current}
            keep["rope_theta"] = theta
            if kind is None:
                config["rope_parameters"] = {**block, **keep}
            else:
                config["rope_parameters"] = {**config["rope_parameters"], kind: {**block, **keep}}
        else:
            config["rope_theta"] = theta if kind is None or scaling == "ntk" else config.get("rope_theta", theta)
            config["rope_scaling"] = None if scaling in ("none", "ntk") else block
    if "original_max_position_embeddings" in config:  # Phi-3 states it at the top, where it wins over the block's
        config["original_max_position_embeddings"] = length
    if scaling == "dynamic":
        config["max_position_embeddings"] = length  # transformers' dynamic NTK measures from here
    elif scaling in ("yarn", "llama3", "longrope"):
        # the block states its origin, so this moves nothing; it makes max / original equal the factor, as
        # rotary's reader requires of an unambiguous config (transformers would use factor and warn)
        config["max_position_embeddings"] = max(length, round(length * factor))
    return config


def transformers_config(checkpoint: Checkpoint, config: dict[str, Any], *, window: int | None = None):
    """A transformers config object from the dict ``config``, with ``window`` replacing the sliding window."""
    from transformers import AutoConfig

    d = dict(config)
    if window is not None and d.get("sliding_window") is not None:
        d["sliding_window"] = window
    d.pop("model_type")
    return AutoConfig.for_model(checkpoint.model_type, **d)


def build_model(
    checkpoint: Checkpoint,
    config: dict[str, Any],
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    device_map: str | None = None,
    window: int | None = None,
    patch: bool = False,
):
    """The model transformers builds from the weights and the (edited) ``config``, in eval mode."""
    from transformers import AutoModelForCausalLM

    hf_config = transformers_config(checkpoint, config, window=window)
    kwargs: dict[str, Any] = {"config": hf_config, "dtype": dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(checkpoint.source, **kwargs)
    if device_map is None:
        model = model.to(device)
    model.eval()
    if patch:
        from ... import hf

        hf.patch(model)
    return model


def _rotary_embedding(model) -> torch.nn.Module:
    for name, module in model.named_modules():
        if name.endswith("rotary_emb"):
            return module
    raise InputError(f"{type(model).__name__} has no rotary_emb module; rotary sweep cannot check its RoPE")


@torch.no_grad()
def check_tables(model, checkpoint: Checkpoint, config: dict[str, Any], length: int) -> float:
    """The largest difference between the model's cos/sin at ``0 .. length - 1`` and rotary's tables for
    ``config``; InputError when they differ (transformers does not read the scaling for this family).
    """
    from ... import positions as P
    from ...rope import RoPE

    emb = _rotary_embedding(model)
    buffer = next((b for b in emb.buffers()), None)
    device = buffer.device if buffer is not None else torch.device("cpu")
    position_ids = torch.arange(length, device=device)[None]
    tolerance = 1e-5 + length * 2.0**-21
    worst = 0.0
    for kind in checkpoint.layer_types:
        rope = RoPE.from_hf_config(config, layer_type=kind, max_position=length)
        tables = rope.tables(P.arange(length))
        x = torch.zeros(1, length, 1, device=device, dtype=torch.float32)
        cos, sin = emb(x, position_ids) if kind is None else emb(x, position_ids, kind)
        width = tables.cos.shape[-1]
        for ours, theirs in ((tables.cos, cos[0, :, :width]), (tables.sin, sin[0, :, :width])):
            diff = float((ours.float() - theirs.float().cpu()).abs().max())
            worst = max(worst, diff)
            if not math.isfinite(diff) or diff > tolerance:
                where = "" if kind is None else f" ({kind} layers)"
                raise InputError(
                    f"{checkpoint.model_type}{where}: the model transformers builds with rope "
                    f"{config_rope(config, kind)} rotates differently from rotary's tables for the same config (max "
                    f"difference {diff:.3g} at length {length}); this family does not admit that scaling"
                )
    return worst


def config_rope(config: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    """The RoPE block of a config dict (5.x: of layer type ``kind``), for messages and reports."""
    if "rope_parameters" in config:
        block = config["rope_parameters"]
        return block.get(kind) if kind is not None else block
    return {"rope_theta": config.get("rope_theta"), **(config.get("rope_scaling") or {})}
