"""Positions: where each token sits, validated once where they enter and passed on as :class:`Positions`.

Every way a model says where its tokens are ends up here: explicit ``position_ids`` (:func:`from_ids`), the
default ``offset + arange(S)`` (:func:`arange`, no device read), left padding from an attention mask
(:func:`from_attention_mask`), packed sequences from ``cu_seqlens`` (:func:`from_cu_seqlens`), continuation
after a KV cache (:func:`continuation`), N-D coordinates and grids (:func:`grid`); :func:`from_call` picks one.

A :class:`Positions` carries ``bound``, a host int with every id ``< bound``: tables are sized from it, so
nothing downstream reads positions back from the device or validates them again. The factories validate what
they are given, ``Positions(...)`` made by hand is checked against its own claims with one device read, and
:meth:`Positions.unchecked` is the one door without checks, for producers deriving positions from validated ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import devices
from ._checks import check_bool, check_int, check_positive_int
from .errors import InputError, InputTypeError

#: the largest position: positions are multiplied by frequencies in float64, exact for integers up to 2**53
MAX_POSITION = 2**53


def _check_max_position(high: int, what: str) -> None:
    """Refuse a largest position past :data:`MAX_POSITION`; ``what`` names where it came from."""
    if high > MAX_POSITION:
        raise InputError(
            f"{what} reach {high}, past the largest position rotary represents, 2**53 (float64 angles are "
            "exact only up to there)"
        )


__all__ = [
    "Positions",
    "arange",
    "check_position_ids",
    "continuation",
    "from_attention_mask",
    "from_call",
    "from_cu_seqlens",
    "from_ids",
    "grid",
    "integer_positions",
    "MAX_POSITION",
]


@dataclass(frozen=True, eq=False)  # tensors inside: equality is identity, not an ambiguous tensor comparison
class Positions:
    """Validated positions of the tokens of one call (made by this module's factories; see the module docstring).

    Attributes:
        ids: int64 ``[S]`` (shared by the batch), ``[B, S]`` or packed ``[T]``; with ``axes > 1`` a trailing
            axis of coordinates ``[..., A]``.
        bound: every id is ``< bound`` (a host int); ``None`` when unknown without a device read (``torch.compile``).
        axes: coordinates per token ``A`` (1 for text).
        start: for :func:`arange` positions, the first one (ids ``start .. start + S - 1``: tables are a slice).
        packed: the ids belong to packed sequences ``[T]``.
        exact: ``bound`` is exactly ``max(ids) + 1`` (length-dependent scaling needs that), not an upper bound.

    Raises:
        rotary.errors.InputTypeError: ids that are not an int64/int32 tensor; a flag that is not a bool.
        rotary.errors.InputError: a shape that does not fit ``axes``/``packed``, a negative id, an id at or past
            ``bound``, an ``exact`` bound that is not ``max(ids) + 1``, ids that are not ``start .. start + S - 1``.

    Example:
        >>> p = arange(4, offset=10)
        >>> p.ids.tolist(), p.bound, p.start
        ([10, 11, 12, 13], 14, 10)
        >>> Positions(torch.tensor([5, 6, 7]), 8, start=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rotary.errors.InputError: Positions: start=0 says the ids are 0 .. 2, but they are not (first id 5); pass ...
    """

    ids: torch.Tensor
    bound: int | None
    axes: int = 1
    start: int | None = None
    packed: bool = False
    exact: bool = True

    def __post_init__(self) -> None:
        ids = _integer_ids(self.ids, "Positions.ids")
        check_positive_int(self.axes, "Positions.axes")
        packed, exact = check_bool(self.packed, "Positions.packed"), check_bool(self.exact, "Positions.exact")
        per_token = ids.dim() - (1 if self.axes > 1 else 0)
        if per_token not in ((1,) if packed else (1, 2)) or (self.axes > 1 and ids.shape[-1] != self.axes):
            want = "[T]" if packed else "[S] or [B, S]"
            want = want.replace("]", f", {self.axes}]") if self.axes > 1 else want
            raise InputError(
                f"Positions.ids must be {want} (axes={self.axes}, packed={packed}), got shape {tuple(ids.shape)}"
            )
        if self.bound is not None:
            check_int(self.bound, "Positions.bound", minimum=0)
        if self.start is not None:
            check_int(self.start, "Positions.start", minimum=0)
            if self.axes != 1 or ids.dim() != 1:
                raise InputError(
                    f"Positions.start is for shared 1-D ids [S] made by arange, got ids of shape {tuple(ids.shape)}"
                )
        object.__setattr__(self, "ids", ids.long())
        if torch.compiler.is_compiling() or not ids.numel() or ids.device.type == "meta":
            return
        if not devices.host_checks(ids.device):  # not read: the claims are the caller's contract there
            return
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0:
            raise InputError(f"Positions.ids must be >= 0, got a minimum of {low}")
        _check_max_position(high, "Positions.ids")
        if self.bound is not None and high >= self.bound:
            raise InputError(
                f"Positions: an id is {high} but bound={self.bound} says every id is below it; pass bound >= {high + 1}"
            )
        if self.bound is not None and exact and self.bound != high + 1:
            raise InputError(
                f"Positions: exact=True says bound is max(ids) + 1 = {high + 1}, got bound={self.bound}; "
                "pass the exact bound, or exact=False for an upper bound"
            )
        if self.start is not None and not torch.equal(
            ids, torch.arange(self.start, self.start + ids.numel(), device=ids.device)
        ):
            raise InputError(
                f"Positions: start={self.start} says the ids are {self.start} .. {self.start + ids.numel() - 1}, but "
                "they "
                f"are not (first id {int(ids[0])}); pass start=None or start={int(ids[0])}"
            )

    @classmethod
    def unchecked(
        cls,
        ids: torch.Tensor,
        bound: int | None,
        axes: int = 1,
        start: int | None = None,
        packed: bool = False,
        exact: bool = True,
    ) -> Positions:
        """Positions made without any check, for producers deriving them from validated positions (the caller vouches).

        Example:
            >>> p = arange(3)
            >>> Positions.unchecked(p.ids[1:], p.bound, exact=False).ids.tolist()
            [1, 2]
        """
        positions = object.__new__(cls)
        for name, value in (
            ("ids", ids),
            ("bound", bound),
            ("axes", axes),
            ("start", start),
            ("packed", packed),
            ("exact", exact),
        ):
            object.__setattr__(positions, name, value)
        return positions

    @property
    def seq_len(self) -> int:
        """Tokens per sequence ``S`` (packed: all tokens ``T``)."""
        return self.ids.shape[-2] if self.axes > 1 else self.ids.shape[-1]

    @property
    def batch(self) -> int | None:
        """The batch size the ids are given for, or ``None`` when shared by every batch row."""
        per_token = self.ids.dim() - (1 if self.axes > 1 else 0)
        return self.ids.shape[0] if per_token == 2 else None

    def to(self, device: torch.device | str) -> Positions:
        """The same positions on ``device``."""
        if self.ids.device == torch.device(device):
            return self
        return Positions.unchecked(self.ids.to(device), self.bound, self.axes, self.start, self.packed, self.exact)


def _integer_ids(position_ids: object, name: str) -> torch.Tensor:
    if not isinstance(position_ids, torch.Tensor):
        raise InputTypeError(f"{name} must be an integer tensor, got {type(position_ids).__name__}")
    dtype = position_ids.dtype
    if position_ids.is_floating_point() or position_ids.is_complex() or dtype == torch.bool:
        raise InputTypeError(
            f"{name} must have an integer dtype (int64 or int32), got {dtype}; float positions round "
            "(bf16 turns 257 into 256)"
        )
    if dtype == torch.uint8:
        raise InputTypeError(
            f"{name} must be int64 or int32, got torch.uint8 (torch indexes with uint8 as a boolean mask)"
        )
    if dtype not in (torch.int64, torch.int32):  # int16 / int8 overflow at small positions
        raise InputTypeError(f"{name} must be int64 or int32, got {dtype}; convert with .long()")
    return position_ids


def _read_range(ids: torch.Tensor, name: str, signed: bool = False) -> tuple[int | None, torch.Tensor]:
    """``(max(ids) + 1, ids)`` with one read on the CPU; the bound is ``None`` elsewhere (accelerators, the meta
    device, ``torch.compile``), where nothing is read. Unless ``signed`` the ids must be >= 0: raised on the
    CPU (:func:`_check_nonnegative`: the smallest id is named, eager and compiled alike), the caller's contract
    on accelerators (nothing read), an assertion in a compiled graph off the CPU. Compiled on the CPU the check
    is an op in the graph (``rotary::checked_ids``) whose output the caller uses in place of ``ids``.
    ``signed`` (ids that only address rotations, any integer valid): no check, and ``None`` when an id
    is negative (no cached row holds it: its row is computed)."""
    if torch.compiler.is_compiling():
        if not signed:
            if devices.host_checks(ids.device):  # eager's check and error, when the graph runs
                return None, checked_ids(ids, name)
            torch._assert_async((ids >= 0).all(), name + " must be >= 0")
        return None, ids
    if not devices.host_checks(ids.device):  # no values read here (meta has none, a GPU would sync)
        return None, ids
    if not ids.numel():
        return 0, ids
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 and not signed:
        _check_nonnegative(low, name)
    return None if low < 0 else high + 1, ids


def _check_nonnegative(low: int, name: str) -> None:
    """Refuse ids whose smallest value ``low`` is negative (several bad ids: the smallest is named)."""
    if low < 0:
        raise InputError(f"{name} must be >= 0, got a minimum of {low}")


@torch.library.custom_op("rotary::checked_ids", mutates_args=())
def checked_ids(ids: torch.Tensor, name: str) -> torch.Tensor:
    """Integer positions of a compiled call on the CPU, checked as the eager call checks them (an
    :class:`~rotary.errors.InputError` naming the smallest id when it is negative), returned as a new tensor
    that the call reads in place of ``ids`` (so the check stays in the graph)."""
    if ids.numel():
        _check_nonnegative(int(ids.min()), name)
    return ids.clone()


@checked_ids.register_fake
def _(ids, name):
    return torch.empty_like(ids)


def integer_positions(position_ids: torch.Tensor, *, name: str = "position_ids") -> torch.Tensor:
    """Validate integer positions of any shape (int64/int32, >= 0) and return them as int64 (one device read).

    For position-dependent values that are not rotations (Llama 4's NoPE temperature); rotations take :func:`from_ids`.

    Example:
        >>> integer_positions(torch.tensor([[3], [4]], dtype=torch.int32)).dtype
        torch.int64
    """
    return _read_range(_integer_ids(position_ids, name).long(), name)[1]


def check_position_ids(position_ids: torch.Tensor, *, name: str = "position_ids") -> torch.Tensor:
    """Validate integer positions ``[S]`` or ``[B, S]`` (int64/int32, >= 0) and return them.

    Example:
        >>> check_position_ids(torch.tensor([0, 1, 2])).tolist()
        [0, 1, 2]
    """
    return from_ids(position_ids, name=name).ids


def from_ids(
    position_ids: torch.Tensor | Positions,
    *,
    batch: int | None = None,
    seq_len: int | None = None,
    axes: int = 1,
    packed: bool = False,
    device: torch.device | None = None,
    name: str = "position_ids",
    kernel_checked: bool = False,
) -> Positions:
    """Validate explicit positions.

    Args:
        position_ids: int64/int32 ``[S]`` or ``[B, S]`` (``[T]`` when ``packed``), ``[..., A]`` when ``axes > 1``;
            all ``>= 0``. A :class:`Positions` is checked against ``batch``/``seq_len`` only.
        batch, seq_len: the inputs' ``B`` (``[B, S]`` ids must match it, or be 1) and ``S`` (or packed ``T``).
        axes: coordinates per token ``A``; packed: ids are per packed token ``[T]``.
        device: move the ids there; name: the argument's name, for messages.
        kernel_checked: the ids only address tables whose rows the kernels compute for any position: every
            integer is valid (a negative one turns by its negative angle), and ids are read only on the CPU.

    Returns:
        :class:`Positions` with int64 ids and the exact ``bound`` (one device read of min and max).

    Raises:
        rotary.errors.InputTypeError: not an integer tensor, or a dtype positions cannot be held in.
        rotary.errors.InputError: a wrong rank, a batch or length that does not fit, or a negative position.

    Example:
        >>> from_ids(torch.tensor([[0, 0, 1, 2]]), batch=1, seq_len=4).bound
        3
    """
    if isinstance(position_ids, Positions):
        positions = position_ids
    else:
        check_positive_int(axes, "axes")
        ids = _integer_ids(position_ids, name)
        coordinate = 1 if axes > 1 else 0
        ranks = (1,) if packed else (1, 2)
        if ids.dim() - coordinate not in ranks or (axes > 1 and ids.shape[-1] != axes):
            want = "[T]" if packed else "[S] or [B, S]"
            if axes > 1:
                want = want.replace("]", f", {axes}]")
            hint = ""
            if axes == 1 and ids.dim() == 3 and ids.shape[0] == 3:
                hint = (
                    "; these look like M-RoPE ids [3, B, S] (temporal, height, width), which a 1-D RoPE cannot "
                    "rotate: use rotary.MRoPE, or pass one row (ids[0]) for text"
                )
            raise InputError(f"{name} must be {want}, got shape {tuple(ids.shape)}{hint}")
        bound, ids = _read_range(ids, name, signed=kernel_checked)  # kernel_checked: any integer is a rotation
        if bound is not None and not kernel_checked:
            _check_max_position(bound - 1, name)
        positions = Positions.unchecked(ids.long(), bound, axes, None, packed)
    if positions.axes != axes:
        raise InputError(f"{name} have {positions.axes} coordinate axes but {axes} are needed")
    if seq_len is not None and positions.seq_len != seq_len:
        raise InputError(f"{name} cover S={positions.seq_len} positions but the input has S={seq_len}")
    got = positions.batch
    if batch is not None and got is not None and got not in (1, batch):
        raise InputError(f"{name} have batch {got} but the input has batch {batch}; pass [S], [1, S] or [B, S]")
    return positions if device is None else positions.to(device)


def arange(seq_len: int, *, offset: int = 0, device: torch.device | str | None = None) -> Positions:
    """The default positions ``offset .. offset + seq_len - 1`` (no device read).

    Example:
        >>> arange(3, offset=2).ids.tolist()
        [2, 3, 4]
    """
    check_int(seq_len, "seq_len", minimum=0)
    check_int(offset, "offset", minimum=0)
    if (
        offset + seq_len - 1 > MAX_POSITION
    ):  # the message is formatted only then (a symbolic offset under torch.compile)
        _check_max_position(offset + seq_len - 1, f"offset={offset} with {seq_len} tokens")
    ids = torch.arange(offset, offset + seq_len, device=device)
    return Positions.unchecked(ids, offset + seq_len, 1, offset)


def from_attention_mask(attention_mask: torch.Tensor) -> Positions:
    """Positions that skip padding: ``cumsum(mask) - 1`` clamped at 0, int64 ``[B, T]``.

    With left padding the first real token of every row gets position 0, as if unpadded.

    Args:
        attention_mask: ``[B, T]``, bool or integer 1 (token) / 0 (padding).

    Example:
        >>> from_attention_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])).ids
        tensor([[0, 0, 0, 1],
                [0, 1, 2, 3]])
    """
    mask = check_attention_mask(attention_mask)
    return Positions.unchecked((mask.long().cumsum(-1) - 1).clamp(min=0), max(mask.shape[-1], 1), exact=False)


def check_attention_mask(attention_mask: torch.Tensor, *, name: str = "attention_mask") -> torch.Tensor:
    """A ``[B, T]`` mask of 1 (attend) / 0 (padding), bool or integer, returned as bool; additive float masks are
    refused.
    """
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        raise InputError(
            f"{name} must be a [B, T] tensor of 1 (attend) / 0 (padding), got "
            f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}"
        )
    if attention_mask.dtype != torch.bool:
        if attention_mask.is_floating_point() or attention_mask.is_complex():
            raise InputError(
                f"{name} must be bool or integer 0/1, got dtype {attention_mask.dtype}; "
                "additive float masks are not accepted (for a 0 / -inf mask pass mask == 0 as a bool tensor)"
            )
        # a value check reads the data: on the CPU only (under torch.compile it would break the graph, on
        # an accelerator it would synchronise); elsewhere 0/1 values are the caller's contract (nonzero attends)
        if not torch.compiler.is_compiling() and devices.host_checks(attention_mask.device):
            if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
                raise InputError(f"{name} must hold only 0 and 1 (or be bool)")
        attention_mask = attention_mask.bool()
    return attention_mask


def from_cu_seqlens(cu_seqlens: torch.Tensor, total: int, *, max_seqlen: int | None = None) -> Positions:
    """Per-token positions ``[total]`` of packed sequences, restarting at 0 at every boundary.

    Checked at once on the CPU; elsewhere nothing is read (well-formed ``cu_seqlens`` are the caller's contract)
    and the bound is ``max_seqlen`` when given, else unknown.

    Args:
        cu_seqlens: integer ``[N + 1]``: ``0, len_0, len_0 + len_1, ..., total``.
        total: the number of packed tokens ``T``.
        max_seqlen: the longest sequence, if known (an upper bound of the positions).

    Example:
        >>> p = from_cu_seqlens(torch.tensor([0, 3, 5]), 5)
        >>> p.ids.tolist(), p.bound
        ([0, 1, 2, 0, 1], 3)
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.is_floating_point() or cu_seqlens.dtype == torch.bool:
        raise InputTypeError(f"cu_seqlens must be an integer tensor [N + 1], got {cu_seqlens!r:.80}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise InputError(f"cu_seqlens must be 1-D [N + 1] with N >= 1 sequences, got shape {tuple(cu_seqlens.shape)}")
    given = max_seqlen is not None
    if given:
        check_int(max_seqlen, "max_seqlen", minimum=0)
    cu = cu_seqlens.to(torch.int64)
    if not torch.compiler.is_compiling() and devices.host_checks(cu.device):
        lengths = cu.diff()
        if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
            raise InputError(
                f"cu_seqlens must start at 0, never decrease and end at the {total} packed tokens; "
                f"got {cu_seqlens.tolist() if cu.numel() <= 16 else cu_seqlens}"
            )
        longest = int(lengths.max())
        if max_seqlen is not None and max_seqlen < longest:
            raise InputError(f"max_seqlen={max_seqlen} but cu_seqlens holds a sequence of {longest} tokens")
        given = given and max_seqlen != longest
        max_seqlen = longest if max_seqlen is None else max_seqlen
    token = torch.arange(total, device=cu.device)
    sequence = torch.searchsorted(cu[1:], token, right=True)
    # a max_seqlen given by the caller may exceed the longest sequence (then it is only a bound)
    return Positions.unchecked(token - cu[sequence], max_seqlen, 1, None, True, exact=not given)


def from_call(
    *,
    batch: int,
    seq_len: int,
    packed: bool,
    device: torch.device,
    position_ids: torch.Tensor | Positions | None = None,
    offset: int = 0,
    seqlen_offsets: int | torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    default: bool = True,
) -> Positions | None:
    """The positions of a call's tokens, from whichever one argument names them (``RoPE.forward``, ``apply_rotary``).

    ``position_ids`` (``[S]`` / ``[B, S]`` / packed ``[T]``, or :class:`Positions`); ``offset`` (int:
    ``offset + arange(S)``); ``seqlen_offsets`` (int or int ``[B]`` / ``[N]``: each sequence's start, as
    flash-attn); ``cu_seqlens`` (with ``max_seqlen``): packed sequences; none: ``arange(S)`` when ``default``,
    else ``None`` (the caller's tables hold the tokens' own rows).

    Args:
        batch, seq_len: the inputs' ``B`` and ``S`` (packed: ``1`` and ``T``).
        packed: the inputs are packed ``[T, H, D]``.
        device: where the positions must live (the inputs' device).

    Returns:
        :class:`Positions` on ``device`` (validated on the CPU; elsewhere nothing is read), or ``None``.

    Example:
        >>> cpu = torch.device("cpu")
        >>> from_call(batch=2, seq_len=3, packed=False, device=cpu, offset=4).ids.tolist()
        [4, 5, 6]
        >>> p = from_call(batch=1, seq_len=5, packed=True, device=cpu, cu_seqlens=torch.tensor([0, 2, 5]))
        >>> p.ids.tolist(), p.bound
        ([0, 1, 0, 1, 2], 3)
    """
    named = [
        n
        for n, v in (("position_ids", position_ids), ("seqlen_offsets", seqlen_offsets), ("cu_seqlens", cu_seqlens))
        if v is not None
    ]
    if not isinstance(offset, int) or isinstance(offset, bool) or offset != 0:
        named.append("offset")
    if len(named) > 1 and named != ["seqlen_offsets", "cu_seqlens"]:
        named = [f"offset={offset!r}" if n == "offset" else n for n in named]  # formatted only for the message
        raise InputError(
            f"{' and '.join(named)} each give positions; pass one (position_ids = offset + arange(S) for a shifted "
            "start; seqlen_offsets may go with cu_seqlens, one offset per packed sequence)"
        )
    if cu_seqlens is not None:
        if not packed:
            raise InputError(
                f"cu_seqlens marks packed sequences: the inputs must be [total_tokens, H, D], got a batch of {batch} "
                f"x {seq_len}"
            )
        if not isinstance(cu_seqlens, torch.Tensor):
            raise InputTypeError(f"cu_seqlens must be an integer tensor [N + 1], got {type(cu_seqlens).__name__}")
        positions = from_cu_seqlens(cu_seqlens.to(device), seq_len, max_seqlen=max_seqlen)
        if seqlen_offsets is None:
            return positions
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
        sequence = torch.searchsorted(cu[1:], torch.arange(seq_len, device=device), right=True)
        starts = _offsets(seqlen_offsets, cu.numel() - 1, device)
        return from_ids(positions.ids + starts[sequence], packed=True)
    if position_ids is not None:
        # their fit to [B, S] (or [T]) is checked where the layout is known, to name the layout that fits
        return from_ids(position_ids, packed=packed and _rank(position_ids) == 1, device=device, kernel_checked=True)
    if packed and (seqlen_offsets is not None or default):
        what = (
            "seqlen_offsets with packed inputs needs"
            if seqlen_offsets is not None
            else "packed [total_tokens, H, D] inputs need"
        )
        raise InputError(
            f"{what} cu_seqlens or per-token position_ids [total_tokens] (with cu_seqlens, positions restart per "
            "sequence)"
        )
    if seqlen_offsets is not None:
        starts = _offsets(seqlen_offsets, batch, device)
        ids = starts[:, None] + torch.arange(seq_len, device=device)
        if isinstance(seqlen_offsets, int):  # one host-known start: a bound without reading anything
            return Positions.unchecked(ids, seqlen_offsets + seq_len, exact=True)
        return from_ids(ids, name="seqlen_offsets", kernel_checked=True)
    if not default:
        return None
    check_int(offset, "offset", minimum=0)
    return arange(seq_len, offset=offset, device=device)


def _rank(ids: torch.Tensor | Positions) -> int:
    return ids.ids.dim() if isinstance(ids, Positions) else getattr(ids, "ndim", 0)


def _offsets(seqlen_offsets: int | torch.Tensor, count: int, device: torch.device) -> torch.Tensor:
    """``seqlen_offsets`` as int64 ``[count]`` (an int for all sequences, or one per sequence), >= 0."""
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.dim() != 1 or seqlen_offsets.shape[0] != count:
            raise InputError(
                f"seqlen_offsets must be an int or an integer tensor [{count}] (one per sequence), got shape "
                f"{tuple(seqlen_offsets.shape)}"
            )
        # a negative offset makes negative positions, which the rotation kernels check
        return from_ids(seqlen_offsets, name="seqlen_offsets", kernel_checked=True).ids.to(device)
    check_int(seqlen_offsets, "seqlen_offsets", minimum=0)
    return torch.full((count,), seqlen_offsets, dtype=torch.int64, device=device)


def continuation(previous: Positions, seq_len: int) -> Positions:
    """Positions ``[B, S]`` continuing each row after its last position in ``previous`` (a KV cache).

    Args:
        previous: the cached tokens' positions, ids ``[B, T]`` (``T >= 1``) or ``[T]``.
        seq_len: new tokens ``S``.

    Example:
        >>> continuation(from_ids(torch.tensor([[0, 0, 1]])), 2).ids
        tensor([[2, 3]])
    """
    check_int(seq_len, "seq_len", minimum=0)
    if not isinstance(previous, Positions):
        raise InputTypeError(f"previous must be Positions (e.g. from_ids(position_ids)), got {type(previous).__name__}")
    if previous.axes != 1 or previous.ids.shape[-1] == 0:
        raise InputError("continuation needs the 1-D positions of at least one cached token")
    last = previous.ids[..., -1:]
    ids = last + torch.arange(1, seq_len + 1, device=last.device)
    bound = None if previous.bound is None else previous.bound + seq_len
    return Positions.unchecked(ids, bound, exact=previous.exact)


def grid(*sizes: int, device: torch.device | str | None = None) -> Positions:
    """Integer coordinates of a grid, row-major: ``grid(h, w)`` gives ``[h * w, 2]`` (y, x) pairs.

    ``grid(t, h, w)`` gives ``[t * h * w, 3]`` (video). One axis gives the 1-D positions ``[n]``.

    Example:
        >>> grid(2, 3).ids.tolist()
        [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    if not sizes:
        raise InputError("grid needs at least one size, e.g. grid(h, w)")
    for i, size in enumerate(sizes):
        check_positive_int(size, f"grid size {i}")
    axes = [torch.arange(n, device=device) for n in sizes]
    if len(sizes) == 1:  # text: A = 1 has no coordinate axis
        return Positions.unchecked(axes[0], sizes[0], 1, 0)
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))
    return Positions.unchecked(coords, max(sizes), len(sizes))
