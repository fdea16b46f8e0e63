"""CONFIG (a Hugging Face config.json) and the configuration flags that override it, read into the
RoPE a subcommand analyses: ``rotary inspect config.json --base 1e6`` reads the file, then applies the
flag."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rotary.hf.config import ConfigError, RopeSettings, read_hf_config
from rotary.rope import RoPE
from rotary.rope_types import ROPE_TYPES

from ...errors import InputError
from .argument_types import COMMAND_MAX_HEAD_DIM, MAX_LENGTH, head_dim_count, length_count, positive_float

__all__ = [
    "FLAG_DEFAULTS",
    "PAIRINGS",
    "Configuration",
    "add_config_arguments",
    "config_label",
    "configurations",
    "every_layer_type",
    "flag_as_given",
    "interleaved_from_args",
    "layer_type_suffix",
    "rope_from_args",
]


#: the configuration when neither CONFIG nor a flag says otherwise (public: ``plot`` and variants use it)
FLAG_DEFAULTS = {"head_dim": 128, "base": 10000.0, "rotary_dim": None, "scaling": None, "max_position": 4096}

#: the layer type names transformers uses in ``layer_types`` (tried when a config has one RoPE block
#: per layer type but does not list them, as Gemma-3's 4.x config.json files)
STANDARD_LAYER_TYPES = ("sliding_attention", "full_attention", "chunked_attention", "linear_attention")


def _scaling_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'must be a JSON object such as \'{{"rope_type": "linear", "factor": 4}}\', got {text!r}'
        )
    return value


#: the values of --pairing, and the ``interleaved`` flag of :class:`rotary.RoPE` each stands for
PAIRINGS = ("half", "interleaved")


def interleaved_from_args(args: argparse.Namespace) -> bool | None:
    """What ``--pairing`` / ``--interleaved`` / ``--no-interleaved`` asked for; ``None`` when neither was given.

    >>> interleaved_from_args(argparse.Namespace(pairing="interleaved", interleaved=None))
    True
    """
    pairing = getattr(args, "pairing", None)
    if pairing is not None:
        return pairing == "interleaved"
    return getattr(args, "interleaved", None)


def add_config_arguments(p: argparse.ArgumentParser, *, config: bool = True) -> None:
    """CONFIG (a Hugging Face config.json) and the flags that describe or override one."""
    if config:
        p.add_argument(
            "config", nargs="?", metavar="CONFIG", help="Hugging Face config.json (or a directory holding one)"
        )
        p.add_argument("--layer-type", help="per-layer rope parameters to use (e.g. 'sliding_attention')")
    g = p.add_argument_group("configuration (without CONFIG, or overriding it)")
    g.add_argument("--head-dim", type=head_dim_count, help=f"channels per head (default {FLAG_DEFAULTS['head_dim']})")
    g.add_argument("--base", type=positive_float, help=f"rope_theta (default {FLAG_DEFAULTS['base']:g})")
    g.add_argument("--rotary-dim", type=head_dim_count, help="channels rotated (default: head_dim)")
    g.add_argument(
        "--scaling",
        type=_scaling_json,
        metavar="JSON",
        help='replaces the scaling block, e.g. \'{"rope_type": "yarn", "factor": 4, ...}\'',
    )
    g.add_argument(
        "--max-position",
        type=length_count,
        help="context length (default: what the scaling block enables, else max_position_embeddings, else 4096)",
    )
    pairing = g.add_mutually_exclusive_group()
    pairing.add_argument(
        "--pairing",
        choices=PAIRINGS,
        help="which channels rotate together: half = (i, i+d/2) as Hugging Face's Llama, interleaved = (2i, 2i+1) "
        "as the RoFormer paper and GPT-J (default: the architecture's, else half)",
    )
    pairing.add_argument(
        "--interleaved",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the same as --pairing interleaved (--no-interleaved: --pairing half)",
    )


#: RoPE's initial table length here: the context can be 131072 positions, and nothing the commands
#: compute needs tables that long (verify forms its shifted tables directly)
_CACHE_LENGTH = 4096


@dataclass
class Configuration:
    """One RoPE described by CONFIG and the flags, with its context length and where that came from."""

    rope: RoPE
    context: int
    #: how ``context`` was chosen, e.g. "factor 4 × original_max_position_embeddings 32768"
    context_source: str
    #: the config's layer type this RoPE belongs to (configs with one block per layer type), else None
    layer_type: str | None = None
    #: the multimodal RoPE of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config (``rope`` is then its 1-D
    #: form, exact for text positions only), with the flags applied; else None
    mrope: Any = None


def _read(path: str, layer_type: str | None) -> RopeSettings:
    if not path.strip():
        raise InputError(f"CONFIG {path!r} names no file; pass a Hugging Face config.json or the folder holding one")
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        raise InputError(f"{path} is a directory without a config.json; pass a config.json")
    try:
        return read_hf_config(path, layer_type=layer_type)
    except ConfigError as exc:  # the library's message names the keyword; here it is the flag
        message = str(exc).replace("layer_type=", "--layer-type")
        raise ConfigError(message if path in message else f"{path}: {message}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason}); pass a Hugging Face config.json") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory without a config.json; pass a config.json") from None
    except FileNotFoundError:
        if re.fullmatch(r"[\w.-]+/[\w.-]+", path) and not path.endswith(".json"):  # e.g. meta-llama/Llama-3.1-8B
            raise InputError(
                f"{path} is not a file here; if it is a Hugging Face Hub id, rotary reads no network: download "
                f"https://huggingface.co/{path}/resolve/main/config.json and pass that config.json"
            ) from None
        raise InputError(f"{path}: no such file; pass a Hugging Face config.json or the folder holding one") from None
    except OSError as exc:
        raise InputError(f"cannot read {path} ({exc.strerror or exc}); pass a readable config.json") from None


def _declared_layer_types(path: str) -> list[str]:
    """The layer types a config names (``layer_types``, keys of a per-layer-type block), in its order."""
    try:
        with open(os.path.join(path, "config.json") if os.path.isdir(path) else path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return []
    names: list[str] = []
    for d in (raw, raw.get("text_config")) if isinstance(raw, dict) else ():
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("layer_types"), list):
            names += [t for t in d["layer_types"] if isinstance(t, str)]
        for key in ("rope_parameters", "rope_scaling"):
            block = d.get(key)
            if isinstance(block, dict):
                names += [k for k, v in block.items() if isinstance(v, dict)]
    return list(dict.fromkeys(names))


def _settings_per_layer_type(args: argparse.Namespace) -> list[tuple[str | None, RopeSettings]]:
    """The file's settings: one entry, or one per layer type (see :func:`configurations`)."""
    path, layer_type = args.config, getattr(args, "layer_type", None)
    try:
        settings = _read(path, layer_type)
        if layer_type is not None and layer_type not in _declared_layer_types(path):
            try:
                same = _read(path, None) == settings
            except ConfigError:
                same = False
            if same:  # the library ignores a layer type a one-block config does not know; here it was asked for
                raise InputError(
                    f"--layer-type {layer_type}: {path} has one RoPE block for every layer; drop --layer-type"
                )
        return [(layer_type, settings)]
    except ConfigError as first:
        if layer_type is not None or not getattr(args, "all_layer_types", False):
            raise
        declared = _declared_layer_types(path)
        found = [(t, _read(path, t)) for t in declared]  # a broken block of a named layer type is an error
        if not found:  # a config relying on transformers' names (Gemma-3 4.x): try them
            for guess in STANDARD_LAYER_TYPES:
                try:
                    found.append((guess, _read(path, guess)))
                except ConfigError:
                    continue
        if not found:
            raise first from None
        return found


def _context(scaling: dict[str, Any], max_position_embeddings: int | None, flag: int | None) -> tuple[int, str]:
    """The context length to report and where it came from: ``factor × original_max_position_embeddings``
    for a scaling with a trained length, or ``max_position_embeddings`` when larger.
    """
    if flag is not None:
        return flag, "--max-position"
    rope_type = ROPE_TYPES.get(scaling.get("rope_type", "default"))
    factor, original = scaling.get("factor"), scaling.get("original_max_position_embeddings")
    enabled = None
    if rope_type is not None and rope_type.trained_length and factor and original:
        enabled = int(round(float(factor) * int(original)))
    by_block = f"factor {float(factor):g} × original_max_position_embeddings {original}" if enabled else ""
    if enabled and (max_position_embeddings is None or enabled > max_position_embeddings):
        also = f"; max_position_embeddings is {max_position_embeddings}" if max_position_embeddings else ""
        return enabled, f"{by_block}{also}"
    if max_position_embeddings:
        also = f"; {by_block} = {enabled} is not larger" if enabled else ""
        return max_position_embeddings, f"max_position_embeddings{also}"
    return FLAG_DEFAULTS["max_position"], "default; the configuration states no length, set --max-position"


#: the configuration flags, by their argparse dest
_CONFIG_FLAGS = {
    "head_dim": "--head-dim",
    "base": "--base",
    "rotary_dim": "--rotary-dim",
    "scaling": "--scaling",
    "max_position": "--max-position",
    "interleaved": "--interleaved",
    "pairing": "--pairing",
}


#: the configuration flags an ``--axial`` / ``--mixed`` preset replaces (its width, ``--head-dim``, may change)
PRESET_REPLACES = ("base", "rotary_dim", "scaling", "max_position", "pairing", "interleaved", "layer_type")


def flags_given(args: argparse.Namespace, dests: tuple[str, ...]) -> list[str]:
    """The flags of ``dests`` the command line gave (``["--base", "--layer-type"]``)."""
    return [f"--{d.replace('_', '-')}" for d in dests if getattr(args, d, None) is not None]


def check_heads_need_mixed(args: argparse.Namespace) -> None:
    """``--heads`` sets a RoPE-Mixed's heads: without ``--mixed`` it is an error, not a flag silently ignored."""
    if args.heads is not None and not args.mixed:
        raise InputError(f"--heads {args.heads} sets the heads of a RoPE-Mixed: add --mixed, or drop --heads")


def flag_as_given(flag: str, value: Any) -> str:
    """The flag as the user typed it: ``--no-interleaved`` for ``interleaved=False``.

    >>> flag_as_given("--interleaved", False), flag_as_given("--interleaved", True)
    ('--no-interleaved', '--interleaved')
    """
    return "--no-interleaved" if flag == "--interleaved" and value is False else flag


def _origin(args: argparse.Namespace) -> str:
    """Where a configuration came from, for error messages: ``"cfg.json with --scaling, --head-dim 64"``."""
    flags = []
    for dest, flag in _CONFIG_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            flags.append(flag_as_given(flag, value) if isinstance(value, (dict, bool)) else f"{flag} {value}")
    config = getattr(args, "config", None)
    if config and flags:
        return f"{config} with {', '.join(flags)}"
    return config or ", ".join(flags)


def _build(settings: RopeSettings, args: argparse.Namespace, layer_type: str | None) -> Configuration:
    head_dim = args.head_dim or settings.head_dim
    base = args.base or settings.base
    scaling = dict(settings.scaling)
    rotary_dim = settings.rotary_dim
    if args.scaling is not None:  # the flag's block replaces the file's; the rotated width stays
        given = dict(args.scaling)
        if "partial_rotary_factor" in scaling and "partial_rotary_factor" not in given:
            given["partial_rotary_factor"] = scaling["partial_rotary_factor"]
        rope_type = ROPE_TYPES.get(given.get("rope_type", given.get("type")))
        if (
            settings.max_position_embeddings
            and rope_type is not None
            and "max_position_embeddings" in rope_type.required | rope_type.optional
        ):
            given.setdefault("max_position_embeddings", settings.max_position_embeddings)
        scaling = given
    if args.rotary_dim is not None:  # the flag replaces the file's rotated width, however it was given
        rotary_dim = args.rotary_dim
        scaling.pop("partial_rotary_factor", None)
    asked = interleaved_from_args(args)
    interleaved = settings.interleaved if asked is None else asked
    if head_dim > COMMAND_MAX_HEAD_DIM:
        raise InputError(
            f"head_dim {head_dim} of {args.config} is more than the {COMMAND_MAX_HEAD_DIM} "
            "channels these commands handle"
        )
    try:
        rope = RoPE(
            head_dim,
            base=base,
            rotary_dim=rotary_dim,
            scaling=scaling or None,
            interleaved=interleaved,
            max_position=_CACHE_LENGTH,
        )
    except InputError as exc:  # say which of CONFIG and the flags gave the settings refused
        origin = _origin(args)
        raise type(exc)(f"{exc} (settings from {origin})" if origin else str(exc)) from None
    except (RuntimeError, ArithmeticError) as exc:  # the settings passed the checks but cannot be computed
        raise InputError(f"these settings give no valid RoPE ({exc}); check --base, --head-dim and --scaling") from None
    f = rope.freqs
    if not (bool(f.inv_freq.isfinite().all()) and math.isfinite(f.attention_scaling)):
        raise InputError(
            f"base {base:g} with head_dim {head_dim} and scaling {f.scaling} gives non-finite frequencies or "
            "attention scaling; use a base > 1 (Llama uses 10000 or 500000)"
        )
    context, source = _context(dict(f.scaling), settings.max_position_embeddings, args.max_position)
    if context > MAX_LENGTH:
        raise InputError(f"context {context} ({source}) is more than 2**40 positions; give a smaller --max-position")
    mrope = None
    if settings.mrope_section is not None:
        from rotary.variants import MRoPE

        try:
            mrope = MRoPE(
                head_dim,
                mrope_section=settings.mrope_section,
                mrope_layout=settings.mrope_layout,
                base=base,
                rotary_dim=rotary_dim,
                scaling=scaling or None,
                interleaved=interleaved,
            )
        except InputError as exc:  # e.g. --head-dim that the config's mrope_section does not fit
            origin = _origin(args)
            raise type(exc)(f"{exc} (settings from {origin})" if origin else str(exc)) from None
    return Configuration(rope, context, source, layer_type, mrope)


_NO_FILE = RopeSettings(head_dim=FLAG_DEFAULTS["head_dim"], base=FLAG_DEFAULTS["base"])


def configurations(args: argparse.Namespace) -> list[Configuration]:
    """Every RoPE that CONFIG and the flags describe: one, or one per layer type in the config's order when CONFIG
    has a RoPE block per layer type (Gemma-3), ``--layer-type`` picks none and ``args.all_layer_types`` is set.
    """
    if getattr(args, "config", None) is None:
        if getattr(args, "layer_type", None):
            raise InputError("--layer-type needs a CONFIG")
        return [_build(_NO_FILE, args, None)]
    return [_build(settings, args, layer_type) for layer_type, settings in _settings_per_layer_type(args)]


def every_layer_type(args: argparse.Namespace) -> list[Configuration]:
    """:func:`configurations` with every layer type of a per-layer-type config; ``--layer-type`` picks one."""
    return configurations(argparse.Namespace(**{**vars(args), "all_layer_types": True}))


def layer_type_suffix(configuration: Configuration, count: int) -> str:
    """``"_sliding_attention"`` for one of several layer types' output files, else ``""``.

    >>> layer_type_suffix(Configuration(RoPE(8), 64, "", "full_attention"), 2)
    '_full_attention'
    """
    return f"_{configuration.layer_type}" if count > 1 and configuration.layer_type else ""


def rope_from_args(args: argparse.Namespace) -> tuple[RoPE, int]:
    """The RoPE that CONFIG and the configuration flags describe, and its context length."""
    (configuration,) = configurations(argparse.Namespace(**{**vars(args), "all_layer_types": False}))
    return configuration.rope, configuration.context


def config_label(path: str) -> str:
    """A config's name for legends and titles: its folder for .../config.json, else the file name."""
    p = Path(path)
    return p.parent.name if p.name == "config.json" and p.parent.name else p.stem
