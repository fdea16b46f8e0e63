"""The subcommands of ``rotary``, one module each with ``register(subparsers)`` (listed in
``rotary.tools.cli.COMMAND_MODULES``), and what they share: argparse value types (:mod:`.argument_types`),
``-o/--out`` (:mod:`.output`), CONFIG and the configuration flags (:mod:`.configuration`), printing.

The conventions of every subcommand: ``-o/--out PATH`` says where it writes (:mod:`.output`); the configuration
flags override CONFIG (``rotary inspect config.json --base 1e6``); ``--json``; exit status 0 on success, 1 when
a check fails (``verify``, ``demo``) or something could not be done (``build``), 2 for bad input, with a
one-line error naming the subcommand.
"""
