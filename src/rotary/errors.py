"""The exception types of bad input: what the caller must change, as opposed to a bug in rotary.

:class:`InputError` is a ``ValueError`` (code that catches ``ValueError`` keeps working);
:class:`DeviceInputError` is bad input found on an accelerator by a deferred check
(:mod:`rotary.deferred`) and raised at the next :func:`rotary.check_device_errors`.
"""

from __future__ import annotations

__all__ = ["InputError", "DeviceInputError"]


class InputError(ValueError):
    """Bad input to rotary; the message names the offending value and what to change."""


class DeviceInputError(InputError):
    """Bad input found on an accelerator by a check that did not synchronise, raised later by
    :func:`rotary.check_device_errors` (see :mod:`rotary.deferred`)."""
