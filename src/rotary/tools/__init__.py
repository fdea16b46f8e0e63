"""The applications built on the library: the ``rotary`` command (:mod:`.cli`, :mod:`.commands`), the
experiment (:mod:`.experiments`), the benchmark harness (:mod:`.bench`) and the figures (:mod:`.plots`).

They use :mod:`rotary`; the library never imports them (``tests/test_layout.py`` checks this).

Their old paths (``rotary.cli``, ``rotary.commands``, ``rotary.experiments``, ``rotary.bench``,
``rotary.plots``) keep working: each is a module that calls :func:`install_old_path`, so importing the old
path (or any of its submodules, e.g. ``rotary.experiments.config``) gives the module under ``rotary.tools``
itself, not a second copy.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

__all__ = ["OLD_PATHS", "install_old_path"]

#: module paths from before the tools moved here -> where they live now
OLD_PATHS = {f"rotary.{name}": f"rotary.tools.{name}" for name in ("cli", "commands", "experiments", "bench", "plots")}


def install_old_path(old: str, new: str) -> None:
    """Make the module path ``old`` name the module ``new``, and ``old.X`` name ``new.X`` for each
    submodule ``X`` of a package (imported now, so that both paths give the same module object).

    Example:
        >>> import importlib
        >>> importlib.import_module("rotary.experiments.config") is importlib.import_module(
        ...     "rotary.tools.experiments.config"
        ... )
        True
    """
    module = importlib.import_module(new)
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        sys.modules[f"{old}.{info.name}"] = importlib.import_module(f"{new}.{info.name}")
    sys.modules[old] = module
