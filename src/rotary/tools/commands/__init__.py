"""Subcommands of ``rotary`` for analysis: ``inspect``, ``plot``, ``verify``, ``report``.

Each module has ``register(subparsers)``; :mod:`rotary.tools.cli` lists them in ``COMMAND_MODULES``.
"""
