"""Length-dependent frequencies: the frequencies a call uses, for types that depend on its length.

transformers keeps dynamic NTK's and LongRoPE's length dependence as state in the rotary module
(``dynamic_rope_update``). :class:`FrequencySchedule` replays that state machine call for call (``mode="hf"``) or
uses the current call's length alone (``mode="stateless"``); docs/scaling.md, ``dynamic``, explains both.
:meth:`FrequencySchedule.freqs_for` returns the frequencies *of this call*; the shared state changes under a lock.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import torch

from ._checks import is_number
from ._sync import CopyableLock
from .errors import InputError
from .frequencies import Frequencies, frequencies
from .rope_types import ROPE_TYPES, ConfigError

__all__ = ["FrequencySchedule"]


class FrequencySchedule:
    """The frequencies of each call of one configuration: ``original`` built by ``frequency_args`` (the keywords of
    :func:`rotary.frequencies`), ``mode`` ``"hf"`` or ``"stateless"``.

    Example:
        >>> args = dict(head_dim=64, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8})
        >>> schedule = FrequencySchedule(args, frequencies(**args))
        >>> freqs, key = schedule.freqs_for(32)
        >>> key is None, bool(freqs.inv_freq[-1] < schedule.original.inv_freq[-1])
        (True, True)
    """

    def __init__(
        self, frequency_args: Mapping[str, Any], original: Frequencies, mode: Literal["hf", "stateless"] = "hf"
    ) -> None:
        if mode not in ("hf", "stateless"):
            raise InputError(f"dynamic must be 'hf' (transformers' state machine) or 'stateless', got {mode!r}")
        self._args = dict(frequency_args)
        self.original = original
        self.mode = mode
        spec = ROPE_TYPES[original.rope_type]
        self.length_dependent = spec.length_dependent
        #: the type's update rule (see :class:`rotary.rope_types.RopeType`), ``None`` when static
        self.update = spec.update if spec.length_dependent else None
        self._lock = CopyableLock()
        self._long: Frequencies | None = None
        self._current: tuple[Frequencies, str | None] = (original, "original")
        self._stateless: tuple[int, Frequencies] | None = None
        if self.length_dependent:
            trained = original.scaling.get(spec.trained_key)
            # an int; a float length (warned with strict=False, docs/scaling.md) is compared as transformers does
            if not is_number(trained) or trained < 1:
                raise ConfigError(
                    f"rope_type {original.rope_type!r} is length-dependent and needs its trained length as a positive "
                    f"int under {spec.trained_key!r}, got {trained!r}"
                )
            self._trained: int | float = trained
            #: the longest length seen so far (transformers' ``max_seq_len_cached``; the "grow" rule)
            self.max_seq_len_cached: int | float = self._trained

    @property
    def current(self) -> Frequencies:
        """The frequencies of the most recent call (what transformers' module would hold now)."""
        return self._current[0]

    def _recompute(self, seq_len: int | torch.Tensor) -> Frequencies:
        with warnings.catch_warnings():  # the lenient-mode warnings were given once, at construction
            warnings.simplefilter("ignore")
            return frequencies(**self._args, seq_len=seq_len)

    def freqs_for(self, seq_len: int | torch.Tensor) -> tuple[Frequencies, str | None]:
        """The frequencies of a call covering positions ``0 .. seq_len - 1``, and their cache key.

        ``seq_len``: an int, or a 0-dim integer tensor as transformers passes (dynamic NTK's fp32 base is reproduced bit
        for bit). The key names a recurring set (``"original"``, ``"long"``); ``None`` marks this length only.
        """
        if not self.length_dependent:
            return self.original, "original"
        length = (
            torch.as_tensor(seq_len, dtype=torch.int64).cpu() if isinstance(seq_len, torch.Tensor) else int(seq_len)
        )
        n = int(length)
        with self._lock:
            if self.update == "switch":
                if n > self._trained:
                    if self._long is None:
                        self._long = self._recompute(math.floor(self._trained) + 1)
                    self._current = (self._long, "long")
                else:
                    self._current = (self.original, "original")
            elif self.mode == "stateless":
                if n <= self._trained:
                    self._current = (self.original, "original")
                else:
                    if self._stateless is None or self._stateless[0] != n:
                        self._stateless = (n, self._recompute(torch.as_tensor(n)))
                    self._current = (self._stateless[1], None)
            else:
                cached = self.max_seq_len_cached
                if n > cached:  # growth: a longer sequence than any before
                    self._current = (self._recompute(torch.as_tensor(length)), None)
                    self.max_seq_len_cached = n
                if n < self._trained and cached > self._trained:  # back to short
                    self._current = (self.original, "original")
                    self.max_seq_len_cached = self._trained
            return self._current

    def reset(self) -> None:
        """Forget the lengths seen and return to the trained frequencies."""
        with self._lock:
            self._current = (self.original, "original")
            self._stateless = None
            if self.length_dependent:
                self.max_seq_len_cached = self._trained
