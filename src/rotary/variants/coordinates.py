"""Coordinates: the validated positions of N-D tokens on ``A`` axes, and which tokens take no rotation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._device_copies import version_of
from ..errors import InputError, InputTypeError

__all__ = ["Coordinates", "check_identity"]


@dataclass(frozen=True)
class Coordinates:
    """Validated coordinates of tokens on ``A`` axes, and which tokens take no rotation (trusted once made).

    ``values``: float64 ``[S, A]`` (shared by the batch) or ``[B, S, A]``, finite; ``identity``: bool ``[S]`` or
    ``[B, S]``, ``True`` for tokens with identity rows (CLS, registers), or ``None``.

    Example:
        >>> c = AxialRoPE(8).grid(2, 2, prefix=1)
        >>> c.values.tolist(), c.identity.tolist()
        ([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], [True, False, False, False, False])
    """

    values: torch.Tensor
    identity: torch.Tensor | None = None

    @property
    def axes(self) -> int:
        """Coordinates per token ``A``."""
        return self.values.shape[-1]

    @property
    def seq_len(self) -> int:
        """Tokens ``S``."""
        return self.values.shape[-2]

    @property
    def batch(self) -> int | None:
        """The batch size the coordinates are given for, or ``None`` when shared by the batch."""
        return self.values.shape[0] if self.values.dim() == 3 else None

    def to(self, device: torch.device | str) -> Coordinates:
        """The same coordinates on ``device``; the copy is reused until either tensor is edited (not with grad)."""
        device = torch.device(device)
        if self.values.device == device:
            return self
        copies: dict = self.__dict__.get("_device_copies", {})
        found = copies.get(device)
        if torch.compiler.is_compiling():  # version counters are not traceable: a copy made eagerly is used
            if found is not None and not self.values.requires_grad:
                return found[1]
            return Coordinates(self.values.to(device), None if self.identity is None else self.identity.to(device))
        if self.values.requires_grad:
            return Coordinates(self.values.to(device), None if self.identity is None else self.identity.to(device))
        if found is not None and found[0] == self._version() and found[2] == found[1]._version():
            return found[1]  # neither these nor the copy were edited since
        with torch.inference_mode(False):  # kept: usable outside inference mode later
            moved = Coordinates(self.values.to(device), None if self.identity is None else self.identity.to(device))
        self.__dict__.setdefault("_device_copies", {})[device] = (self._version(), moved, moved._version())
        return moved

    def _version(self) -> tuple[int | None, int | None]:
        """The tensors' version counters."""
        return version_of(self.values), None if self.identity is None else version_of(self.identity)


def check_identity(identity: object, values: torch.Tensor, name: str) -> torch.Tensor | None:
    """``identity`` checked against ``values`` ``[..., A]``: a bool tensor with one flag per token, on their device."""
    if identity is None:
        return None
    if not isinstance(identity, torch.Tensor) or identity.dtype != torch.bool:
        raise InputTypeError(f"identity must be a bool tensor [S] or [B, S] (True: no rotation), got {identity!r:.80}")
    token_shape = tuple(values.shape[:-1])
    if tuple(identity.shape) not in (token_shape, token_shape[-1:]):
        raise InputError(
            f"identity has shape {tuple(identity.shape)} but the {name} are {tuple(values.shape)}: "
            f"give one flag per token, {list(token_shape[-1:])} or {list(token_shape)}"
        )
    return identity.to(values.device)
