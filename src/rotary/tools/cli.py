"""The ``rotary`` command: each subcommand module exposes ``register(subparsers)`` and sets ``func(args) -> int``;
the conventions they share are in :mod:`rotary.tools.commands`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
from collections.abc import Sequence

from rotary import __version__
from rotary.errors import InputError

#: modules that add subcommands, in the order ``--help`` lists them
COMMAND_MODULES = [
    "rotary.tools.commands.demo",
    "rotary.tools.commands.inspect",
    "rotary.tools.commands.plot",
    "rotary.tools.commands.verify",
    "rotary.tools.commands.report",
    "rotary.tools.commands.experiment",
    "rotary.tools.commands.sweep",
    "rotary.tools.commands.export",
    "rotary.tools.commands.bench",
    "rotary.tools.commands.build",
]


#: optional packages some commands need -> how to install them. rotary is installed from a clone
#: (it is not on PyPI), so an extra is named with the command that works there, and the packages
#: themselves with theirs.
OPTIONAL_PACKAGES = {
    "rich": "part of rotary's [plot] extra: pip install 'matplotlib>=3.8' 'rich>=13' "
    "(in a clone of rotary: pip install -e '.[plot]')",
    "matplotlib": "part of rotary's [plot] extra: pip install 'matplotlib>=3.8' 'rich>=13' "
    "(in a clone of rotary: pip install -e '.[plot]')",
    "transformers": "install it with: pip install transformers",
    "accelerate": "install it with: pip install accelerate (transformers' device_map needs it)",
    "rotary_embedding_torch": "install it with: pip install rotary-embedding-torch",
}


class _Parser(argparse.ArgumentParser):
    """One-line errors naming the (sub)command, exit status 2, no usage dump."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.set_defaults(_parser=self)  # the innermost parser that matched, for errors found later

    def error(self, message: str) -> None:  # type: ignore[override]
        flag = re.fullmatch(r"argument (?:\S+/)?(\S+): expected one argument", message)
        if flag:  # argparse reads a value such as -1e16 as an option; say how to pass it
            message += f" (give one; a value that starts with '-' must be written {flag.group(1)}=VALUE)"
        self.exit(2, f"{self.prog}: error: {message}\n")


#: one example per runnable subcommand, shown at the end of its --help (tests/test_cli.py parses each)
EXAMPLES = {
    "demo": "rotary demo --head-dim 128 --seq-len 64",
    "inspect": "rotary inspect path/to/config.json --max-position 131072",
    "plot decay": "rotary plot decay --head-dim 128 --base 500000 -o decay",
    "plot frequencies": "rotary plot frequencies --base 10000 --base 500000 --head-dim 128 -o frequencies",
    "plot scaling": "rotary plot scaling path/to/config.json -o scaling",
    "plot scores": "rotary plot scores --head-dim 64 --seq-len 256 -o scores",
    "plot positions": "rotary plot positions path/to/config.json -o positions",
    "plot axial": "rotary plot axial --preset pixtral -o axial",
    "plot learnable": "rotary plot learnable --steps 200 -o learnable",
    "plot variants": "rotary plot variants -o figures",
    "verify": "rotary verify path/to/config.json --seq-len 512",
    "report": "rotary report path/to/config.json -o report",
    "experiment": "rotary experiment --preset tiny -o runs/tiny",
    "sweep": "rotary sweep path/to/checkpoint --lengths 2048,4096,8192 --scalings none,yarn -o sweep",
    "export": "rotary export runs/tiny/models/rope-0 exported/rope-0",
    "bench": "rotary bench --quick --dtypes fp32",
    "build": "rotary build --json",
}


class _HelpFormatter(argparse.HelpFormatter):
    """Paragraphs wrapped one by one; one whose later lines are indented (the example) printed as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if len(lines) > 1 and all(line.startswith("  ") for line in lines[1:]):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(paragraphs)


def _describe(parser: argparse.ArgumentParser, name: str, summary: str) -> None:
    """Give a subcommand's --help its one-line summary first and its example last."""
    details = (parser.description or "").replace("``", "")
    first, _, rest = details.partition("\n\n")
    if first.startswith(f"rotary {name}:"):  # a module docstring opening with its own summary line
        details = rest
    parser.description = f"rotary {name}: {summary}." + (f"\n\n{details.strip()}" if details.strip() else "")
    if name in EXAMPLES:  # every subcommand has one (tested); a new one without it still runs
        parser.epilog = f"example:\n  {EXAMPLES[name]}"
    parser.formatter_class = _HelpFormatter


def _leaves(parser: argparse.ArgumentParser, name: str = ""):
    """(name, parser, summary) of every runnable subcommand under ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for sub_name, sub in action.choices.items():
                full = f"{name} {sub_name}".strip()
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from _leaves(sub, full)
                else:
                    yield full, sub, summaries.get(sub_name) or ""


def build_parser() -> argparse.ArgumentParser:
    """The ``rotary`` parser: every subcommand module's parser, each --help with a summary and an example.

    Example:
        >>> build_parser().parse_args(["demo", "--head-dim", "16"]).head_dim
        16
    """
    parser = _Parser(prog="rotary", description="Rotary position embeddings (RoPE): demo, analysis, benchmarks.")
    parser.add_argument("--version", action="version", version=f"rotary {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for name, leaf, summary in _leaves(parser):
        _describe(leaf, name, summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rotary`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Example:
        >>> main(["demo", "--head-dim", "8", "--seq-len", "4", "--json"])  # doctest: +ELLIPSIS
        {...}
        0
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the subcommand that was given them, not by "rotary"
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    name = args._parser.prog
    try:
        with contextlib.ExitStack() as stack:
            if getattr(args, "out_kind", None) == "file" and args.out is not None:
                from .commands.output import open_output_file

                stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open_output_file(args.out))))
            status = int(args.func(args) or 0)
            sys.stdout.flush()  # a pipe holds the output in its buffer until here: a closed one fails now
            return status
    except BrokenPipeError:  # e.g. `rotary inspect cfg.json | head`: the reader left, that's fine
        # as Python's docs advise (signal, "Note on SIGPIPE"): what is left in the buffer goes to devnull,
        # so the flush at exit does not raise a second time
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except InputError as exc:  # bad input (a value, a file, a flag): one line, status 2; anything else is a bug
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be read or written
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{name}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional dependency of this command is missing
        missing = (exc.name or "").split(".")[0]
        if missing not in OPTIONAL_PACKAGES:
            raise
        print(f"{name}: error: needs the optional package {missing!r}, {OPTIONAL_PACKAGES[missing]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
