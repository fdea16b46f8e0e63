"""What the analysis subcommands share: the configuration arguments, building a RoPE from them,
and printing JSON / rich tables."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from rotary.analysis import jsonable
from rotary.config import ConfigError, read_hf_config
from rotary.module import RoPE

__all__ = ["add_config_arguments", "rope_from_args", "positive_int", "positive_float", "print_json", "console", "config_label"]

def positive_int(text: str) -> int:
    """argparse type: an int > 0 (argparse turns the error into a one-line usage message, status 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


#: flags that describe a configuration without a config.json
FLAG_DEFAULTS = {"head_dim": 128, "base": 10000.0, "rotary_dim": None, "scaling": None, "max_position": 4096}


def _scaling_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'must be a JSON object such as \'{{"rope_type": "linear", "factor": 4}}\', got {text!r}')
    return value


def add_config_arguments(p: argparse.ArgumentParser, *, config: bool = True) -> None:
    """CONFIG (a Hugging Face config.json) or the flags that describe one."""
    if config:
        p.add_argument("config", nargs="?", metavar="CONFIG", help="Hugging Face config.json (or a directory holding one)")
        p.add_argument("--layer-type", help="per-layer rope parameters to use (e.g. 'sliding_attention')")
    g = p.add_argument_group("configuration without a config.json")
    g.add_argument("--head-dim", type=positive_int, help=f"channels per head (default {FLAG_DEFAULTS['head_dim']})")
    g.add_argument("--base", type=positive_float, help=f"rope_theta (default {FLAG_DEFAULTS['base']:g})")
    g.add_argument("--rotary-dim", type=positive_int, help="channels rotated (default: head_dim)")
    g.add_argument("--scaling", type=_scaling_json, metavar="JSON", help='e.g. \'{"rope_type": "yarn", "factor": 4, ...}\'')
    g.add_argument("--max-position", type=positive_int, help=f"context length (default {FLAG_DEFAULTS['max_position']})")
    p.add_argument("--interleaved", action="store_true", help="pairs (2i, 2i+1) instead of Hugging Face's (i, i+d/2)")


#: RoPE's initial table length here: the context can be 131072 positions, and nothing the commands
#: compute needs tables that long (verify forms its shifted tables directly)
_CACHE_LENGTH = 4096


def rope_from_args(args: argparse.Namespace) -> tuple[RoPE, int]:
    """Build the RoPE that CONFIG or the configuration flags describe, and its context length.

    The context is ``--max-position``, else the config's ``max_position_embeddings``, else 4096.
    """
    flags = {k: getattr(args, k, None) for k in FLAG_DEFAULTS}
    path = getattr(args, "config", None)
    if path is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in flags.items() if v is not None and k != "max_position"]
        if given:
            raise ValueError(f"give either CONFIG or {', '.join(given)}, not both")
        try:
            settings = read_hf_config(path, layer_type=getattr(args, "layer_type", None))
        except ConfigError as exc:  # the library's message names the keyword; here it is the flag
            raise ValueError(str(exc).replace("layer_type=", "--layer-type")) from None
        context = flags["max_position"] or settings.max_position_embeddings or FLAG_DEFAULTS["max_position"]
        rope = RoPE(
            settings.head_dim, base=settings.base, rotary_dim=settings.rotary_dim, scaling=settings.scaling,
            interleaved=settings.interleaved or args.interleaved, max_position=min(context, _CACHE_LENGTH),
        )
        return rope, context
    if getattr(args, "layer_type", None):
        raise ValueError("--layer-type needs a CONFIG")
    values = {k: (v if v is not None else FLAG_DEFAULTS[k]) for k, v in flags.items()}
    rope = RoPE(
        values["head_dim"], base=values["base"], rotary_dim=values["rotary_dim"], scaling=values["scaling"],
        interleaved=args.interleaved, max_position=min(values["max_position"], _CACHE_LENGTH),
    )
    return rope, values["max_position"]


def config_label(path: str) -> str:
    """A config's name for legends and titles: its folder for .../config.json, else the file name."""
    p = Path(path)
    return p.parent.name if p.name == "config.json" and p.parent.name else p.stem


def print_json(obj: Any) -> None:
    """JSON on stdout; inf/nan (not JSON) become null."""
    json.dump(jsonable(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def console():
    """A rich console on stdout, at least 100 columns wide so tables don't wrap when piped."""
    import shutil

    from rich.console import Console

    return Console(width=max(shutil.get_terminal_size((120, 24)).columns, 100), highlight=False)
