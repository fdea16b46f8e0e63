"""Run a loaded Hugging Face transformers model's rotary application through ``rotary.apply_rotary``.

``patch(model)`` changes *that model only*. Each supported transformers family rotates q and k by
calling a module-level function (``apply_rotary_pos_emb``) from its attention module's ``forward``.
For every attention module of the model, ``patch`` gives the module its own copy of the class's
``forward``: the same code object, run with a copy of the modeling module's globals in which that
one name is bound to rotary's implementation. Nothing in transformers (files, classes, module
globals) is modified, so other models in the process, even of the same class, are unaffected;
``unpatch(model)`` removes the per-instance ``forward`` and the class method is used again, exactly
as before.

Tables are left to the model: the cos/sin its rotary-embedding module produces are applied by
rotary (which computes in fp32 and dispatches to the fused kernel when one is available), so the
logits equal the unpatched model's up to fp32 rounding.

Caveat: the patched ``forward`` sees the modeling module's globals as they were when ``patch`` ran
(anything monkey-patched into transformers later is not seen until ``unpatch``/``patch`` again).
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .apply import rotate
from .tables import RotaryTables

__all__ = ["SUPPORTED", "is_patched", "patch", "unpatch"]

#: ``unsqueeze_dim`` of transformers' ``apply_rotary_pos_emb`` -> rotary layout
_LAYOUT = {1: "bhsd", 2: "bshd"}


def _layout(unsqueeze_dim: int) -> str:
    try:
        return _LAYOUT[unsqueeze_dim]
    except KeyError:
        raise ValueError(f"unsqueeze_dim must be 1 ([B, H, S, D]) or 2 ([B, S, H, D]), got {unsqueeze_dim!r}") from None


def _apply_pair(q, k, cos, sin, *, interleaved: bool, layout: str):
    """q and k rotated in one kernel call (transformers passes [B, S, r] or [S, r] tables)."""
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


def _apply_gptj(tensor, sin, cos):
    """GPT-J: ``tensor [B, S, H, r]``, one angle per pair ``sin/cos [B, S, r/2]``, pairs (2i, 2i+1)."""
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    tables = RotaryTables.from_tensors(cos, sin, interleaved=True, validate=False)
    return rotate([tensor], tables, layout="bshd", names=("tensor",))[0]


@dataclass(frozen=True)
class _Family:
    module: str  # transformers modeling module
    function: str  # the global name its attention forward calls
    replacement: Callable


_HALF = "apply_rotary_pos_emb"
#: transformers ``model_type`` -> where its rotary application lives and what replaces it
SUPPORTED: dict[str, _Family] = {
    "llama": _Family("transformers.models.llama.modeling_llama", _HALF, _apply_half),
    "mistral": _Family("transformers.models.mistral.modeling_mistral", _HALF, _apply_half),
    "qwen2": _Family("transformers.models.qwen2.modeling_qwen2", _HALF, _apply_half),
    "qwen3": _Family("transformers.models.qwen3.modeling_qwen3", _HALF, _apply_half),
    "phi3": _Family("transformers.models.phi3.modeling_phi3", _HALF, _apply_half),
    "gpt_neox": _Family("transformers.models.gpt_neox.modeling_gpt_neox", _HALF, _apply_half),
    "gptj": _Family("transformers.models.gptj.modeling_gptj", _HALF, _apply_gptj),
    "cohere": _Family("transformers.models.cohere.modeling_cohere", _HALF, _apply_interleaved),
    "glm": _Family("transformers.models.glm.modeling_glm", _HALF, _apply_glm),
    # multimodal RoPE: the text attention gets M-RoPE tables already laid out per slot, pairs (i, i + r/2);
    # the vision towers rotate through another function (apply_rotary_pos_emb_vision), left as they are
    **{
        model_type: _Family(f"transformers.models.{name}.modeling_{name}", _HALF, _apply_half)
        for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
        for model_type in (name, f"{name}_text")
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


def is_patched(model: nn.Module) -> bool:
    """True if :func:`patch` has been applied to ``model`` (and not undone)."""
    return any(hasattr(m, _MARK) for m in model.modules())


def patch(model: nn.Module) -> nn.Module:
    """Route the rotary application of a transformers ``model`` through :func:`rotary.apply_rotary`.

    Only this model changes (see the module docstring); calling ``patch`` twice is harmless.

    Args:
        model: a transformers Llama, Mistral, Qwen2, Qwen3, Phi-3, GPT-NeoX, GPT-J, Cohere or GLM
            model (any head), or a Qwen2-VL, Qwen2.5-VL or Qwen3-VL model (its text attention).

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
    original = getattr(hf_module, family.function)
    if is_patched(model):
        return model
    patched = 0
    for sub in model.modules():
        forward = getattr(type(sub), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is None or family.function not in code.co_names:
            continue
        if forward.__globals__.get(family.function) is not original:
            continue  # a forward of another family, or calling a different function of that name
        namespace = dict(forward.__globals__)
        namespace[family.function] = family.replacement
        replacement = types.FunctionType(code, namespace, forward.__name__, forward.__defaults__, forward.__closure__)
        replacement.__kwdefaults__ = forward.__kwdefaults__
        replacement.__qualname__, replacement.__doc__ = forward.__qualname__, forward.__doc__
        sub.__dict__[_MARK] = sub.__dict__.get("forward")
        sub.forward = types.MethodType(replacement, sub)
        patched += 1
    if not patched:
        raise RuntimeError(
            f"found no module in this {type(model).__name__} whose forward calls {family.module}.{family.function}; "
            f"this transformers version ({_transformers_version()}) is not compatible with rotary.hf.patch"
        )
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: every patched module gets back exactly the ``forward`` it had.

    Raises:
        ValueError: if ``model`` is not patched.
    """
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

