"""``rotary export``: a model of ``rotary experiment`` as a transformers checkpoint.

``rotary export RUN/models/NAME OUT`` writes it in Llama's layout (safetensors, config.json with its
rope_parameters, a byte-level tokenizer), so that ``rotary sweep OUT`` or any Hugging Face tool loads it;
its logits are the model's own. Position encodings no Llama config states are refused by name."""

from __future__ import annotations

import argparse

from .common import print_json

__all__ = ["register"]


def _export(args: argparse.Namespace) -> int:
    from rotary.tools.sweep.export import export_model

    path = export_model(args.source, args.target)
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
    p.add_argument("target", metavar="OUT", help="a new directory for the checkpoint")
    p.add_argument("--json", action="store_true", help="print where it was written as JSON")
    p.set_defaults(func=_export)
