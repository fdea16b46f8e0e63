"""How the subcommands print: JSON on stdout (``--json``), rich tables on a console."""

from __future__ import annotations

import json
import sys
from typing import Any

from rotary.analysis import jsonable

__all__ = ["console", "print_json"]


def print_json(obj: Any) -> None:
    """JSON on stdout; inf/nan (not JSON) become null."""
    json.dump(jsonable(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def console():
    """A rich console on stdout, at least 100 columns wide (``experiments.progress.table_console``)."""
    from rotary.tools.experiments.progress import table_console

    return table_console(sys.stdout)
