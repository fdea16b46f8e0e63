"""The keys transformers skips when it validates a RoPE block, audited: read, dropped for a stated reason, or refused.

transformers' config classes list keys their RoPE block may carry that its validation should not warn
about (``ignore_keys_at_rope_validation``). Some of them change nothing in the cos/sin tables (a layer-type
label, a query temperature the attention applies); one changes them entirely (HunYuan's ``alpha``).
:func:`drop_ignored_keys` drops only the first kind, by name, and refuses a key it has no entry for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..rope_types import ROPE_TYPES, ConfigError, complain

__all__ = ["IGNORED_ROPE_KEYS", "INERT_KEYS_BY_TYPE", "LONGROPE_MSCALE_READERS", "READ", "drop_ignored_keys"]


#: what :data:`IGNORED_ROPE_KEYS` says of a key rotary reads
READ = "read"

#: The keys transformers skips when it validates a model's RoPE block (the config class's
#: ``ignore_keys_at_rope_validation``, which :func:`model_defaults` returns as ``rope_ignore_keys``),
#: audited one by one. :data:`READ`: rotary reads the key; it is never dropped (a block whose type does
#: not take it is refused by the type's key check, by name). Any other value is the reason the key does
#: not change the cos/sin tables; it is dropped when the block's type does not take it. A key transformers
#: skips that is not listed here is refused by name: it may change the tables, and rotary does not drop a
#: key silently (tests/test_rope_variants_hf.py checks every config class of the pinned transformers).
IGNORED_ROPE_KEYS: dict[str, str] = {
    "alpha": READ,  # HunYuan's NTK-alpha: a "dynamic" block with alpha is rope_type ntk_alpha
    "mrope_section": READ,
    "mrope_interleaved": READ,
    "partial_rotary_factor": READ,
    "interleaved": "Qwen3-Omni's configs carry it; its modeling code never reads it (the slot layout is the model's)",
    "llama_4_scaling_beta": (
        "Mistral-4 and Ministral-3: a query temperature their attention applies by position, not part of the cos/sin "
        "tables"
    ),
    "max_position_embeddings": "the model's context length, repeated in the block; a type that uses it takes it",
    "sliding_attention": "a layer-type label of a block nested by layer type",
    "full_attention": "a layer-type label of a block nested by layer type",
    "hybrid": "a layer-type label of a block nested by layer type (ZAYA)",
    "hybrid_sliding": "a layer-type label of a block nested by layer type (ZAYA)",
    **dict.fromkeys(
        ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"),
        "YaRN keys HunYuan's blocks carry beside alpha; HunYuan's rotary embedding reads only alpha (a yarn block "
        "takes them)",
    ),
}

#: rope_type -> keys its published blocks carry that neither transformers nor vLLM reads for that type
#: (HunYuan's "dynamic" blocks with alpha keep YaRN's keys); dropped when read from a config
INERT_KEYS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "ntk_alpha": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"),
}


#: model_types whose transformers modeling code reads LongRoPE's ``short_mscale`` / ``long_mscale``; the
#: others (Phi-3 among them) ignore the keys, which vLLM applies
LONGROPE_MSCALE_READERS = frozenset({"phimoe"})


def drop_ignored_keys(
    block: dict[str, Any], ignored: Iterable[str], model_type: str, label: str, *, strict: bool = True
) -> None:
    """Drop the keys of ``block`` that transformers skips and that do not change the tables; refuse unknown ones.

    ``block``: the normalised RoPE block, edited in place; ``ignored``: the keys transformers skips for this model
    (``model_defaults(model_type)["rope_ignore_keys"]``). Raises ``ConfigError`` for a skipped key
    :data:`IGNORED_ROPE_KEYS` does not list, or LongRoPE's ``short_mscale`` / ``long_mscale`` on a model whose
    transformers code ignores them (``strict=False``: a warning, and dropped).

    Example:
        >>> block = {"rope_type": "default", "llama_4_scaling_beta": 0.1}
        >>> drop_ignored_keys(block, ["llama_4_scaling_beta"], "ministral3", "the config")
        >>> block
        {'rope_type': 'default'}
    """
    # a rope_type that is not a string (a list, a dict) is refused, naming it, where the block is validated
    rope_type = block["rope_type"] if isinstance(block["rope_type"], str) else None
    spec = ROPE_TYPES.get(rope_type) if rope_type is not None else None
    takes = spec.required | spec.optional if spec is not None else frozenset()
    for key in ignored:
        if key not in block or key in takes:
            continue
        reason = IGNORED_ROPE_KEYS.get(key)
        if reason is None:
            raise ConfigError(
                f"{label}: the RoPE block has {key}={block[key]!r}, a key transformers does not validate for "
                f"model_type {model_type!r}; rotary does not know whether it changes the rotary tables, so it does not "
                "drop it: check what the model's code does with it, then remove it or use a rope_type that reads it"
            )
        if reason != READ:
            del block[key]
    for key in INERT_KEYS_BY_TYPE.get(rope_type, ()):
        if key not in takes:
            block.pop(key, None)
    mscales = sorted(k for k in ("short_mscale", "long_mscale") if k in block)
    if rope_type in ("longrope", "su") and mscales and model_type not in LONGROPE_MSCALE_READERS:
        complain(
            f"{label}: the longrope block has {', '.join(f'{k}={block[k]!r}' for k in mscales)}, which transformers' "
            f"{model_type or 'model'} code ignores (it scales by attention_factor) while vLLM applies them to the "
            "short and long tables; remove them to rotate as transformers does, or build "
            "rotary.RoPE(scaling=block) from the block to apply them as vLLM does (strict=False drops them, as "
            "transformers)",
            strict,
        )
        for key in mscales:
            del block[key]
