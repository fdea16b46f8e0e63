"""The types that scale every pair by one rule: ``default``, ``linear`` (position interpolation) and
NTK-aware scaling of the base, static (``ntk``, and HunYuan's ``ntk_alpha``) and following the
sequence length (``dynamic``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .registry import (
    ConfigError,
    RopeExample,
    check_factor,
    default_inv_freq,
    optional_number,
    register_rope_type,
)


def _check_ntk_width(rope_type: str, rotary_dim: int) -> None:
    if rotary_dim <= 2:
        raise ConfigError(
            f"rope_type {rope_type!r} scales the base by factor ** (d / (d - 2)), undefined for "
            f"rotary_dim={rotary_dim}; use rotary_dim >= 4"
        )


# no keys of its own: a factor, mrope_sections, ... in a default block is named (the user may believe it scales)
@register_rope_type("default", check_keys=True)
def _default(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    return default_inv_freq(base, rotary_dim), 1.0


def _check_linear(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    check_factor(p, "linear", complain)


@register_rope_type(
    "linear",
    required={"factor"},
    check=_check_linear,
    example=lambda d: RopeExample({"rope_type": "linear", "factor": 4.0}),
)
def _linear(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # Position interpolation (Chen et al. 2023): position m becomes m / factor; dividing inv_freq instead
    # gives the same angles and keeps positions integer.
    return default_inv_freq(base, rotary_dim) / params["factor"], 1.0


def _ntk_base(base: Any, alpha: Any, rotary_dim: int) -> Any:
    # NTK-aware scaling: raising the base by alpha ** (d / (d - 2)) divides the lowest frequency by
    # exactly alpha and leaves the highest (pair 0) untouched.
    return base * alpha ** (rotary_dim / (rotary_dim - 2))


def _check_ntk(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    check_factor(p, "ntk", complain)
    _check_ntk_width("ntk", rotary_dim)
    try:
        grown = p["factor"] ** (rotary_dim / (rotary_dim - 2))
    except OverflowError:
        grown = math.inf
    if not math.isfinite(grown):
        raise ConfigError(
            f"factor={p['factor']} for rope_type 'ntk' overflows the base (base * factor ** (d / (d - 2))): the "
            "frequencies become 0 and nothing rotates; use a factor below 1e100 (real models use 2 to 64)"
        )


@register_rope_type(
    "ntk", required={"factor"}, check=_check_ntk, example=lambda d: RopeExample({"rope_type": "ntk", "factor": 4.0})
)
def _ntk(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    return default_inv_freq(_ntk_base(base, params["factor"], rotary_dim), rotary_dim), 1.0


def _check_dynamic(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    check_factor(p, "dynamic", complain)
    _check_ntk_width("dynamic", rotary_dim)
    # alpha = factor * length / trained - (factor - 1) is 1 at the trained length only while factor - 1 is
    # exact; transformers' module computes it in float32 (a tensor length), where that holds up to 2**24
    if p["factor"] > 2**24:
        raise ConfigError(
            f"factor={p['factor']} for rope_type 'dynamic' is too large: factor * length / max_position_embeddings "
            "- (factor - 1) loses its + 1 to float32 rounding (the base collapses to 0 or inf); use a factor "
            "<= 2**24 (real models use 2 to 64)"
        )


@register_rope_type(
    "dynamic",
    required={"factor", "max_position_embeddings"},
    check=_check_dynamic,
    length_dependent=True,
    example=lambda d: RopeExample(
        {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 4096}, seq_len=16384
    ),
    target_length=lambda p: max(math.ceil(p["factor"] * p["max_position_embeddings"]), p["max_position_embeddings"]),
)
def _dynamic(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # Dynamic NTK: alpha grows with the current length, factor * L / L_train - (factor - 1), and is 1 up to
    # L_train. transformers' module passes seq_len as a 0-dim int64 tensor (max(position_ids) + 1), which
    # makes the base an fp32 tensor; a Python int keeps it in float64. Both are reproduced bit for bit.
    trained = params["max_position_embeddings"]
    factor = params["factor"]
    if seq_len is None:
        seq_len = trained
    elif isinstance(seq_len, torch.Tensor):
        seq_len = torch.maximum(seq_len, torch.tensor(trained, dtype=seq_len.dtype, device=seq_len.device))
    else:
        seq_len = max(seq_len, trained)
    alpha = (factor * seq_len / trained) - (factor - 1)
    return default_inv_freq(_ntk_base(base, alpha, rotary_dim), rotary_dim), 1.0


def _check_ntk_alpha(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_ntk_width("ntk_alpha", rotary_dim)
    alpha = optional_number(p, "alpha", "ntk_alpha", allowed="> 0, the base grows by alpha ** (d / (d - 2))")
    if alpha is None or alpha <= 0:
        raise ConfigError(
            f"alpha of rope_type 'ntk_alpha' must be a number > 0 (the base grows by alpha ** (d / (d - 2)); "
            f"HunYuan uses 1000), got {p.get('alpha')!r}"
        )
    if alpha < 1:
        complain(f"alpha={alpha} < 1 for rope_type 'ntk_alpha' shrinks the base (and the context); use alpha >= 1")
    try:
        grown = alpha ** (rotary_dim / (rotary_dim - 2))
    except OverflowError:
        grown = math.inf
    if not math.isfinite(grown):
        raise ConfigError(
            f"alpha={alpha} for rope_type 'ntk_alpha' overflows the base (base * alpha ** (d / (d - 2))): the "
            "frequencies become 0 and nothing rotates; use an alpha below 1e100 (HunYuan uses 1000)"
        )
    factor = p.get("factor")
    if factor is not None and factor != 1:
        # transformers' HunYuan modules and vLLM's DynamicNTKAlphaRotaryEmbedding read alpha alone
        complain(
            f"factor={factor!r} next to alpha={alpha} is ignored: with alpha set, transformers' HunYuan models and "
            "vLLM compute static frequencies from alpha alone; remove factor (or set it to 1)"
        )


@register_rope_type(
    "ntk_alpha",
    required={"alpha"},
    optional={"factor", "max_position_embeddings"},
    check=_check_ntk_alpha,
    example=lambda d: RopeExample({"rope_type": "ntk_alpha", "alpha": 1000.0}),
)
def _ntk_alpha(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # HunYuan's "dynamic NTK with alpha": a fixed alpha stretches the base once, base * alpha ** (d / (d - 2)),
    # so the frequencies do not depend on the length. HunYuan's checkpoints label the block "dynamic"; a
    # block of type "dynamic" with a truthy alpha is read as this type (see canonical_rope_type).
    return default_inv_freq(_ntk_base(base, params["alpha"], rotary_dim), rotary_dim), 1.0
