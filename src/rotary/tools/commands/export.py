"""``rotary export``: a model of ``rotary experiment`` as a transformers checkpoint.

``rotary export RUN/models/NAME OUT`` writes it in Llama's layout (safetensors, config.json with its
rope_parameters, a byte-level tokenizer), so that ``rotary sweep OUT`` or any Hugging Face tool loads it;
its logits are the model's own. Position encodings no Llama config states are refused by name."""

from __future__ import annotations

import argparse

from ...errors import InputError
from .output import output_path
from .printing import print_json

__all__ = ["register"]


def _export(args: argparse.Namespace) -> int:
    from rotary.tools.sweep.export import export_model

    if not args.source.strip():  # an empty path would name the current directory
        raise InputError(f"RUN/models/NAME {args.source!r} names no model directory; give one of an experiment run")
    target = args.target or args.out
    if target is None:
        raise InputError(f"{args.source}: give OUT, a new directory for the checkpoint")
    if args.target and args.out and args.target != args.out:
        raise InputError(f"OUT {args.target} and -o {args.out} name two places; give one")
    path = export_model(args.source, target)
    if args.json:
        print_json({"out": str(path)})
    else:
        print(f"wrote {path} (config.json, model.safetensors, tokenizer.json)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a model of rotary experiment as a transformers checkpoint", description=__doc__
    )
    p.add_argument("source", metavar="RUN/models/NAME", help="a model directory of an experiment run")
    p.add_argument(
        "target", metavar="OUT", nargs="?", type=output_path, help="a new directory for the checkpoint (or -o OUT)"
    )
    p.add_argument("--json", action="store_true", help="print where it was written as JSON")
    p.add_argument("-o", "--out", type=output_path, metavar="DIR", help="the new directory for the checkpoint, as OUT")
    p.set_defaults(out_kind="dir")
    p.set_defaults(func=_export)
