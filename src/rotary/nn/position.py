"""Position encodings other than RoPE, for comparison and for the ``Decoder``'s switch: absolute embeddings
added to the tokens, and additive score biases that can be added to RoPE: ALiBi ("Train Short, Test Long: Attention
with Linear Biases Enables Input Length Extrapolation") and a learned clipped ``b(i - j)``.
A score bias maps ``query_positions`` ``[B, S]`` and ``key_positions`` ``[B, T]`` to fp32 ``[B, H, S, T]``, so it
stays right with left padding and a KV cache.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import devices
from .. import positions as P
from .._checks import check_positive_int, is_number
from .._limits import MAX_NUM_HEADS, format_bytes
from ..errors import InputError
from ..positions import Positions

__all__ = [
    "ALiBi",
    "LearnedPositionEmbedding",
    "RelativePositionBias",
    "SinusoidalPositionEmbedding",
    "alibi_slopes",
]


#: the largest clipping distance of :class:`RelativePositionBias` (its table has ``2 d + 1`` rows per head)
MAX_RELATIVE_DISTANCE = 2**20
#: the largest learned absolute position table (fp32 bytes), 1 GiB: 2**28 parameters
MAX_POSITION_TABLE_BYTES = 2**30


def _check_pair(query_positions: torch.Tensor, key_positions: torch.Tensor) -> None:
    for name, t in (("query_positions", query_positions), ("key_positions", key_positions)):
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.dim() != 2:
            raise InputError(f"{name} must be an integer tensor [B, L], got {getattr(t, 'shape', type(t).__name__)}")
    if query_positions.shape[0] != key_positions.shape[0]:
        raise InputError(
            f"query_positions and key_positions must share the batch size, got {query_positions.shape[0]} "
            f"and {key_positions.shape[0]}"
        )


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi head slopes, fp32 ``[num_heads]`` (``num_heads`` in ``[1, 2**16]``), by the paper's recipe.

    Example:
        >>> from rotary.nn import alibi_slopes
        >>> alibi_slopes(4)
        tensor([0.2500, 0.0625, 0.0156, 0.0039])
    """
    check_positive_int(num_heads, "num_heads")
    if num_heads > MAX_NUM_HEADS:
        # the slopes are built as Python floats (~32 bytes each) before the fp32 tensor
        raise InputError(
            f"num_heads={num_heads} is more than {MAX_NUM_HEADS} heads (real models use 1 to 128); its slopes alone "
            f"would need about {format_bytes(36 * num_heads)}, and a score bias [B, H, S, T] far more: check num_heads"
        )

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        lower = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(lower) + power_of_two(2 * lower)[0::2][: num_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(nn.Module):
    """ALiBi: score bias ``-slope_h * |i - j|`` over ``num_heads`` (symmetric: encoders too).

    Example:
        >>> from rotary.nn import ALiBi
        >>> bias = ALiBi(2)(torch.arange(3)[None], torch.arange(3)[None])
        >>> bias.shape
        torch.Size([1, 2, 3, 3])
    """

    slopes: torch.Tensor

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # keep the slopes fp32 under model.to(bfloat16): bf16 slopes round 2^-8/3 etc.
        super()._apply(fn, recurse)
        self.slopes = alibi_slopes(self.num_heads).to(self.slopes.device)
        return self

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """``query_positions: [B, S]``, ``key_positions: [B, T]`` -> fp32 ``[B, H, S, T]``."""
        _check_pair(query_positions, key_positions)
        distance = (query_positions[:, :, None] - key_positions[:, None, :]).abs().to(torch.float32)
        return -self.slopes[None, :, None, None] * distance[:, None]


class RelativePositionBias(nn.Module):
    """A learned score bias ``b_h(i - j)`` per head; distances beyond ``±max_distance`` share its bias.

    Example:
        >>> from rotary.nn import RelativePositionBias
        >>> RelativePositionBias(4, 16)(torch.arange(5)[None], torch.arange(5)[None]).shape
        torch.Size([1, 4, 5, 5])
    """

    def __init__(self, num_heads: int, max_distance: int = 128) -> None:
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        self.max_distance = check_positive_int(max_distance, "max_distance")
        if num_heads > MAX_NUM_HEADS or max_distance > MAX_RELATIVE_DISTANCE:
            raise InputError(
                f"RelativePositionBias(num_heads={num_heads}, max_distance={max_distance}) would learn a table of "
                f"{format_bytes(4 * (2 * max_distance + 1) * num_heads)}; at most {MAX_NUM_HEADS} heads and "
                f"max_distance <= {MAX_RELATIVE_DISTANCE} (T5 clips at 128): distances "
                "beyond max_distance share one bias"
            )
        # zero init: the model starts as plain RoPE attention and learns the bias it needs
        self.bias = nn.Parameter(torch.zeros(2 * max_distance + 1, num_heads))

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """``query_positions: [B, S]``, ``key_positions: [B, T]`` -> fp32 ``[B, H, S, T]``."""
        _check_pair(query_positions, key_positions)
        distance = query_positions[:, :, None] - key_positions[:, None, :]
        index = distance.clamp(-self.max_distance, self.max_distance) + self.max_distance
        return self.bias[index].permute(0, 3, 1, 2).to(torch.float32)


class LearnedPositionEmbedding(nn.Module):
    """Absolute learned position embedding (BERT, GPT-2): ``position_ids -> [..., hidden_size]``.

    Example:
        >>> from rotary.nn import LearnedPositionEmbedding
        >>> LearnedPositionEmbedding(16, 8)(torch.arange(4)[None]).shape
        torch.Size([1, 4, 8])
    """

    def __init__(self, max_position: int, hidden_size: int) -> None:
        super().__init__()
        self.max_position = check_positive_int(max_position, "max_position")
        check_positive_int(hidden_size, "hidden_size")
        if 4 * max_position * hidden_size > MAX_POSITION_TABLE_BYTES:
            raise InputError(
                f"LearnedPositionEmbedding(max_position={max_position}, hidden_size={hidden_size}) would need "
                f"{format_bytes(4 * max_position * hidden_size)} for its table, more than "
                f"{format_bytes(MAX_POSITION_TABLE_BYTES)}; check both (GPT-2 uses 1024 x 768), or use "
                "RoPE, which has no table to learn"
            )
        self.embedding = nn.Embedding(max_position, hidden_size)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, position_ids: torch.Tensor | Positions) -> torch.Tensor:
        """``position_ids``: integer ``[...]`` (>= 0) or Positions -> ``[..., hidden_size]``.

        Raises ValueError for a position at or past ``max_position`` when the host knows it; on accelerators unknown ids
        are not read and such tokens get NaN embeddings.
        """
        if isinstance(position_ids, Positions):
            ids, bound = position_ids.ids, position_ids.bound
        else:
            ids = P.integer_positions(position_ids)
            host = ids.numel() and not torch.compiler.is_compiling() and devices.host_checks(ids.device)
            bound = int(ids.max()) + 1 if host else None
        if bound is not None and bound > self.max_position:
            raise InputError(
                f"position {bound - 1} is beyond the learned table of max_position={self.max_position}; "
                "build the model with a larger max_position"
            )
        if bound is None and ids.numel() and not torch.compiler.is_compiling() and not devices.host_checks(ids.device):
            outside = (ids < 0) | (ids >= self.max_position)
            rows = self.embedding(ids.clamp(0, self.max_position - 1))
            return rows.masked_fill(outside.unsqueeze(-1), float("nan"))
        return self.embedding(ids)


class SinusoidalPositionEmbedding(nn.Module):
    """The fixed sinusoidal encoding of "Attention is all you need" for any position (float64 angles, fp32 values).

    Example:
        >>> from rotary.nn import SinusoidalPositionEmbedding
        >>> SinusoidalPositionEmbedding(4)(torch.tensor([[0]]))
        tensor([[[0., 1., 0., 1.]]])
    """

    def __init__(self, hidden_size: int, base: float = 10000.0) -> None:
        super().__init__()
        self.hidden_size = check_positive_int(hidden_size, "hidden_size")
        if hidden_size % 2:
            raise InputError(f"hidden_size must be even for sin/cos pairs, got {hidden_size}")
        if not is_number(base) or base <= 1:
            raise InputError(
                f"base must be a finite number > 1, got {base!r}: the wavelengths 2π · base^(2i/E) must grow with the "
                "channel (10000 in 'Attention is all you need')"
            )
        self.base = float(base)

    def forward(self, position_ids: torch.Tensor | Positions) -> torch.Tensor:
        """``position_ids``: integer ``[...]`` (>= 0) or Positions -> fp32 ``[..., hidden_size]``."""
        ids = position_ids.ids if isinstance(position_ids, Positions) else P.integer_positions(position_ids)
        exponent = torch.arange(0, self.hidden_size, 2, dtype=torch.float64, device=ids.device) / self.hidden_size
        angle = ids.to(torch.float64)[..., None] / self.base**exponent
        return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2).to(torch.float32)
