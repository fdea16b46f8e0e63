"""YaRN and LongRoPE: frequencies rescaled per pair from the trained context length, and an attention
factor; both take ``factor`` or the two context lengths it is the ratio of. LongRoPE's blocks may give
the attention factor of each set (``short_mscale``, ``long_mscale``: Phi-3.5-MoE);
:func:`longrope_serving_block` gives the one set vLLM serves a LongRoPE block with."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._checks import is_number
from .registry import ConfigError, RopeExample, check_factor, optional_number, register_rope_type


def _check_factor_or_length(p: dict[str, Any], rope_type: str) -> None:
    if p.get("factor") is None and p.get("max_position_embeddings") is None:
        raise ConfigError(
            f"rope_type {rope_type!r} needs 'factor' or 'max_position_embeddings' (factor defaults to "
            "max_position_embeddings / original_max_position_embeddings); add one of them"
        )


def _implicit_factor(p: Mapping[str, Any]) -> float | None:
    """``max_position_embeddings / original_max_position_embeddings`` when both are usable lengths."""
    mpe, trained = p.get("max_position_embeddings"), p.get("original_max_position_embeddings")
    if is_number(mpe) and is_number(trained) and mpe > 0 and trained > 0:
        return mpe / trained
    return None


def _check_attention_factor(p: dict[str, Any], rope_type: str) -> None:
    att = optional_number(p, "attention_factor", rope_type, allowed="> 0, multiplied into cos and sin")
    if att is not None and att <= 0:
        raise ConfigError(
            f"attention_factor={att} for rope_type {rope_type!r} must be > 0 (it multiplies cos and sin; 0 erases "
            "q and k, a negative value flips them); remove it to use the default"
        )


def _check_bool_key(p: Mapping[str, Any], key: str, rope_type: str) -> None:
    # a string "false" is truthy: nothing but a real bool can be read safely, even leniently
    if key in p and not isinstance(p[key], bool):
        raise ConfigError(
            f"{key} of rope_type {rope_type!r} must be true or false, got {p[key]!r} ({type(p[key]).__name__})"
        )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, eq. 22)
    if scale <= 1:
        return 1.0
    value = 0.1 * mscale * math.log(scale) + 1.0
    return math.inf if value == 0 else value  # a zero denominator in the DeepSeek ratio: reported by the check


def _yarn_pair_index(rotations: float, rotary_dim: int, base: float, trained: int) -> float:
    # The (fractional) pair index whose wavelength fits `rotations` times into the trained context.
    return (rotary_dim * math.log(trained / (rotations * 2 * math.pi))) / (2 * math.log(base))


def _check_yarn(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    check_factor(p, "yarn", complain, nullable=True)
    _check_attention_factor(p, "yarn")
    _check_factor_or_length(p, "yarn")
    _check_bool_key(p, "truncate", "yarn")
    for key, default in (("beta_fast", 32), ("beta_slow", 1)):
        value = optional_number(
            p, key, "yarn", allowed=f"> 0, a number of turns over the trained context; default {default}"
        )
        if value is not None and value < 0:
            raise ConfigError(
                f"{key}={value} for rope_type 'yarn' must be > 0 (a number of turns over the trained context; YaRN's "
                f"default is {default}); a negative count has no ramp position"
            )
        if value == 0:
            complain(
                f"{key}=0 for rope_type 'yarn' is read as unset (the default {default}, as transformers does); "
                f"remove it or give a positive number"
            )
    # transformers reads a missing (or falsy) beta as its default: 32 / 1
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
    if beta_fast <= beta_slow:
        complain(
            f"beta_fast={beta_fast} must be greater than beta_slow={beta_slow} (YaRN's defaults are 32 and 1); "
            "swap or fix them"
        )
    factor = p.get("factor")
    implicit = _implicit_factor(p)
    if factor is None:
        factor = implicit
    elif implicit is not None and implicit != 1 and implicit != factor:
        # transformers 5.23 logs the same mismatch once and uses the explicit factor; it skips a ratio of 1
        # (max_position_embeddings left at the trained length, as in Qwen2.5's documented block)
        complain(
            f"rope_type 'yarn' factor={factor} disagrees with max_position_embeddings / "
            f"original_max_position_embeddings = {p['max_position_embeddings']} / "
            f"{p['original_max_position_embeddings']} = {implicit:g}; set factor to {implicit:g} or fix the "
            "lengths (transformers uses factor and warns)"
        )
    if factor is not None and factor <= 0:
        raise ConfigError(
            f"rope_type 'yarn' factor (max_position_embeddings / original_max_position_embeddings) must be "
            f"> 0, got {factor}"
        )
    mscale, mscale_all_dim = (
        optional_number(p, key, "yarn", allowed="> 0, DeepSeek uses 1.0 or 0.707")
        for key in ("mscale", "mscale_all_dim")
    )
    if p.get("attention_factor") is None and mscale and mscale_all_dim and factor is not None:
        attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        if not (math.isfinite(attention) and attention > 0):
            raise ConfigError(
                f"mscale={mscale} and mscale_all_dim={mscale_all_dim} with factor={factor} give the attention factor "
                f"(0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1) = {attention}, which must be a "
                "finite number > 0; use positive mscale values (DeepSeek uses 1.0 or 0.707)"
            )
    for key, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None and value <= 0:
            complain(
                f"{key}={value} for rope_type 'yarn' must be > 0 (DeepSeek uses 1.0 or 0.707); transformers reads 0 as "
                "unset (the attention factor then falls back to 0.1 ln(factor) + 1)"
            )


@register_rope_type(
    "yarn",
    required={"factor", "original_max_position_embeddings"},
    optional={
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
        "max_position_embeddings",
    },
    check=_check_yarn,
    trained_length=True,
    example=lambda d: RopeExample(
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
        max_position=16384,
    ),
)
def _yarn(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    trained = params["original_max_position_embeddings"]
    factor = params.get("factor")
    if factor is None:  # DeepSeek-style configs: the ratio of the two context lengths
        factor = params["max_position_embeddings"] / trained
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    # Pairs below `low` turn more than beta_fast times over the trained context: keep them (extrapolate).
    # Pairs above `high` turn less than beta_slow times: interpolate them by `factor`. A linear ramp between.
    low = _yarn_pair_index(beta_fast, rotary_dim, base, trained)
    high = _yarn_pair_index(beta_slow, rotary_dim, base, trained)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    keep = 1 - ramp

    # the operation order below is transformers' own, so inv_freq is bit-identical
    powers = base ** (torch.arange(0, rotary_dim, 2, device="cpu").to(dtype=torch.float) / rotary_dim)
    extrapolated = 1.0 / powers
    interpolated = 1.0 / (factor * powers)
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq, attention_factor


def _check_longrope(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    check_factor(p, "longrope", complain, nullable=True)
    _check_attention_factor(p, "longrope")
    _check_factor_or_length(p, "longrope")
    expected = (rotary_dim + 1) // 2
    for key in ("short_factor", "long_factor"):
        value = p[key]
        if not (isinstance(value, (list, tuple)) and all(is_number(x) for x in value)):
            raise ConfigError(f"{key} must be a list of {expected} numbers, got {value!r}")
        if len(value) != expected:  # not computable: an error even with strict=False
            raise ConfigError(
                f"{key} has {len(value)} entries but rotary_dim={rotary_dim} needs {expected} (one per pair); "
                "give one factor per rotated pair"
            )
        bad = [(i, x) for i, x in enumerate(value) if x <= 0]
        if bad:
            raise ConfigError(
                f"{key} entries divide the frequencies and must be > 0, got "
                f"{', '.join(f'{key}[{i}]={x}' for i, x in bad[:4])}{' ...' if len(bad) > 4 else ''}; fix the list "
                "(Phi-3's lie between 1 and about 64)"
            )
    for key in ("short_mscale", "long_mscale"):
        value = optional_number(p, key, "longrope", allowed="> 0, the attention factor of that set of factors")
        if value is not None and value <= 0:
            raise ConfigError(
                f"{key}={value} for rope_type 'longrope' must be > 0 (it multiplies cos and sin of that set of "
                "factors; Phi-3.5-MoE uses 1.243); remove it to use the default attention factor"
            )
    mscales = [k for k in ("short_mscale", "long_mscale") if p.get(k) is not None]
    if mscales and p.get("attention_factor") is not None:
        complain(
            f"rope_type 'longrope' sets both attention_factor={p['attention_factor']} and {' and '.join(mscales)}; the "
            f"{' and '.join(mscales)} win for their set (as in vLLM and transformers' PhiMoE); keep one"
        )
    factor = p.get("factor")
    if factor is None:
        factor = _implicit_factor(p)
    if factor is not None and factor <= 0:
        raise ConfigError(
            f"rope_type 'longrope' factor (max_position_embeddings / original_max_position_embeddings) must "
            f"be > 0, got {factor}"
        )
    trained = p.get("original_max_position_embeddings")
    if p.get("attention_factor") is None and factor is not None and factor > 1 and trained == 1:
        raise ConfigError(
            "rope_type 'longrope' with original_max_position_embeddings=1 has no attention factor: "
            "sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) divides by ln(1) = 0; give the trained "
            "context length (e.g. 4096) or an attention_factor"
        )


def _longrope_example(head_dim: int) -> RopeExample:
    # illustrative long_factor: 1 for the fast pairs rising to 4 for the slow ones (shape of Phi-3's)
    n = head_dim // 2
    long_factor = [1.0 + 3.0 * (i / max(n - 1, 1)) ** 2 for i in range(n)]
    block = {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "short_factor": [1.0] * n,
        "long_factor": long_factor,
    }
    return RopeExample(block, max_position=16384, seq_len=16384, note="illustrative long_factor")


@register_rope_type(
    "longrope",
    required={"short_factor", "long_factor", "original_max_position_embeddings"},
    optional={"factor", "attention_factor", "max_position_embeddings", "short_mscale", "long_mscale"},
    check=_check_longrope,
    length_dependent=True,
    update="switch",
    trained_length=True,
    example=_longrope_example,
    target_length=lambda p: p["original_max_position_embeddings"] + 1,  # the long factors
)
def _longrope(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    trained = params["original_max_position_embeddings"]
    factor = params.get("factor")
    if factor is None:  # Phi-3 states the two context lengths instead
        factor = params["max_position_embeddings"] / trained
    # one searched rescale factor per pair; the long set once the sequence outgrows the trained context
    use_long = bool(seq_len is not None and seq_len > trained)
    # short_mscale / long_mscale (Phi-3.5-MoE) give each set its own attention factor, as vLLM and the
    # checkpoint's own code apply them; otherwise one factor for both sets
    attention_factor = params.get("long_mscale" if use_long else "short_mscale")
    if attention_factor is None:
        attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(trained))
    rescale = torch.tensor(params["long_factor" if use_long else "short_factor"], dtype=torch.float32, device="cpu")
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    return 1.0 / (rescale * base**exponent), attention_factor


def longrope_serving_block(block: Mapping[str, Any], max_model_len: int) -> dict[str, Any]:
    """The LongRoPE block vLLM serves with: one set of factors for every call, chosen once per server.

    vLLM uses the long set at every position when ``max_model_len`` (``--max-model-len``) exceeds
    ``original_max_position_embeddings``, with attention factor ``sqrt(1 + ln(s) / ln(L))`` and the block's
    ``short_mscale`` / ``long_mscale`` (docs/scaling.md, "longrope"). ``block``: a ``longrope`` block with both
    factor lists and both lengths. Returns a new block whose two sets are vLLM's, its attention factor as both
    mscales, so :class:`rotary.RoPE` built from it rotates as vLLM does. Raises ``ConfigError`` for another block, a
    key missing or a bad ``max_model_len``.

    Example:
        >>> block = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
        ...          "original_max_position_embeddings": 4096, "max_position_embeddings": 131072}
        >>> served = longrope_serving_block(block, max_model_len=8192)
        >>> served["short_factor"], round(served["short_mscale"], 4)
        ([2.0, 2.0, 2.0, 2.0], 1.1902)
    """
    if not isinstance(block, Mapping):
        raise ConfigError(f"block must be a longrope block (a dict), got {block!r}")
    for key in ("short_factor", "long_factor", "original_max_position_embeddings", "max_position_embeddings"):
        if block.get(key) is None:
            raise ConfigError(f"longrope_serving_block needs {key!r} in the block (vLLM reads it); add it")
    if not (isinstance(max_model_len, int) and not isinstance(max_model_len, bool) and max_model_len > 0):
        raise ConfigError(f"max_model_len must be a positive int (vLLM's --max-model-len), got {max_model_len!r}")
    trained, longest = block["original_max_position_embeddings"], block["max_position_embeddings"]
    if not (is_number(trained) and is_number(longest) and trained > 1 and longest > 0):
        raise ConfigError(
            f"original_max_position_embeddings={trained!r} and max_position_embeddings={longest!r} must be lengths "
            "in tokens (the first > 1)"
        )
    scale = longest / trained
    default = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(trained))
    use_long = max_model_len > trained
    factors = list(block["long_factor" if use_long else "short_factor"])
    mscale = block.get("long_mscale" if use_long else "short_mscale")
    mscale = default if mscale is None else mscale
    out = {k: v for k, v in block.items() if k not in ("factor", "attention_factor", "type")}
    out.update(
        rope_type="longrope", short_factor=factors, long_factor=list(factors), short_mscale=mscale, long_mscale=mscale
    )
    return out
