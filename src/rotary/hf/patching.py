"""Run a loaded Hugging Face transformers model's rotary application through ``rotary.apply_rotary``.

``patch(model)`` gives each attention module of *that model* its own ``forward``: the class's code object, run
with a copy of the modeling module's globals in which ``apply_rotary_pos_emb`` (and its relatives) are bound to
rotary's. Nothing in transformers is modified; ``unpatch(model)`` removes the instance ``forward``. The model's
own tables are applied, so outputs are transformers' channel for channel. QK-norm families fuse ``q_norm`` /
``k_norm`` and the rotation into one :func:`rotary.rmsnorm_rotate` call. The design, the pairings per family and
the cases that fall back: docs/attention.md, "rotary.hf.patch(model)". The vision towers' replacements live in
:mod:`rotary.hf.patching_vision`.
"""

from __future__ import annotations

import importlib
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import plans
from .. import rotation as R
from ..errors import InputError, InputTypeError
from ..kernels.eager import rotate_torch
from ..pairing import to_half
from ..plans import GENERAL, PlanCache
from ..qk_norm import rmsnorm_rotate
from ..rotation import rotate
from ..tables import RotaryTables

__all__ = ["SUPPORTED", "is_patched", "patch", "unpatch"]

#: ``unsqueeze_dim`` of transformers' ``apply_rotary_pos_emb`` -> rotary layout
_LAYOUT = {1: "bhsd", 2: "bshd"}


def unsqueeze_layout(unsqueeze_dim: int) -> str:
    try:
        return _LAYOUT[unsqueeze_dim]
    except KeyError:
        raise InputError(f"unsqueeze_dim must be 1 ([B, H, S, D]) or 2 ([B, S, H, D]), got {unsqueeze_dim!r}") from None


def apply_pair(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool, layout: str
):
    """q and k rotated in one kernel call (tables ``[B, S, r]`` or ``[S, r]``); plain torch operations under tracing."""
    if torch.compiler.is_compiling():
        if cos.dim() == 2:  # [S, r]: one row per position, shared by the batch
            cos, sin = cos[None], sin[None]
        axis = 1 if layout == "bhsd" else 2
        cos, sin = cos.unsqueeze(axis), sin.unsqueeze(axis)
        return tuple(rotate_torch(x, cos, sin, interleaved=interleaved, inplace=False) for x in (q, k))
    key = None
    if type(q) is type(k) is type(cos) is type(sin) is torch.Tensor and plans.plannable():
        # one plan per signature of the layer's call (rotary.plans): every layer of a step shares it
        key = (layout, interleaved, q.shape, k.shape, cos.shape)
        recorded = _PAIR_PLANS.get(key)
        if recorded is not None and recorded.backend == "cpu":
            out = R.run_plan(recorded, (q, k), cos, sin, None, None)
            if out:  # (empty: another signature under this key; the general path below records it)
                return out[0], out[1]
    # the model's own tables, trusted as they are (no check on every layer of every step)
    tables = RotaryTables.from_tensors(cos, sin, interleaved=interleaved, validate=False)
    q, k = rotate([q, k], tables, layout=layout, kinds=("q", "k"), names=("q", "k"))
    if key is not None:  # rotate's decision (and signature) for these tables, when they are the model's own
        decided = R.recorded_plan()
        _PAIR_PLANS.put(key, decided if decided is not None and tables.cos is cos else GENERAL)
    return q, k


#: the plans of :func:`apply_pair`, by the signature of a layer's call
_PAIR_PLANS = PlanCache()


def apply_half(q, k, cos, sin, unsqueeze_dim=1):
    """Llama family: pairs (i, i + r/2); ``r = cos.shape[-1]`` may be < head_dim (GPT-NeoX, Phi-3)."""
    return apply_pair(q, k, cos, sin, interleaved=False, layout=unsqueeze_layout(unsqueeze_dim))


def _apply_interleaved(q, k, cos, sin, unsqueeze_dim=1):
    """Cohere: pairs (2i, 2i+1); its tables already repeat each angle twice in a row."""
    return apply_pair(q, k, cos, sin, interleaved=True, layout=unsqueeze_layout(unsqueeze_dim))


def _apply_glm(q, k, cos, sin, unsqueeze_dim=1):
    """GLM: tables come in the half layout ``[θ, θ]``; rotation pairs (2i, 2i+1) of the first r channels."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)
    return _apply_interleaved(q, k, cos, sin, unsqueeze_dim)


def _apply_gpt_oss(q, k, cos, sin, unsqueeze_dim=1):
    """gpt-oss: one angle per pair, ``cos/sin [B, S, D/2]``; pairs (i, i + D/2) of the whole head."""
    return apply_half(q, k, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1), unsqueeze_dim)


def _apply_deepseek_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """DeepSeek-V3's ``rope_interleave``: :func:`rotary.to_half`, then the half rotation, as transformers returns it."""
    return apply_half(to_half(q), to_half(k), cos, sin, unsqueeze_dim)


def _apply_one(x, cos, sin, unsqueeze_dim=1):
    """Gemma 3n / Gemma 4 / DiffusionGemma: q or k alone, pairs (i, i + r/2); ``x [N, H, D]`` is one row of N tokens."""
    if x.dim() == 3 and cos.dim() == 2 and unsqueeze_dim == 1:
        return _apply_one(x[None], cos[None], sin[None], 2)[0]
    tables = RotaryTables.from_tensors(cos, sin, interleaved=False, validate=False)
    return rotate([x], tables, layout=unsqueeze_layout(unsqueeze_dim))[0]


def _apply_half_or_one(q, k=None, cos=None, sin=None, unsqueeze_dim=1):
    """Qwen4-exp: q and k, or q alone (``k=None``), pairs (i, i + r/2) of the first ``r = cos.shape[-1]``."""
    return _apply_one(q, cos, sin, unsqueeze_dim) if k is None else apply_half(q, k, cos, sin, unsqueeze_dim)


def _apply_trailing(x, cos, sin, unsqueeze_dim=1):
    """DeepSeek-V4: one tensor, ``cos/sin [B, S, r/2]``, pairs (2i, 2i+1) of the *last* r channels; the others pass."""
    r = 2 * cos.shape[-1]
    tables = RotaryTables.from_tensors(
        cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1), interleaved=True, validate=False
    )
    if r == x.shape[-1]:
        return rotate([x], tables, layout=unsqueeze_layout(unsqueeze_dim))[0]
    return torch.cat([x[..., :-r], rotate([x[..., -r:]], tables, layout=unsqueeze_layout(unsqueeze_dim))[0]], dim=-1)


def complex_tables(freqs: torch.Tensor) -> RotaryTables:
    """Tables of pairs (2i, 2i+1) from transformers' complex ``e^{iθ}`` (times any attention scaling)."""
    cos, sin = freqs.real.repeat_interleave(2, dim=-1), freqs.imag.repeat_interleave(2, dim=-1)
    return RotaryTables.from_tensors(cos, sin, interleaved=True, validate=False)


def apply_llama4_text(xq, xk, freqs_cis):
    """Llama 4's text attention: ``xq, xk [B, S, H, D]``, complex ``freqs_cis [B, S, D/2]``, pairs (2i, 2i+1)."""
    q, k = rotate([xq, xk], complex_tables(freqs_cis), layout="bshd", kinds=("q", "k"), names=("xq", "xk"))
    return q, k


def _apply_gptj(tensor, sin, cos):
    """GPT-J: ``tensor [B, S, H, r]``, one angle per pair ``sin/cos [B, S, r/2]``, pairs (2i, 2i+1)."""
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    tables = RotaryTables.from_tensors(cos, sin, interleaved=True, validate=False)
    return rotate([tensor], tables, layout="bshd", names=("tensor",))[0]


@dataclass(frozen=True)
class _QKNorm:
    """The per-head norm a QK-norm family applies to q and k before ``apply_rotary_pos_emb``."""

    norm_class: str  # its RMSNorm class in the modeling module
    style: str  # rotary.rmsnorm_rotate's weight convention
    eps: str  # the attribute holding eps


@dataclass(frozen=True)
class Family:
    module: str  # transformers modeling module
    replacements: Mapping[str, Callable]  # the global names its attention forward calls -> rotary's versions
    qk_norm: _QKNorm | None = None  # QK-norm then RoPE: fused into rotary.rmsnorm_rotate


_HALF = {"apply_rotary_pos_emb": apply_half}


def _half(module: str) -> Family:
    return Family(f"transformers.models.{module}.modeling_{module}", _HALF)


#: transformers ``model_type`` -> where its rotary application lives and what replaces it
SUPPORTED: dict[str, Family] = {
    "llama": _half("llama"),
    "mistral": _half("mistral"),
    "mixtral": _half("mixtral"),
    "qwen2": _half("qwen2"),
    "qwen3": Family(
        "transformers.models.qwen3.modeling_qwen3", _HALF, _QKNorm("Qwen3RMSNorm", "qwen3", "variance_epsilon")
    ),
    "qwen3_moe": Family(
        "transformers.models.qwen3_moe.modeling_qwen3_moe",
        _HALF,
        _QKNorm("Qwen3MoeRMSNorm", "qwen3", "variance_epsilon"),
    ),
    "phi3": _half("phi3"),
    # Gemma3ForConditionalGeneration: its language model; both layer types: each layer gets the tables of its type
    **{
        model_type: Family(
            "transformers.models.gemma3.modeling_gemma3", _HALF, _QKNorm("Gemma3RMSNorm", "gemma3", "eps")
        )
        for model_type in ("gemma3", "gemma3_text")
    },
    "gpt_neox": _half("gpt_neox"),
    "gpt_oss": Family("transformers.models.gpt_oss.modeling_gpt_oss", {"apply_rotary_pos_emb": _apply_gpt_oss}),
    "deepseek_v3": Family(
        "transformers.models.deepseek_v3.modeling_deepseek_v3",
        {"apply_rotary_pos_emb": apply_half, "apply_rotary_pos_emb_interleave": _apply_deepseek_interleave},
    ),
    "gptj": Family("transformers.models.gptj.modeling_gptj", {"apply_rotary_pos_emb": _apply_gptj}),
    "cohere": Family("transformers.models.cohere.modeling_cohere", {"apply_rotary_pos_emb": _apply_interleaved}),
    "glm": Family("transformers.models.glm.modeling_glm", {"apply_rotary_pos_emb": _apply_glm}),
    # multimodal RoPE: the text attention gets M-RoPE tables already laid out per slot, pairs (i, i + r/2);
    # the vision towers' apply_rotary_pos_emb_vision is added below (_VISION_TOWERS)
    **{
        model_type: _half(name)
        for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
        for model_type in (name, f"{name}_text")
    },
    # the other vision-language models (rotary.hf.MROPE_MODELS): the model's own M-RoPE tables, rotated by
    # rotary; pairs (i, i + r/2), or (2i, 2i+1) for GLM-4V, GLM-OCR and ERNIE-4.5-VL (tables already repeat
    # each angle twice); the Omni thinkers and Qwen2.5-Omni's talker, not the whole Omni model (its speech
    # generator has other attention). HunYuan-VL is left out: transformers 5.23's XD-RoPE tables give the two
    # channels of a pair different angles, which no rotation (and no rotary kernel) reproduces.
    **{
        model_type: _half(name)
        for name in ("qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "paddleocr_vl", "glm4v_moe", "glm_image", "cosmos3_edge")
        for model_type in (name, f"{name}_text")
    },
    **dict.fromkeys(("qwen2_5_omni_thinker", "qwen2_5_omni_text", "qwen2_5_omni_talker"), _half("qwen2_5_omni")),
    **dict.fromkeys(("qwen3_omni_moe_thinker", "qwen3_omni_moe_text"), _half("qwen3_omni_moe")),
    **{
        model_type: Family(f"transformers.models.{name}.modeling_{name}", {"apply_rotary_pos_emb": _apply_interleaved})
        for name in ("glm4v", "glm_ocr", "ernie4_5_vl_moe")
        for model_type in (name, f"{name}_text")
    },
    # text families whose apply_rotary_pos_emb and rotate_half are Llama's, line for line (tests/test_hf_patch_text.py
    # checks that and the outputs): Llama's replacement fits them as it is
    **{
        model_type: _half(module)
        for model_type, module in {
            "chameleon": "chameleon",
            "csm": "csm",
            "dbrx": "dbrx",
            "deepseek_ocr2_text": "deepseek_ocr2",
            "dia": "dia",
            "embedding_gemma2_text": "embedding_gemma2",
            "gradium_phonon_tts": "gradium_phonon_tts",
            "granitemoehybrid": "granitemoehybrid",
            "idefics": "idefics",
            "jetmoe": "jetmoe",
            "kyutai_speech_to_text": "kyutai_speech_to_text",
            "lfm2_moe": "lfm2_moe",
            "pocket_tts": "pocket_tts",
            "t5gemma": "t5gemma",
            "voxtral_realtime_text": "voxtral_realtime",
            "zamba2": "zamba2",
            # the same with partial rotation (the first r = cos.shape[-1] channels) or computed in fp32
            "bamba": "bamba",
            "esm": "esm",
            "evolla": "evolla",
            "phi4_multimodal": "phi4_multimodal",
            "zaya": "zaya",
        }.items()
    },
    "step3p5": Family("transformers.models.step3p7.modeling_step3p7", _HALF),  # the text model of Step3p7
    # one tensor per call (q, then k), pairs (i, i + r/2)
    **{
        model_type: Family(f"transformers.models.{name}.modeling_{name}", {"apply_rotary_pos_emb": _apply_one})
        for model_type, name in (
            ("gemma3n_text", "gemma3n"),
            ("gemma4_text", "gemma4"),
            ("diffusion_gemma_text", "diffusion_gemma"),
        )
    },
    "qwen4_exp_text": Family(
        "transformers.models.qwen4_exp.modeling_qwen4_exp", {"apply_rotary_pos_emb": _apply_half_or_one}
    ),
    # pairs (2i, 2i+1) of the first r channels, from [θ, θ] tables: GLM's form
    "moonshine": Family("transformers.models.moonshine.modeling_moonshine", {"apply_rotary_pos_emb": _apply_glm}),
    "deepseek_v4": Family(
        "transformers.models.deepseek_v4.modeling_deepseek_v4", {"apply_rotary_pos_emb": _apply_trailing}
    ),
    # DeepSeek-V3's interleaved form: pairs (2i, 2i+1) returned de-interleaved
    "longcat_flash": Family(
        "transformers.models.longcat_flash.modeling_longcat_flash",
        {"apply_rotary_pos_emb_interleave": _apply_deepseek_interleave},
    ),
}


_MARK = "_rotary_hf_patch"  # on a patched submodule: the instance ``forward`` it had before (or None)
_NORM_MARK = "_rotary_hf_patch_norm"  # the same, on the q_norm / k_norm of a fused QK-norm attention
_FUSED = "_rotary_hf_qk_norm"  # on a fused QK-norm attention: (its forward's code with rotary's globals, _QKNorm)


def _deferred_norm(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """A patched ``q_norm``/``k_norm`` forward: in its attention's forward, the input as is; elsewhere, the norm."""
    running = getattr(_RUNNING, "attention", None)
    if running is None or not (running[0].q_norm is self or running[0].k_norm is self):
        return _own_norm(self, hidden_states)
    if self._forward_hooks or _GLOBAL_FORWARD_HOOKS:  # a hook must see, and may change, the normalised output
        running[2].append(self)  # normalised here: the attention's apply_rotary_pos_emb only rotates
        return _own_norm(self, hidden_states)
    return hidden_states


def _own_norm(norm: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """What the norm's ``forward`` before :func:`patch` returns (a plain call of the class's function, for dynamo)."""
    previous = norm.__dict__.get(_NORM_MARK)
    return previous(hidden_states) if previous is not None else type(norm).forward(norm, hidden_states)


def _norm_and_rotate(q, k, cos, sin, unsqueeze_dim=1):
    """``apply_rotary_pos_emb`` of a patched QK-norm attention: its deferred norms and the rotation in one call."""
    attention, spec, normalised = _RUNNING.attention
    q_norm, k_norm = attention.q_norm, attention.k_norm
    layout = unsqueeze_layout(unsqueeze_dim)
    if normalised:  # a norm with forward hooks normalised its input already (_deferred_norm)
        q = q if any(n is q_norm for n in normalised) else _own_norm(q_norm, q)
        k = k if any(n is k_norm for n in normalised) else _own_norm(k_norm, k)
        return apply_pair(q, k, cos, sin, interleaved=False, layout=layout)
    # traced (Hugging Face's compiled static-cache generation), the norms' own forward and the rotation run
    # as plain torch operations (below), which Inductor fuses with the projections around them; the opaque
    # fused op split them and measured slower (docs/benchmarks.md, "QK-norm generation")
    if not torch.compiler.is_compiling():
        eps = getattr(q_norm, spec.eps)
        fits = all(
            w.dtype == x.dtype or (spec.style == "gemma3" and w.dtype == torch.float32)
            for w, x in ((q_norm.weight, q), (k_norm.weight, k))
        )
        if fits and getattr(k_norm, spec.eps) == eps:
            # the model's own tables, trusted and in their own dtype: on CUDA the kernel widens them as it
            # loads them (no fp32 copies per layer), elsewhere they are widened first
            tables = RotaryTables.unchecked(cos, sin, False)
            return rmsnorm_rotate(q, k, q_norm.weight, k_norm.weight, tables, eps=eps, style=spec.style, layout=layout)  # type: ignore[arg-type]
    return apply_pair(_own_norm(q_norm, q), _own_norm(k_norm, k), cos, sin, interleaved=False, layout=layout)


#: forward hooks registered for every module (``torch.nn.modules.module.register_module_forward_hook``)
_GLOBAL_FORWARD_HOOKS = getattr(torch.nn.modules.module, "_global_forward_hooks", {})

#: per thread, the patched QK-norm attention module whose forward is running, and its family's norm
_RUNNING = threading.local()


def _fused_attention_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The instance ``forward`` of a patched QK-norm attention (its norms found in :data:`_RUNNING`, thread-local)."""
    function, spec = self.__dict__[_FUSED]
    outer = getattr(_RUNNING, "attention", None)
    _RUNNING.attention = (self, spec, [])  # the list: norms that ran their own forward (for their hooks)
    try:
        return function(self, *args, **kwargs)
    finally:
        _RUNNING.attention = outer


def _function(forward: Any, namespace: dict[str, Any]) -> types.FunctionType:
    """``forward``'s code with ``namespace`` as its globals."""
    replacement = types.FunctionType(
        forward.__code__, namespace, forward.__name__, forward.__defaults__, forward.__closure__
    )
    replacement.__kwdefaults__ = forward.__kwdefaults__
    replacement.__qualname__, replacement.__doc__ = forward.__qualname__, forward.__doc__
    return replacement


def _fusable_norms(sub: nn.Module, family: Family, hf_module: types.ModuleType, names: list[str]) -> bool:
    """Whether ``sub`` normalises q and k with its family's per-head norms before ``apply_rotary_pos_emb``."""
    spec = family.qk_norm
    if spec is None or "apply_rotary_pos_emb" not in names:
        return False
    code = type(sub).forward.__code__
    norm_class = getattr(hf_module, spec.norm_class, None)
    norms = [getattr(sub, name, None) for name in ("q_norm", "k_norm")]
    return (
        norm_class is not None
        and all(name in code.co_names for name in ("q_norm", "k_norm"))
        and all(isinstance(n, nn.Module) and type(n).forward is norm_class.forward for n in norms)
        and all(
            getattr(n, "weight", None) is not None and tuple(n.weight.shape) == (getattr(sub, "head_dim", None),)
            for n in norms
        )
    )


def _family(model: nn.Module) -> Family:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model, nn.Module) or model_type is None:
        raise InputTypeError(
            f"patch expects a transformers model (an nn.Module with config.model_type), got {type(model).__name__}"
        )
    if model_type not in SUPPORTED:
        raise InputError(
            f"rotary.hf.patch does not support model_type {model_type!r}; supported: {', '.join(sorted(SUPPORTED))}"
        )
    return SUPPORTED[model_type]


def _check_module(model: object, call: str) -> None:
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"{call} expects a transformers model (an nn.Module), got {type(model).__name__}")


def is_patched(model: nn.Module) -> bool:
    """True if :func:`patch` has been applied to ``model`` and not undone (InputTypeError: not an ``nn.Module``)."""
    _check_module(model, "is_patched")
    return any(_MARK in m.__dict__ or _NORM_MARK in m.__dict__ for m in model.modules())


def patch(model: nn.Module) -> nn.Module:
    """Route the rotary application of a transformers ``model`` through :func:`rotary.apply_rotary` (see the module).

    ``model``: of a type in :data:`SUPPORTED` (any head): the text families, the text attention of the
    multimodal-RoPE vision-language models, the vision towers, alone or in their model. Only this model changes;
    patching twice is harmless; an instance ``forward`` set by someone else (an accelerate hook) is put aside and
    restored by :func:`unpatch`. Returns ``model``.

    Raises:
        rotary.errors.InputError: unsupported ``model_type`` (the message lists the supported ones).
        RuntimeError: no attention module calls the expected function (an incompatible transformers).

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
        sub.__dict__[_MARK] = sub.__dict__.get("forward")
        if _fusable_norms(sub, family, hf_module, names):
            namespace["apply_rotary_pos_emb"] = _norm_and_rotate
            sub.__dict__[_FUSED] = (_function(forward, namespace), family.qk_norm)
            sub.forward = types.MethodType(_fused_attention_forward, sub)
            for norm in (sub.q_norm, sub.k_norm):
                norm.__dict__[_NORM_MARK] = norm.__dict__.get("forward")
                norm.forward = types.MethodType(_deferred_norm, norm)
        else:
            sub.forward = types.MethodType(_function(forward, namespace), sub)
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

    Raises ``rotary.errors.InputError`` if ``model`` is not patched, InputTypeError if it is not an ``nn.Module``.
    """
    _check_module(model, "unpatch")
    subs = [m for m in model.modules() if _MARK in m.__dict__ or _NORM_MARK in m.__dict__]
    if not subs:
        raise InputError(f"this {type(model).__name__} is not patched; nothing to undo")
    for sub in subs:
        previous = sub.__dict__.pop(_MARK if _MARK in sub.__dict__ else _NORM_MARK)
        sub.__dict__.pop(_FUSED, None)
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
