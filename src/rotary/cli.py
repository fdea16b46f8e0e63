"""The ``rotary`` command. Each subcommand lives in its own module exposing ``register(subparsers)``;
the module's parser sets ``func(args) -> int`` as its default."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

#: modules that add subcommands, in the order ``--help`` lists them
COMMAND_MODULES = [
    "rotary.commands.demo",
    "rotary.commands.inspect",
    "rotary.commands.plot",
    "rotary.commands.verify",
    "rotary.commands.report",
    "rotary.commands.experiment",
    "rotary.commands.bench",
]


#: optional packages some commands need -> how to install them
OPTIONAL_PACKAGES = {
    "rich": "'rotary[plot]'",
    "matplotlib": "'rotary[plot]'",
    "transformers": "transformers",
    "rotary_embedding_torch": "rotary-embedding-torch",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit status 2, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rotary", description="Rotary position embeddings (RoPE): demo, analysis, benchmarks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `rotary inspect ... --json | head`: the reader left, that's fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, FileNotFoundError) as exc:  # bad input: one line, status 2
        print(f"rotary {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional dependency of this command is missing
        missing = (exc.name or "").split(".")[0]
        if missing not in OPTIONAL_PACKAGES:
            raise
        print(
            f"rotary {args.command}: error: needs the optional package {missing!r}; "
            f"install it with: pip install {OPTIONAL_PACKAGES[missing]}",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
