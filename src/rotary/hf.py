"""Run a loaded Hugging Face transformers model's rotary application through ``rotary.apply_rotary``.

``patch(model)`` changes *that model only*. Each supported transformers family rotates q and k by
calling a module-level function (``apply_rotary_pos_emb``; DeepSeek-V3 also
``apply_rotary_pos_emb_interleave``) from its attention module's ``forward``. For every attention
module of the model, ``patch`` gives the module its own copy of the class's ``forward``: the same
code object, run with a copy of the modeling module's globals in which those names are bound to
rotary's implementation. Nothing in transformers (files, classes, module globals) is modified, so
other models in the process, even of the same class, are unaffected; ``unpatch(model)`` removes the
per-instance ``forward`` and the class method is used again, exactly as before.

Tables are left to the model: the cos/sin its rotary-embedding module produces are applied by
rotary (which computes in fp32 and dispatches to the fused kernel when one is available), so the
logits equal the unpatched model's up to fp32 rounding. Each replacement produces transformers'
output channel for channel, including DeepSeek-V3's de-interleaving, so a KV cache filled by a
patched model can be read by an unpatched one and the other way round.

Caveat: the patched ``forward`` sees the modeling module's globals as they were when ``patch`` ran
(anything monkey-patched into transformers later is not seen until ``unpatch``/``patch`` again).
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .pairing import to_half
from .rotation import rotate
from .tables import RotaryTables

__all__ = ["SUPPORTED", "is_patched", "patch", "unpatch"]

#: ``unsqueeze_dim`` of transformers' ``apply_rotary_pos_emb`` -> rotary layout
_LAYOUT = {1: "bhsd", 2: "bshd"}


def _layout(unsqueeze_dim: int) -> str:
    try:
        return _LAYOUT[unsqueeze_dim]
    except KeyError:
        raise ValueError(f"unsqueeze_dim must be 1 ([B, H, S, D]) or 2 ([B, S, H, D]), got {unsqueeze_dim!r}") from None


def _apply_pair(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool, layout: str):
    """q and k rotated in one kernel call (transformers passes ``[B, S, r]`` or ``[S, r]`` tables)."""
    # the model's own tables, trusted as they are (no check on every layer of every step)
    tables = RotaryTables.from_tensors(cos, sin, interleaved=interleaved, validate=False)
    q, k = rotate([q, k], tables, layout=layout, kinds=("q", "k"), names=("q", "k"))
    return q, k


def _apply_half(q, k, cos, sin, unsqueeze_dim=1):
    """Llama family: pairs (i, i + r/2); ``r = cos.shape[-1]`` may be < head_dim (GPT-NeoX, Phi-3)."""
    return _apply_pair(q, k, cos, sin, interleaved=False, layout=_layout(unsqueeze_dim))


def _apply_interleaved(q, k, cos, sin, unsqueeze_dim=1):
    """Cohere: pairs (2i, 2i+1); its tables already repeat each angle twice in a row."""
    return _apply_pair(q, k, cos, sin, interleaved=True, layout=_layout(unsqueeze_dim))


def _apply_glm(q, k, cos, sin, unsqueeze_dim=1):
    """GLM: tables come in the half layout ``[θ, θ]``; rotation pairs (2i, 2i+1) of the first r channels."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)
    return _apply_interleaved(q, k, cos, sin, unsqueeze_dim)


def _apply_gpt_oss(q, k, cos, sin, unsqueeze_dim=1):
    """gpt-oss: one angle per pair, ``cos/sin [B, S, D/2]``; pairs (i, i + D/2) of the whole head."""
    return _apply_half(q, k, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1), unsqueeze_dim)


def _apply_deepseek_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """DeepSeek-V3 with ``rope_interleave`` (the default): the checkpoint's rope channels hold pairs
    (2i, 2i+1); transformers returns them *de-interleaved* (even channels, then odd ones) and rotated
    with the half pairing. The same here: :func:`rotary.to_half`, then the half rotation of the
    ``[θ, θ]`` tables, so the output (and a KV cache of it) equals transformers' channel for channel.
    ``position_ids`` is accepted and unused, as in transformers."""
    return _apply_half(to_half(q), to_half(k), cos, sin, unsqueeze_dim)


def _apply_pixtral(q, k, cos, sin, unsqueeze_dim=1):
    """Pixtral's vision attention: q, k ``[B, H, S, D]`` and one image grid's tables ``[S, D]`` (its 2-D
    angles already laid out in the half layout, pairs (i, i + D/2)), broadcast with ``unsqueeze_dim=0``."""
    if unsqueeze_dim == 0 and cos.dim() == 2:
        return _apply_pair(q, k, cos, sin, interleaved=False, layout="bhsd")
    return _apply_half(q, k, cos, sin, unsqueeze_dim)


def _complex_tables(freqs: torch.Tensor) -> RotaryTables:
    """Tables of pairs (2i, 2i+1) from transformers' complex ``e^{iθ}`` (times any attention scaling)."""
    cos, sin = freqs.real.repeat_interleave(2, dim=-1), freqs.imag.repeat_interleave(2, dim=-1)
    return RotaryTables.from_tensors(cos, sin, interleaved=True, validate=False)


def _apply_llama4_text(xq, xk, freqs_cis):
    """Llama 4's text attention: ``xq, xk [B, S, H, D]``, complex ``freqs_cis [B, S, D/2]``, pairs (2i, 2i+1)."""
    q, k = rotate([xq, xk], _complex_tables(freqs_cis), layout="bshd", kinds=("q", "k"), names=("xq", "xk"))
    return q, k


def _apply_llama4_vision(query, key, freqs_ci):
    """Llama 4's vision attention: ``query, key [B, S, H, D]`` and complex ``freqs_ci [S, 1, D/2]``
    (the 2-D angles of the patches, then the class token's 0), pairs (2i, 2i+1)."""
    freqs = freqs_ci.to(query.device).reshape(query.shape[1], -1)
    tables = _complex_tables(freqs)
    q, k = rotate([query, key], tables, layout="bshd", kinds=("q", "k"), names=("query", "key"))
    return q, k


def _apply_gptj(tensor, sin, cos):
    """GPT-J: ``tensor [B, S, H, r]``, one angle per pair ``sin/cos [B, S, r/2]``, pairs (2i, 2i+1)."""
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    tables = RotaryTables.from_tensors(cos, sin, interleaved=True, validate=False)
    return rotate([tensor], tables, layout="bshd", names=("tensor",))[0]


@dataclass(frozen=True)
class _Family:
    module: str  # transformers modeling module
    replacements: Mapping[str, Callable]  # the global names its attention forward calls -> rotary's versions


_HALF = {"apply_rotary_pos_emb": _apply_half}


def _half(module: str) -> _Family:
    return _Family(f"transformers.models.{module}.modeling_{module}", _HALF)


#: transformers ``model_type`` -> where its rotary application lives and what replaces it
SUPPORTED: dict[str, _Family] = {
    "llama": _half("llama"),
    "mistral": _half("mistral"),
    "mixtral": _half("mixtral"),
    "qwen2": _half("qwen2"),
    "qwen3": _half("qwen3"),
    "qwen3_moe": _half("qwen3_moe"),
    "phi3": _half("phi3"),
    "gemma3": _half("gemma3"),  # Gemma3ForConditionalGeneration: its language model
    "gemma3_text": _half("gemma3"),  # both layer types: each layer gets the tables of its type from the model
    "gpt_neox": _half("gpt_neox"),
    "gpt_oss": _Family("transformers.models.gpt_oss.modeling_gpt_oss", {"apply_rotary_pos_emb": _apply_gpt_oss}),
    "deepseek_v3": _Family(
        "transformers.models.deepseek_v3.modeling_deepseek_v3",
        {"apply_rotary_pos_emb": _apply_half, "apply_rotary_pos_emb_interleave": _apply_deepseek_interleave},
    ),
    "gptj": _Family("transformers.models.gptj.modeling_gptj", {"apply_rotary_pos_emb": _apply_gptj}),
    "cohere": _Family("transformers.models.cohere.modeling_cohere", {"apply_rotary_pos_emb": _apply_interleaved}),
    "glm": _Family("transformers.models.glm.modeling_glm", {"apply_rotary_pos_emb": _apply_glm}),
    # multimodal RoPE: the text attention gets M-RoPE tables already laid out per slot, pairs (i, i + r/2);
    # the vision towers rotate through another function (apply_rotary_pos_emb_vision), left as they are
    **{model_type: _half(name) for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl") for model_type in (name, f"{name}_text")},
    # vision towers with 2-D RoPE: Pixtral's PixtralVisionModel, and Llama 4 (text, vision tower, or both)
    "pixtral": _Family("transformers.models.pixtral.modeling_pixtral", {"apply_rotary_pos_emb": _apply_pixtral}),
    **{
        model_type: _Family(
            "transformers.models.llama4.modeling_llama4",
            {"apply_rotary_emb": _apply_llama4_text, "vision_apply_rotary_emb": _apply_llama4_vision},
        )
        for model_type in ("llama4", "llama4_text", "llama4_vision_model")
    },
}

_MARK = "_rotary_hf_patch"  # on a patched submodule: the instance ``forward`` it had before (or None)


def _family(model: nn.Module) -> _Family:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model, nn.Module) or model_type is None:
        raise TypeError(
            f"patch expects a transformers model (an nn.Module with config.model_type), got {type(model).__name__}"
        )
    if model_type not in SUPPORTED:
        raise ValueError(
            f"rotary.hf.patch does not support model_type {model_type!r}; supported: {', '.join(sorted(SUPPORTED))}"
        )
    return SUPPORTED[model_type]


def _check_module(model: object, call: str) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{call} expects a transformers model (an nn.Module), got {type(model).__name__}")


def is_patched(model: nn.Module) -> bool:
    """True if :func:`patch` has been applied to ``model`` (and not undone).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    _check_module(model, "is_patched")
    return any(hasattr(m, _MARK) for m in model.modules())


def patch(model: nn.Module) -> nn.Module:
    """Route the rotary application of a transformers ``model`` through :func:`rotary.apply_rotary`.

    Only this model changes (see the module docstring); calling ``patch`` twice is harmless.

    Args:
        model: a transformers model of a type in :data:`SUPPORTED` (any head): Llama, Mistral, Mixtral,
            Qwen2, Qwen3, Qwen3-MoE, Phi-3, Gemma-3 (both layer types), GPT-NeoX, gpt-oss, DeepSeek-V3,
            GPT-J, Cohere or GLM, a Qwen2-VL, Qwen2.5-VL or Qwen3-VL model (its text attention), a
            Pixtral vision tower (``PixtralVisionModel``), or a Llama 4 model (text, vision tower, or both).

    Returns:
        ``model`` itself.

    Raises:
        ValueError: unsupported ``model_type`` (the message lists the supported ones).
        RuntimeError: no attention module calls the expected function (an incompatible transformers).

    An instance ``forward`` set by someone else (e.g. an accelerate hook) is put aside while
    patched and restored by :func:`unpatch`.

    Example:
        >>> import transformers
        >>> config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                                   num_hidden_layers=1, num_attention_heads=4)
        >>> model = transformers.LlamaForCausalLM(config).eval()
        >>> ids = torch.randint(64, (1, 8))
        >>> before = model(ids).logits
        >>> torch.allclose(rotary.hf.patch(model)(ids).logits, before, atol=1e-6)
        True
        >>> rotary.hf.unpatch(model)(ids).logits.equal(before)
        True
    """
    family = _family(model)
    hf_module = importlib.import_module(family.module)
    originals = {name: getattr(hf_module, name) for name in family.replacements}
    if is_patched(model):
        return model
    patched = 0
    for sub in model.modules():
        forward = getattr(type(sub), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is None:
            continue
        # the names this forward calls and that are the family's functions (not a namesake of another family)
        names = [n for n in family.replacements if n in code.co_names and forward.__globals__.get(n) is originals[n]]
        if not names:
            continue
        namespace = dict(forward.__globals__)
        namespace.update({n: family.replacements[n] for n in names})
        replacement = types.FunctionType(code, namespace, forward.__name__, forward.__defaults__, forward.__closure__)
        replacement.__kwdefaults__ = forward.__kwdefaults__
        replacement.__qualname__, replacement.__doc__ = forward.__qualname__, forward.__doc__
        sub.__dict__[_MARK] = sub.__dict__.get("forward")
        sub.forward = types.MethodType(replacement, sub)
        patched += 1
    if not patched:
        raise RuntimeError(
            f"found no module in this {type(model).__name__} whose forward calls {family.module}."
            f"{' or '.join(family.replacements)}; this transformers version ({_transformers_version()}) is not "
            "compatible with rotary.hf.patch"
        )
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: every patched module gets back exactly the ``forward`` it had.

    Raises:
        ValueError: if ``model`` is not patched.
        TypeError: ``model`` is not an ``nn.Module``.
    """
    _check_module(model, "unpatch")
    subs = [m for m in model.modules() if hasattr(m, _MARK)]
    if not subs:
        raise ValueError(f"this {type(model).__name__} is not patched; nothing to undo")
    for sub in subs:
        previous = sub.__dict__.pop(_MARK)
        del sub.__dict__["forward"]
        if previous is not None:
            sub.forward = previous
    return model


def _transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except ImportError:  # pragma: no cover
        return "not installed"

