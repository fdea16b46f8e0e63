"""Which model types of the installed transformers apply RoPE, and what rotary builds for each.

Generated from rotary's own tables, never typed by hand: a module of :mod:`rotary.hf` may define ``COVERAGE``,
``(producer, table)`` pairs whose table maps a ``model_type`` to anything; :data:`rotary.hf.UNSUPPORTED` gives
the refused ones and why; a multimodal wrapper is read through its ``text_config``.
``python -m rotary.hf.coverage [--write]`` prints (or writes) docs/models.md; tests/test_hf_coverage.py checks it.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .architectures import UNSUPPORTED
from .vision_tables import ENCODER_STATUS

__all__ = ["Coverage", "coverage", "markdown", "rope_model_types", "summary"]

#: what in a modeling file says that it applies a rotary embedding
ROPE_SOURCE = re.compile(r"rotate_half|apply_rotary|RotaryEmbedding|rotary_emb|freqs_cis")


def _modeling_source(model_type: str) -> str:
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    folder = os.path.join(os.path.dirname(transformers.__file__), "models", model_type_to_module_name(model_type))
    if not os.path.isdir(folder):
        return ""
    return "".join(
        open(os.path.join(folder, f), encoding="utf-8").read()
        for f in sorted(os.listdir(folder))
        if f.startswith("modeling_") and f.endswith(".py")
    )


@functools.cache
def rope_model_types() -> tuple[str, ...]:
    """Every ``model_type`` of the installed transformers whose modeling code applies a rotary embedding.

    Example:
        >>> "llama" in rope_model_types() and "bert" not in rope_model_types()
        True
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return tuple(mt for mt in CONFIG_MAPPING_NAMES if ROPE_SOURCE.search(_modeling_source(mt)))


def producer_tables() -> list[tuple[str, Mapping[str, Any]]]:
    """``(producer, table)`` from the ``COVERAGE`` of every module of :mod:`rotary.hf`, in module order."""
    package = importlib.import_module(__package__)
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name == "coverage" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        found += list(getattr(module, "COVERAGE", ()))
    return found


def _text_part_type(model_type: str) -> str | None:
    """The ``model_type`` of a multimodal wrapper's default ``text_config``, else ``None``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    if "text_config" not in (getattr(cls, "sub_configs", None) or {}):
        return None
    try:
        return getattr(cls().text_config, "model_type", None)
    except Exception:  # a wrapper whose defaults transformers cannot build
        return None


@dataclass(frozen=True)
class Coverage:
    """One model type: ``producer`` builds it, or ``None`` and a ``reason``; ``via``: a wrapper's text type."""

    model_type: str
    producer: str | None
    reason: str | None = None
    via: str | None = None


def _own(model_type: str, tables: list[tuple[str, Mapping[str, Any]]]) -> Coverage | None:
    for producer, table in tables:
        if model_type in table:
            return Coverage(model_type, producer)
    if model_type in UNSUPPORTED:  # an encoder's own status says more than "not a text decoder"
        return Coverage(model_type, None, ENCODER_STATUS.get(model_type, UNSUPPORTED[model_type]))
    return None


def coverage() -> list[Coverage]:
    """One :class:`Coverage` per RoPE-applying ``model_type`` of the installed transformers, sorted."""
    tables = producer_tables()
    rows = []
    for model_type in sorted(rope_model_types(), key=str.lower):
        row = _own(model_type, tables)
        if row is None:
            text_type = _text_part_type(model_type)
            inner = _own(text_type, tables) if text_type else None
            if inner is not None:
                row = Coverage(model_type, inner.producer, inner.reason, via=text_type)
            else:
                row = Coverage(model_type, None, "is not in rotary's tables")
        rows.append(row)
    return rows


#: the start of a reason that says the type's forward pass applies no RoPE at all (its modeling file holds one
#: that another part applies, or that no layer calls): such a row is listed, but not counted as applying one
NO_ROPE_PREFIXES = ("no RoPE", "applies no rotary embedding in its attention layers", "applies no rotary embedding:")


def applies_none(row: Coverage) -> bool:
    """Whether ``row`` says that its type's forward pass applies no RoPE (run and recorded, or by design)."""
    return row.producer is None and (row.reason or "").startswith(NO_ROPE_PREFIXES)


def summary(rows: list[Coverage] | None = None) -> str:
    """The README's sentence: how many of the RoPE-applying model types rotary builds."""
    import transformers

    rows = coverage() if rows is None else rows
    built = sum(r.producer is not None for r in rows)
    applying = sum(not applies_none(r) for r in rows)
    return (
        f"rotary builds the RoPE of {built} of the {applying} model types of transformers "
        f"{transformers.__version__} that apply one"
    )


def markdown() -> str:
    """The text of ``docs/models.md``."""
    rows = coverage()
    applying = sum(not applies_none(r) for r in rows)
    lines = [
        "# Model types and their RoPE",
        "",
        "Generated by `python -m rotary.hf.coverage --write` from rotary's tables (`rotary.hf`); do not edit.",
        f"This table lists the {len(rows)} model types whose modeling code in transformers holds a rotary "
        f"embedding. {applying} of them apply one in their forward pass, and {summary(rows)}. The remaining "
        f"{len(rows) - applying} hold one that their forward pass never applies (each row says what it uses "
        f"instead): they are listed, and not counted among the {applying}.",
        "A multimodal wrapper is read through its `text_config` (the type named after it).",
        "",
        "| model type | built by | or refused because it |",
        "| --- | --- | --- |",
    ]
    for r in rows:
        name = f"`{r.model_type}`" + (f" (via `{r.via}`)" if r.via else "")
        lines.append(f"| {name} | {f'`{r.producer}`' if r.producer else ''} | {r.reason or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m rotary.hf.coverage [--write [PATH]]``: print the table, or write it (default docs/models.md)."""
    argv = sys.argv[1:] if argv is None else argv
    text = markdown()
    if argv and argv[0] == "--write":
        path = argv[1] if len(argv) > 1 else os.path.join("docs", "models.md")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {path}: {summary()}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
