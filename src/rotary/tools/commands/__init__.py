"""The subcommands of ``rotary``, one module each with ``register(subparsers)`` (:mod:`rotary.tools.cli`
lists them in ``COMMAND_MODULES``), and what they share: the argparse value types
(:mod:`.argument_types`), ``-o/--out`` (:mod:`.output`), CONFIG and the configuration flags
(:mod:`.configuration`), and printing (:mod:`.printing`).

The command-line conventions, the same for every subcommand:

- ``-o/--out PATH``: where the command writes (a file stem, a directory, or the file that takes the
  printed output; see :mod:`.output`). Missing directories are created; defaults are names under the
  current directory.
- ``CONFIG`` (a Hugging Face config.json) and the configuration flags combine: the flags override
  the file (``rotary inspect config.json --base 1e6``).
- ``--json`` on every command.
- Exit status 0 on success, 1 when a check fails (``verify``, ``demo``) or something could not be
  done (``build``), 2 for bad input; errors are one line naming the subcommand.
"""
