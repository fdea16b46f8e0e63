"""Checks that never synchronise: on accelerators, bad input sets a device-side flag instead of raising.

On the CPU, reading a value to check it costs nothing, and every check raises at once, where the
value entered. On a GPU, the same read is a device-to-host synchronisation: it stalls the host until
the GPU catches up, and it cannot be captured in a CUDA graph. There, rotary records what a check
finds in a small int64 tensor per device (the *flags*), with device operations only, and raises
later, at a point where a synchronisation is wanted anyway:

- :func:`check_device_errors` (public): raises :class:`DeviceInputError` naming every check that
  failed since the last call, and clears the flags. Call it where your loop reads something back
  anyway (a logged loss, the end of ``generate``; :meth:`rotary.models.Decoder.generate` calls it);
- positions are not among the checks: any int64 position is a rotation, and the kernels compute the
  row of a position a :class:`rotary.RoPE`'s cached table does not hold; a position outside a table a
  caller made gives NaN in that token's rotated channels (the caller's contract, nothing to poll).

Where each check lives:

- tables a caller made (:func:`rotary.apply_rotary`): once per tensor version, a few sampled rows
  (:func:`check_tables_once`);
- a ``cos_sin_cache`` given to :func:`rotary.rotate_and_cache`: the rows its tokens read, NaN or inf;
- hand-made :class:`~rotary.positions.Positions`, attention masks, ``cu_seqlens``, token ids
  (:class:`rotary.models.Decoder`, whose embedding then reads unknown ids as 0), writes past the end
  of a :class:`rotary.nn.StaticKVCache`, :meth:`~rotary.models.Decoder.generate`'s prompt padding:
  device operations feeding :func:`record`.

``validate="sync"`` (on :func:`rotary.apply_rotary`) keeps the immediate host checks on every device,
for debugging.
"""

from __future__ import annotations

import threading

import torch

from .errors import DeviceInputError

__all__ = [
    "CHECKS",
    "DeviceInputError",
    "check_device_errors",
    "flags",
    "host_checks",
    "TABLES_SLOT",
    "POSITIONS_SLOT",
    "CU_SEQLENS_SLOT",
    "MASK_SLOT",
    "TOKENS_SLOT",
    "CACHE_SLOT",
    "XPOS_RANGE_SLOT",
    "XPOS_FP16_SLOT",
    "COORDINATES_SLOT",
    "ANGLES_SLOT",
    "LEARNED_POSITION_SLOT",
    "PROMPT_SLOT",
    "CACHE_GROUP_SLOT",
    "COS_SIN_CACHE_SLOT",
    "LEARNED_SLOT",
    "record",
]

#: the deferred checks: flag slot -> what failed (the message of :class:`DeviceInputError`)
CHECKS: dict[int, str] = {
    2: "cos/sin tables passed to apply_rotary are not rotation tables for the requested pairing (NaN/inf, "
    "zeros, cos²+sin² not constant, the other pairing's layout, or cos and sin swapped); check them on the "
    "host with rotary.check_tables(cos, sin, interleaved=...) or apply_rotary(..., validate='sync')",
    3: "position ids (Positions, position_ids, seqlen_offsets) that are negative or inconsistent with what "
    "they claim (bound, start)",
    4: "cu_seqlens that do not start at 0, decrease, or do not end at the number of packed tokens, or a "
    "sequence longer than the max_seqlen given",
    5: "an attention mask holding values other than 0 and 1",
    6: "token ids outside the vocabulary (negative, or >= vocab_size); their embeddings were read as 0",
    7: "KV-cache writes outside the cache: slots given to rotate_and_cache that are negative or at or past its "
    "length (those tokens' keys and values were not written), or more tokens written to a rotary.nn.StaticKVCache "
    "than it has slots (max_len; the attention outputs of the tokens past the end are NaN and they were not "
    "cached). Size the cache for every token you write (Decoder.new_cache(batch=..., max_len=...)), or reset() a "
    "static cache before reusing it",
    8: "xPos positions further than XPos.max_distance from XPos.center: the scales ζ^(±(n - c)/γ) leave fp32's "
    "range there (query tables underflow to 0, key tables overflow to inf); build XPos with a larger scale_base "
    "or a center nearer these positions",
    9: "xPos positions further than XPos.fp16_max_distance from XPos.center with float16 inputs: the scales reach "
    "2**14 there and the rotated q/k overflow fp16 to inf; use bfloat16 or float32 inputs, a larger scale_base "
    "or a center nearer these positions",
    10: "coordinates of an AxialRoPE / RoPEMixed holding NaN or inf (their tables are NaN); mark tokens that take "
    "no rotation with identity= instead",
    11: "AxialRoPE / RoPEMixed coordinates (after augmentation, in training mode) times frequencies give rotation "
    "angles beyond float64's range (cos/sin are NaN); use smaller coordinates, augmentation ranges or frequencies",
    12: "position ids at or past a LearnedPositionEmbedding's max_position (a learned table cannot extrapolate); "
    "their embeddings are NaN. Build the model with a larger max_position",
    13: "a generate() prompt whose attention_mask marks no token in a row, or padding after a row's tokens (right "
    "padding); those rows continued from padding. Pad prompts on the left (tokenizer.padding_side = 'left') and "
    "give every row at least one token",
    14: "static caches of one Decoder.new_cache call that were filled to different lengths (one was reset() or "
    "written alone): the model's layers share one attention mask over them, which was not every layer's. Write "
    "and reset them together, through the model (or make one cache per layer with StaticKVCache(...) yourself)",
    15: "cos_sin_cache rows holding NaN or inf, read by the positions given with them to rotate_and_cache; the rotated "
    "channels of those tokens are NaN or inf. Build the table from finite cos/sin values (check it once where you build it: "
    "torch.isfinite(cos_sin_cache).all())",
}
SLOTS = 16  # 0 and 1 are free: positions past a RoPE's tables are computed, never flagged
TABLES_SLOT, POSITIONS_SLOT, CU_SEQLENS_SLOT, MASK_SLOT, TOKENS_SLOT, CACHE_SLOT = 2, 3, 4, 5, 6, 7
# the variants' checks (rotary.variants, rotary.nn.position)
XPOS_RANGE_SLOT, XPOS_FP16_SLOT, COORDINATES_SLOT, ANGLES_SLOT, LEARNED_POSITION_SLOT = 8, 9, 10, 11, 12
# the decoder's (rotary.models): generate() prompts; learned positions share the variants' slot; static caches
# of one group that are out of step (rotary.nn.StaticStep)
PROMPT_SLOT, LEARNED_SLOT, CACHE_GROUP_SLOT = 13, LEARNED_POSITION_SLOT, 14
# rotary.rotate_and_cache: the cos_sin_cache rows its tokens read
COS_SIN_CACHE_SLOT = 15

_lock = threading.Lock()
_flags: dict[torch.device, torch.Tensor] = {}


def host_checks(device: torch.device) -> bool:
    """Whether checks on tensors of ``device`` read values on the host (the CPU: free) rather than
    being deferred to the device flags (any accelerator, and the meta device, which has no values).

    Example:
        >>> host_checks(torch.device("cpu")), host_checks(torch.device("meta"))
        (True, False)
    """
    return device.type == "cpu"


def flags(device: torch.device) -> torch.Tensor:
    """The int64 ``[SLOTS]`` flag tensor of ``device`` (made on first use; reused ever after, so it
    may be made before a CUDA graph is captured and written inside it).

    Slot 0 counts failed position checks, slot 1 holds the largest offending position, the others
    are 0/1 per check of :data:`CHECKS`.
    """
    device = _device(device)
    found = _flags.get(device)
    if found is None:
        with _lock, torch.inference_mode(False):
            found = _flags.get(device)
            if found is None:
                found = torch.zeros(SLOTS, dtype=torch.int64, device=device)
                _flags[device] = found
    return found


def record(slot: int, bad: torch.Tensor) -> None:
    """Set flag ``slot`` of ``bad``'s device where any element of the boolean ``bad`` is true: device
    operations only, no synchronisation. Skipped under ``torch.compile`` tracing, which checks what
    it can in the graph (``torch._assert_async``)."""
    if torch.compiler.is_compiling() or bad.device.type == "meta" or not bad.numel():
        return
    with torch.no_grad():
        flag = flags(bad.device)
        flag[slot : slot + 1].bitwise_or_(bad.any().reshape(1).long())


def _device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def check_device_errors(device: torch.device | str | None = None) -> None:
    """Raise :class:`DeviceInputError` if a deferred check failed on ``device`` (default: every device
    with flags) since the last call, and clear the flags. One device-to-host read per device.

    Raises:
        DeviceInputError: naming each failed check and what to change.

    Example:
        >>> check_device_errors()  # nothing failed: returns None
    """
    devices = list(_flags) if device is None else [_device(device)]
    problems = []
    for dev in devices:
        found = _flags.get(dev)
        if found is None:
            continue
        values = found.tolist()  # the one synchronisation
        if not any(values):
            continue
        found.zero_()
        for slot, message in CHECKS.items():
            if values[slot]:
                problems.append(f"on {dev}: {message}")
    if problems:
        raise DeviceInputError("rotary: bad input found by deferred checks: " + "; ".join(problems))
