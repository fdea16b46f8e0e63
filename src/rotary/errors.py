"""The exception types of bad input: what the caller must change, as opposed to a bug in rotary.

Every check raises one of these; anything else is a bug. The ``rotary`` command prints an ``InputError`` as one
line (exit status 2). On an accelerator a value only the device holds is never read to be checked: it is valid
by construction, refused by a device-side assertion, or the caller's contract, stated where documented.

Example:
    >>> import rotary
    >>> try:
    ...     rotary.RoPE(64, scaling={"rope_type": "linear"})
    ... except rotary.InputError as exc:
    ...     print(type(exc).__name__, "-", exc)  # doctest: +ELLIPSIS
    ConfigError - rope_type 'linear' needs the key(s) ['factor']; add them to the scaling block; ...
"""

from __future__ import annotations

__all__ = ["InputError", "InputTypeError", "ConfigError"]


class InputError(ValueError):
    """Bad input to rotary; the message names the offending value and what to change."""


class InputTypeError(InputError, TypeError):
    """An argument of the wrong type: an :class:`InputError` that ``except TypeError`` also catches."""


class ConfigError(InputError):
    """A RoPE configuration that cannot be right; the message names the value and the fix."""
