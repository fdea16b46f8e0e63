"""``RoPE``: frequencies + schedule + table cache -> ``tables(positions)``; ``forward`` rotates q and k.

    positions ──► RoPE.tables(positions) ──► RotaryTables ──► rotary.rotate(xs, tables) ──► kernels
                  (frequencies of the call,                   (one call for q and k)
                   cached rows or computed rows)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from . import deferred
from . import positions as P
from ._checks import check_bool, check_choice, check_positive_int
from ._limits import MAX_TABLE_BYTES, check_bytes
from ._sync import CopyableLock
from .frequencies import Frequencies, frequencies
from .hf_config import read_hf_config
from .positions import Positions
from .rope_types import ConfigError
from .rotation import Layout, check_layout, decode_fast, decode_seq_axis, rotate, split_heads
from .schedule import FrequencySchedule
from .tables import RotaryTables, TableCache, cos_sin_table, indexed_device, table_dtype

__all__ = ["RoPE", "keep_float32"]

#: rows a table cache grows to at most; positions beyond get their rows computed per call
CACHE_ROWS = 1 << 16

#: what to do instead of editing ``rope.inv_freq``, for the errors saying it is read-only
_OTHER_FREQUENCIES = (
    "to rotate with other frequencies build a new RoPE (rotary.RoPE(head_dim, base=..., scaling={...}) or "
    "rope.with_scaling({...})), or train them with learnable_frequencies=True"
)


def keep_float32(parameters: Sequence[nn.Parameter], apply: Callable[[], Any]) -> None:
    """Run ``apply`` (a module's ``nn.Module._apply``) and keep ``parameters`` fp32 with their values.

    ``model.to(torch.bfloat16)`` casts every floating parameter; learned frequencies rounded to bf16
    (8 bits of mantissa) move every angle by up to 0.4%. The parameters keep their fp32 values and
    follow the device change; device moves, ``to_empty()`` (meta-device models) and dtype-free calls
    are left as ``apply`` made them. The ``Parameter`` objects stay the same (optimizers keep them).

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> keep_float32([m.weight], lambda: torch.nn.Module._apply(m, lambda t: t.to(torch.bfloat16)))
        >>> m.weight.dtype, m.bias.dtype
        (torch.float32, torch.bfloat16)
    """
    # detached aliases: _apply swaps the storage of the parameter and of its grad, not of these
    saved = [(p, p.detach(), None if p.grad is None else p.grad.detach()) for p in parameters]
    apply()
    for p, data, grad in saved:
        if p.dtype == torch.float32:
            continue  # a device move or to_empty(): nothing to undo
        p.grad = None  # a grad of the cast dtype could not be assigned back beside fp32 data
        p.data = data.to(p.device)
        if grad is not None:
            p.grad = grad.to(p.device, torch.float32)


def _mrope_message(settings: Any) -> str:
    """Why :meth:`RoPE.from_hf_config` refuses a multimodal-RoPE config, and the exact calls to use instead."""
    section = list(settings.mrope_section)
    layout = "interleaved as in Qwen3-VL" if settings.mrope_interleaved else "in chunks as in Qwen2-VL and Qwen2.5-VL"
    args = [str(settings.head_dim), f"base={settings.base!r}"]
    if settings.rotary_dim is not None:
        args.append(f"rotary_dim={settings.rotary_dim}")
    if dict(settings.scaling) != {"rope_type": "default"}:
        args.append(f"scaling={dict(settings.scaling)!r}")
    if settings.interleaved:
        args.append("interleaved=True")
    return (
        f"model_type {settings.model_type!r} uses multimodal RoPE (M-RoPE): mrope_section {section} (laid out {layout}) "
        "gives each frequency slot the temporal, height or width position of a token, which a 1-D RoPE cannot "
        "represent; load it with rotary.MRoPE.from_hf_config(config) and pass positions [3, B, S] "
        "(rotary.multimodal_positions(...) builds them for text, images and videos). On text alone (t = h = w) its "
        f"tables equal those of rotary.RoPE({', '.join(args)}), if a 1-D RoPE of the text positions is what you want"
    )


class RoPE(nn.Module):
    """Rotary position embedding for the q and k of attention.

    Tables are fp32 (float64 for float64 inputs) and built from float64 angles. Rows for positions
    below ``max(max_position, 65536)`` are cached per device, the cache growing by doubling as
    longer positions arrive; rows of positions beyond are computed per call for the tokens at hand
    (one decoding step at position 2**40 costs microseconds, not a table of 2**40 rows).
    ``.to(bfloat16)`` on a model leaves ``inv_freq`` and the tables in fp32. One ``RoPE`` may be
    shared by layers and by threads.

    Args:
        head_dim: channels per head ``D`` (even).
        base: RoPE base ``theta`` (> 0); default the scaling block's ``rope_theta``, else 10000.
        rotary_dim: channels rotated ``r`` (even, ``<= D``); the other ``D - r`` pass through.
        scaling: Hugging Face-style scaling block, e.g. ``{"rope_type": "yarn", "factor": 4.0, ...}``.
        interleaved: ``False``: pairs (i, i + r/2) (Hugging Face, GPT-NeoX); ``True``: pairs
            (2i, 2i + 1) (the paper, RoFormer, GPT-J, Meta LLaMA).
        max_position: initial cache length: the first call builds the tables of positions
            ``0 .. max_position - 1`` (fp32 cos and sin, ``8 * max_position * rotary_dim`` bytes, at
            most 4 GiB: a larger value is a ``ValueError`` here). Not a limit on positions.
        dynamic: how length-dependent types (``dynamic``, ``longrope``) follow the sequence length.
            ``"hf"`` (default) replays transformers' state machine call for call: dynamic NTK
            recomputes when ``max(position_ids) + 1`` exceeds the longest length seen so far and resets
            to the trained frequencies when a call is shorter than ``max_position_embeddings``;
            LongRoPE uses the long factors while the length exceeds
            ``original_max_position_embeddings``. ``"stateless"`` computes the frequencies from the
            current call's length only (see docs/scaling.md on huggingface/transformers#25104).
        strict: ``False`` turns value errors in ``scaling`` into warnings.
        learnable_frequencies: train the frequencies: pair ``i`` turns with ``θ_i · exp(α_i)``, ``α``
            (``log_frequency_scale``, ``[rotary_dim // 2]``) an fp32 ``Parameter`` initialised to 0, in
            the state dict, kept fp32 by ``.to(bfloat16)``. Tables are computed per call with
            gradients (never cached) and run through the fused kernels' table-gradient path. Not
            with length-dependent scaling types (``dynamic``, ``longrope``).

    Attributes:
        inv_freq: fp32 ``[rotary_dim // 2]``, a non-persistent buffer on the module's device: the
            frequencies of the latest call, for code that reads Hugging Face's buffer. Read-only:
            the tables are computed from the frequencies the ``RoPE`` was made with
            (``rope.freqs``), so an edit could only be ignored. Assigning it
            (``rope.inv_freq = t``, ``rope.inv_freq /= 4``) raises ``AttributeError``; an in-place
            edit (``rope.inv_freq.mul_(0.5)``, through a view or ``detach()`` too) raises
            ``RuntimeError`` at the next eager call. Both restore the buffer. For other frequencies build a
            new ``RoPE`` (other ``base`` or ``scaling``, :meth:`with_scaling`) or learn them
            (``learnable_frequencies=True``).

    Example:
        >>> rope = RoPE(64)
        >>> q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)  # GQA: 8 q heads, 2 kv heads
        >>> q_rot, k_rot = rope(q, k)
        >>> q_rot.shape, k_rot.shape
        (torch.Size([2, 8, 16, 64]), torch.Size([2, 2, 16, 64]))
    """

    inv_freq: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        base: float | None = None,
        rotary_dim: int | None = None,
        scaling: Mapping[str, Any] | None = None,
        interleaved: bool = False,
        max_position: int = 2048,
        dynamic: Literal["hf", "stateless"] = "hf",
        strict: bool = True,
        learnable_frequencies: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int(max_position, "max_position")
        check_choice(dynamic, "dynamic", ("hf", "stateless"))
        # deep copies: a scaling dict edited by the caller afterwards must not change this RoPE
        self._frequency_args: dict[str, Any] = dict(
            # the block as given (a string is frequencies()' ConfigError, not a dict-conversion error)
            head_dim=head_dim, base=base, rotary_dim=rotary_dim, scaling=copy.deepcopy(scaling),
            strict=check_bool(strict, "strict"),
        )  # fmt: skip
        original = frequencies(**self._frequency_args)
        if not check_bool(learnable_frequencies, "learnable_frequencies"):  # learnable: tables never cached
            # the first call builds rows 0 .. max_position - 1 (fp32 cos and sin [max_position, r]): refuse a
            # size that cannot be built here, before torch's allocator fails on the first call
            fits = MAX_TABLE_BYTES // (8 * original.rotary_dim)
            check_bytes(
                8 * max_position * original.rotary_dim,
                f"RoPE(max_position={max_position}) with rotary_dim={original.rotary_dim}: its cos/sin table cache, "
                "built on the first call,",
                f"use max_position <= {fits} (it is the length of the table cache, not a limit on positions: rows "
                "of positions past the cache are computed per call)",
                limit=MAX_TABLE_BYTES,
            )
        self.original_freqs: Frequencies = original
        self.freqs: Frequencies = original  # the frequencies of the latest call (length-dependent types)
        self.interleaved = check_bool(interleaved, "interleaved")
        self.max_position = max_position
        self.dynamic = dynamic
        self.schedule = FrequencySchedule(self._frequency_args, original, dynamic)
        self.register_buffer("inv_freq", None, persistent=False)
        self._set_inv_freq(original.inv_freq)
        self._caches: dict[str, TableCache] = {}
        self._device_inv_freq: dict[tuple[int, torch.device], tuple[Frequencies, torch.Tensor]] = {}
        self._caches_lock = CopyableLock()
        self.learnable_frequencies = check_bool(learnable_frequencies, "learnable_frequencies")
        self.log_frequency_scale: nn.Parameter | None = None
        if learnable_frequencies:
            if self.schedule.length_dependent:
                raise ValueError(
                    f"learnable_frequencies=True cannot be combined with rope_type {original.rope_type!r}: its "
                    "frequencies are recomputed for each sequence length, so a learned factor per pair would "
                    "multiply different frequencies from call to call. Use a static type (default, linear, yarn, "
                    "llama3, ntk, proportional) or learnable_frequencies=False"
                )
            # α of θ_i · exp(α_i); fp32 whatever the model's dtype (see _apply)
            self.log_frequency_scale = nn.Parameter(torch.zeros(original.rotary_dim // 2))  # meta under torch.device("meta")
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Learnable frequencies back to the configured ones (``α = 0``); nothing else has parameters.

        Call it after ``to_empty()`` on a model built on the meta device (or load a state dict).
        """
        if self.log_frequency_scale is not None:
            with torch.no_grad():
                self.log_frequency_scale.zero_()

    @property
    def learned_inv_freq(self) -> torch.Tensor:
        """The frequencies in use, fp32 ``[rotary_dim // 2]`` on the module's device, detached:
        ``θ_i · exp(α_i)`` with learnable frequencies, else ``inv_freq``.

        Example:
            >>> rope = RoPE(8, learnable_frequencies=True)
            >>> torch.equal(rope.learned_inv_freq, rope.inv_freq)  # α starts at 0
            True
        """
        if self.log_frequency_scale is None:
            return self.inv_freq
        with torch.no_grad():
            return (self.freqs.inv_freq.to(self.inv_freq.device).double() * self.log_frequency_scale.double().exp()).float()

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        layer_type: str | None = None,
        strict: bool = True,
        dynamic: Literal["hf", "stateless"] = "hf",
        max_position: int = 2048,
        interleaved: bool | None = None,
    ) -> RoPE:
        """Build the RoPE a Hugging Face model uses, from its config (the config is never modified).

        Reads ``head_dim`` (or ``hidden_size // num_attention_heads``; DeepSeek's ``qk_rope_head_dim``),
        ``rope_theta`` (GPT-NeoX: ``rotary_emb_base``), ``partial_rotary_factor`` (GPT-NeoX:
        ``rotary_pct``; GPT-J: ``rotary_dim``), ``max_position_embeddings`` and the scaling block
        (5.x ``rope_parameters`` or 4.x ``rope_scaling``); values the file omits are filled as
        transformers fills them. The pairing comes from ``rotary.config.PAIRING`` (checked against
        transformers for every architecture it lists); any other ``model_type`` needs ``interleaved=``.
        Multimodal-RoPE configs (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) are refused: each of their
        frequency slots reads a temporal, height or width position (``mrope_section``), which a 1-D
        RoPE cannot represent. Load them with :meth:`rotary.MRoPE.from_hf_config`; the error names
        the call, and the 1-D ``RoPE(...)`` its tables equal on text positions (t = h = w).

        Args:
            config: a transformers ``PretrainedConfig`` (4.x or 5.x), a path to a config.json (or its
                folder), or a dict of one.
            layer_type: for configs with one block per layer type (Gemma-3: ``"sliding_attention"``,
                ``"full_attention"``), which layer's RoPE to build.
            strict: ``False`` turns configuration mistakes into warnings (odd real checkpoints).
            dynamic: see :class:`RoPE`.
            max_position: initial cache length.
            interleaved: the pairing of a ``model_type`` the table does not list (a custom
                architecture): ``True`` for pairs (2i, 2i+1), ``False`` for (i, i + r/2).

        Returns:
            :class:`RoPE`.

        Raises:
            ConfigError: (a ``ValueError``) for an invalid, ambiguous or unsupported config, or a multimodal-RoPE
                config; the message says what to change.

        Example:
            >>> cfg = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            ...        "max_position_embeddings": 131072, "rope_theta": 500000.0,
            ...        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            ...                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
            >>> rope = RoPE.from_hf_config(cfg)
            >>> rope.freqs.rope_type, rope.head_dim, rope.interleaved
            ('llama3', 128, False)
        """
        settings = read_hf_config(config, layer_type=layer_type, strict=strict, interleaved=interleaved)
        if settings.mrope_section is not None:
            raise ConfigError(_mrope_message(settings))
        return cls(
            settings.head_dim,
            base=settings.base,
            rotary_dim=settings.rotary_dim,
            scaling=settings.scaling,
            interleaved=settings.interleaved,
            max_position=max_position,
            dynamic=dynamic,
            strict=strict,
        )

    def with_scaling(self, scaling: Mapping[str, Any] | None) -> RoPE:
        """A new :class:`RoPE` with this one's head_dim, base, rotary_dim, pairing and options, and another scaling block.

        Example:
            >>> trained = RoPE(64, max_position=512)
            >>> stretched = trained.with_scaling({"rope_type": "linear", "factor": 4.0})
            >>> torch.equal(stretched.inv_freq, trained.inv_freq / 4)
            True
        """
        if scaling is not None and not isinstance(scaling, Mapping):
            raise TypeError(f"scaling must be a dict (a rope_scaling block) or None, got {type(scaling).__name__} {scaling!r:.40}")
        block = dict(scaling or {})
        theta = block.pop("rope_theta", None)
        if theta is not None and theta != self.original_freqs.base:
            raise ConfigError(
                f"the block's rope_theta={theta!r} differs from this RoPE's base={self.original_freqs.base!r}; "
                "with_scaling keeps the base: drop rope_theta, or build a new RoPE with that base"
            )
        rope = type(self)(
            self.head_dim, base=self.original_freqs.base, rotary_dim=self._frequency_args["rotary_dim"], scaling=block,
            interleaved=self.interleaved, max_position=self.max_position, dynamic=self.dynamic,
            strict=self._frequency_args["strict"], learnable_frequencies=self.learnable_frequencies,
        )  # fmt: skip
        if self.log_frequency_scale is not None and rope.log_frequency_scale is not None:
            with torch.no_grad():  # the learned factors carry over to the rescaled frequencies
                rope.log_frequency_scale.copy_(self.log_frequency_scale)
        return rope

    @property
    def head_dim(self) -> int:
        return self.original_freqs.head_dim

    @property
    def rotary_dim(self) -> int:
        return self.original_freqs.rotary_dim

    @property
    def attention_scaling(self) -> float:
        return self.freqs.attention_scaling

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # nn.Module.to(dtype) casts every floating buffer; frequencies must stay fp32 (a bf16
        # inv_freq is off by up to 0.4% and every angle with it). Restore the exact values, also
        # after to_empty() (models built on the meta device); learned ones keep their learned values.
        learned = [] if self.log_frequency_scale is None else [self.log_frequency_scale]
        keep_float32(learned, lambda: super(RoPE, self)._apply(fn, recurse))
        self._set_inv_freq(self.freqs.inv_freq)
        return self

    # inv_freq, read-only -------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "inv_freq" and "inv_freq" in self.__dict__.get("_buffers", ()):
            self._set_inv_freq(self.freqs.inv_freq)  # `rope.inv_freq /= 4` has already divided it in place
            raise AttributeError(
                f"rope.inv_freq is read-only: this RoPE computes with the frequencies it was made with (rope.freqs), "
                f"so a new value would be ignored; {_OTHER_FREQUENCIES}"
            )
        super().__setattr__(name, value)

    def _set_inv_freq(self, inv_freq: torch.Tensor) -> None:
        """Make the buffer a copy of ``inv_freq`` on the buffer's device (never the frozen Frequencies' own
        tensor, which an edit would corrupt), marked with its version counter for :meth:`_check_inv_freq`."""
        old = self._buffers.get("inv_freq")
        copy_ = inv_freq.detach().to(old.device if old is not None else inv_freq.device, copy=True)
        copy_._rotary_version = copy_._version  # in-place ops bump it, also through views and detach()
        self._buffers["inv_freq"] = copy_

    def _check_inv_freq(self, eager: bool = False) -> None:
        """Raise if ``inv_freq`` was edited in place (its version moved): the tables would ignore the edit.
        Not under ``torch.compile`` (a graph does not read version counters; the next eager call checks);
        ``eager=True``: the caller knows it is not compiling."""
        if not eager and torch.compiler.is_compiling():
            return
        buffer = self._buffers.get("inv_freq")
        if buffer is not None and getattr(buffer, "_rotary_version", None) == buffer._version:
            return
        want = self.freqs.inv_freq
        if isinstance(buffer, torch.Tensor) and buffer.shape == want.shape:
            # another tensor with the same values (a deep copy, torch.func.functional_call's buffers): mark it
            if buffer.is_meta or torch.equal(buffer.detach().to("cpu", torch.float32), want):
                buffer._rotary_version = buffer._version
                return
        self._set_inv_freq(want)
        raise RuntimeError(
            "rope.inv_freq was modified in place (e.g. rope.inv_freq.mul_(0.5)), but this RoPE computes with the "
            f"frequencies it was made with (rope.freqs), so the edit would be ignored; inv_freq is read-only and has "
            f"been restored. {_OTHER_FREQUENCIES[0].upper()}{_OTHER_FREQUENCIES[1:]}"
        )

    def extra_repr(self) -> str:
        f = self.original_freqs
        return (
            f"head_dim={f.head_dim}, rotary_dim={f.rotary_dim}, base={f.base:g}, rope_type={f.rope_type!r}, "
            f"interleaved={self.interleaved}, attention_scaling={f.attention_scaling:g}"
            + (", learnable_frequencies=True" if self.learnable_frequencies else "")
        )

    # length-dependent frequencies ----------------------------------------------------------------
    def update_length(self, seq_len: int | torch.Tensor) -> Frequencies:
        """Adapt length-dependent frequencies to a call covering positions ``0 .. seq_len - 1``.

        A no-op for static types. Called by :meth:`tables`; with ``dynamic="hf"`` it is transformers'
        ``dynamic_rope_update``, step for step (see :class:`rotary.schedule.FrequencySchedule`).

        Returns:
            The frequencies of that call (also left in ``rope.freqs`` / ``rope.inv_freq``).

        Example:
            >>> rope = RoPE(64, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8})
            >>> _ = rope.update_length(32)
            >>> bool(rope.inv_freq[-1] < rope.original_freqs.inv_freq[-1])
            True
            >>> rope.reset_length()
            >>> torch.equal(rope.inv_freq, rope.original_freqs.inv_freq)
            True
        """
        return self._freqs_for(seq_len)[0]

    def _freqs_for(self, seq_len: int | torch.Tensor) -> tuple[Frequencies, str | None]:
        freqs, key = self.schedule.freqs_for(seq_len)
        if freqs is not self.freqs:
            self.freqs = freqs
            self._set_inv_freq(freqs.inv_freq)
        return freqs, key

    def reset_length(self) -> None:
        """Forget the lengths seen (dynamic state) and return to the trained frequencies."""
        self.schedule.reset()
        self._freqs_for(0)

    def _cache(self, key: str, freqs: Frequencies) -> TableCache:
        cache = self._caches.get(key)
        if cache is None:
            with self._caches_lock:
                cache = self._caches.get(key)
                if cache is None:
                    cache = TableCache(
                        freqs.inv_freq, freqs.attention_scaling, self.interleaved, self.max_position,
                        limit=max(CACHE_ROWS, self.max_position),
                    )  # fmt: skip
                    self._caches[key] = cache
        return cache

    # tables ----------------------------------------------------------------------------------
    def tables(self, positions: torch.Tensor | Positions, *, dtype: torch.dtype = torch.float32) -> RotaryTables:
        """The tables that rotate tokens at ``positions``.

        Args:
            positions: integer ``position_ids`` ``[S]`` or ``[B, S]`` (validated here), or a
                :class:`rotary.positions.Positions` (trusted: validated where it was made; packed
                positions from ``cu_seqlens`` included).
            dtype: fp32, or float64 for float64 inputs (see :func:`rotary.tables.table_dtype`).

        Returns:
            :class:`~rotary.tables.RotaryTables` on the positions' device: a slice of the cache for
            consecutive positions, the cache with per-token rows otherwise, or rows computed for these
            positions (beyond the cache, dynamic NTK past the trained length, ``torch.compile``).

        Example:
            >>> rope = RoPE(8)
            >>> rope.tables(torch.tensor([[0, 0, 1, 2]])).addressing  # left padding: rows into the cache
            'indexed'
        """
        if not isinstance(positions, Positions):
            positions = P.from_ids(positions)
        if positions.axes != 1:
            raise ValueError(
                f"positions have {positions.axes} coordinate axes but this RoPE is 1-D; use rotary.AxialRoPE "
                "(or the M-RoPE variant) for N-D positions"
            )
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        self._check_inv_freq()
        compiling = torch.compiler.is_compiling()
        freqs, key = self.original_freqs, "original"
        if self.schedule.length_dependent and positions.ids.numel():
            # transformers passes max(position_ids) + 1, exact; an upper bound (padding) is not enough
            length = positions.bound if positions.bound is not None and positions.exact else positions.ids.max() + 1
            freqs, key = self._freqs_for(length)
        ids = positions.ids
        learned = self.log_frequency_scale
        bound = positions.bound
        if bound is None and not deferred.host_checks(ids.device) and not compiling:
            # ids on an accelerator, not read: the cached table as it is (at least max_position rows,
            # or what prepare() sized); the kernel checks every token's row against it
            bound = -1
        uncached = compiling or key is None or bound is None or learned is not None
        cache = None if uncached else self._cache(key, freqs)  # type: ignore[arg-type]
        cached = None if cache is None else cache.get(ids.device, cache.length if bound == -1 else bound, dtype)  # type: ignore[arg-type]
        if cached is None:  # rows for exactly these tokens (after the cache, which names a growth in a capture)
            inv_freq = self._inv_freq_on(freqs, ids.device)
            if learned is not None:  # θ_i · exp(α_i), differentiable in α: computed per call, never cached
                inv_freq = inv_freq.double() * learned.double().exp()
            cos, sin = cos_sin_table(
                ids, inv_freq, attention_scaling=freqs.attention_scaling, interleaved=self.interleaved, dtype=dtype
            )
            if positions.packed:  # packed x addresses rows; here row t is token t
                return RotaryTables.unchecked(cos, sin, self.interleaved, rows=torch.arange(ids.shape[0], device=ids.device))
            return RotaryTables.unchecked(cos, sin, self.interleaved)
        cos, sin = cached
        if positions.start is not None:  # consecutive positions: a slice of the cache, nothing gathered
            end = positions.start + ids.shape[0]
            return RotaryTables.unchecked(cos[positions.start : end], sin[positions.start : end], self.interleaved)
        return RotaryTables.unchecked(cos, sin, self.interleaved, rows=ids)

    def _inv_freq_on(self, freqs: Frequencies, device: torch.device) -> torch.Tensor:
        """``freqs.inv_freq`` (fp32 ``[r/2]``) on ``device``: a copy kept per device (made once, e.g. by
        :meth:`prepare`), so a call copies nothing host-to-device. Not the ``inv_freq`` buffer, which
        ``.to()`` and users may change."""
        device = indexed_device(device)
        key = (id(freqs), device)
        found = self._device_inv_freq.get(key)
        if found is None or found[0] is not freqs:
            found = (freqs, freqs.inv_freq.to(device))
            self._device_inv_freq[key] = found
        return found[1]

    def prepare(
        self, max_position: int, *, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
    ) -> RoPE:
        """Build the cached tables for positions ``0 .. max_position - 1`` on ``device`` now.

        On an accelerator, a call whose positions come as a device tensor (``position_ids``) reads the
        cached table as it is, at least ``RoPE(max_position=...)`` rows, without reading the ids on the
        host; a token past the table gets NaN and a deferred error (:func:`rotary.check_device_errors`).
        Prepare the tables for the longest position a run will see before capturing a CUDA graph:
        growing them allocates and copies, which a capture cannot record.

        Args:
            max_position: rows to cache (positions ``0 .. max_position - 1``).
            device: where the tables live (default: the module's device).
            dtype: fp32 (default) or float64 (for float64 inputs).

        Returns:
            ``self``.

        Example:
            >>> rope = RoPE(64).prepare(8192)
            >>> rope.tables(torch.arange(8192)).cos.shape
            torch.Size([8192, 64])
        """
        check_positive_int(max_position, "max_position")
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        device = indexed_device(self.inv_freq.device if device is None else device)
        if self.schedule.length_dependent or self.log_frequency_scale is not None:
            return self  # tables of these are computed per call, never cached
        cache = self._cache("original", self.original_freqs)
        if max_position > cache.limit:
            raise ValueError(
                f"prepare(max_position={max_position}) asks for more rows than the cache holds ({cache.limit}); "
                f"build the RoPE with max_position >= {max_position}"
            )
        cache.get(device, max_position, dtype)
        self._inv_freq_on(self.original_freqs, device)
        deferred.flags(device)  # made now, not inside a capture
        return self

    def cos_sin(
        self, position_ids: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables for ``position_ids``, laid out for this module's pairing.

        Args:
            position_ids: integer ``[S]`` or ``[B, S]``, >= 0.
            dtype: fp32, or float64 for float64 inputs.

        Returns:
            ``(cos, sin)`` in ``dtype``, ``[S, rotary_dim]`` or ``[B, S, rotary_dim]``, multiplied by
            ``attention_scaling``, on ``position_ids.device``.

        Example:
            >>> cos, sin = RoPE(8).cos_sin(torch.arange(3))
            >>> cos.shape, cos.dtype
            (torch.Size([3, 8]), torch.float32)
        """
        return self.tables(position_ids, dtype=dtype).gather()

    # application -----------------------------------------------------------------------------
    def _positions(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor | Positions | None,
        offset: int,
        layout: str,
        cu_seqlens: torch.Tensor | None,
        max_seqlen: int | None,
        name: str,
    ) -> Positions:
        """The positions of ``x``'s tokens (:func:`rotary.positions.from_call`)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        packed = cu_seqlens is not None or x.dim() == 3
        if packed and x.dim() != 3:
            raise ValueError(f"packed inputs (cu_seqlens) must be [total_tokens, H, D], got {tuple(x.shape)}")
        if not packed and x.dim() != 4:
            raise ValueError(f"{name} must be 4-D ([B, H, S, D] or [B, S, H, D]), got shape {tuple(x.shape)}")
        batch_dim, seq_dim = (0, 0) if packed else check_layout(layout)
        return P.from_call(  # type: ignore[return-value]  (default=True: never None)
            batch=1 if packed else x.shape[batch_dim], seq_len=x.shape[seq_dim], packed=packed, device=x.device,
            position_ids=position_ids, offset=offset, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
        )  # fmt: skip

    def _check_head_dim(self, xs: tuple[torch.Tensor, ...], names: tuple[str, ...]) -> None:
        for x, name in zip(xs, names):
            if isinstance(x, torch.Tensor) and x.dim() in (3, 4) and x.shape[-1] != self.head_dim:
                raise ValueError(f"{name} has head_dim {x.shape[-1]} but this RoPE was built for head_dim={self.head_dim}")

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        position_ids: torch.Tensor | Positions | None = None,
        offset: int = 0,
        layout: Layout = "bhsd",
        inplace: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys, both in one fused kernel call.

        Packed variable-length batches (as in flash-attn's varlen API): q ``[total_tokens, Hq, D]``
        and k ``[total_tokens, Hk, D]`` with ``cu_seqlens`` (int ``[N + 1]`` sequence boundaries;
        positions restart at 0 in each sequence) or per-token ``position_ids`` ``[total_tokens]``.
        vLLM's flat layout, q ``[total_tokens, Hq * D]`` and k ``[total_tokens, Hk * D]`` with
        per-token ``position_ids``, is split into heads of this RoPE's ``head_dim``.

        Args:
            q: ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]`` (``"bshd"``).
            k: same layout, ``Hk`` heads (``Hk`` may be smaller than ``Hq``: GQA/MQA), same S and D.
            position_ids: integer ``[S]`` or ``[B, S]`` (e.g. left padding), or a
                :class:`~rotary.positions.Positions`; default ``offset + arange(S)``.
            offset: first position when ``position_ids`` is None (decoding with a KV cache); giving
                both is an error.
            layout: ``"bhsd"`` or ``"bshd"``.
            inplace: rotate q and k in place and return them. Under autograd (non-leaf q and k,
                e.g. projection outputs) the backward writes each gradient into one new tensor;
                results are bit-identical to rotating out of place. Not for q or k needed unrotated
                elsewhere (autograd
                raises if another operation saved them for its backward; other readers would see
                them rotated); leaf tensors that require grad cannot be modified in place.
            cu_seqlens: boundaries of packed sequences (see above).
            max_seqlen: the longest packed sequence (optional, spares reading ``cu_seqlens``).

        Returns:
            ``(q_rotated, k_rotated)`` with the shapes and dtypes of ``q`` and ``k``.
        """
        if cu_seqlens is None and (position_ids is None or offset == 0):
            fast = self._fast(q, k, position_ids, offset, layout, inplace)
            if fast is not None:
                return fast
        flat = (q, k)
        q, k = self._split_flat(q, "q"), self._split_flat(k, "k")
        self._check_head_dim((q, k), ("q", "k"))
        positions = self._positions(q, position_ids, offset, layout, cu_seqlens, max_seqlen, "q")
        tables = self.tables(positions, dtype=table_dtype(q.dtype))
        q, k = rotate([q, k], tables, layout=layout, inplace=inplace, kinds=("q", "k"), names=("q", "k"))
        if flat[0] is not q and flat[0].dim() == 2:  # back to [total_tokens, H * D]
            return (flat[0], flat[1]) if inplace else (q.reshape(flat[0].shape), k.reshape(flat[1].shape))
        return q, k

    def _fast(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        position_ids: torch.Tensor | Positions | None,
        offset: int,
        layout: str,
        inplace: bool,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The decoding fast path: straight to the CPU kernel's ``rope_decode``, or ``None``.

        Taken for plain tensors without autograd or ``torch.compile``, static frequencies and a filled
        table cache; ``rope_decode`` then checks, in C++, everything else the general path would (4-D
        CPU tensors of one dtype, fp32/bf16/fp16, unit channel stride, matching B/S/D, int64
        position ids of a fitting shape, all inside the cached table, no overlap in place) and does
        nothing when a check fails: ``None`` here, and the general path runs, with its messages
        (and grows the table). No position tensor is built and nothing is gathered: the kernel reads
        rows ``offset .. offset + S - 1`` of a slice of the cached table, or the rows ``position_ids``
        give (a :class:`~rotary.positions.Positions` made by ``arange`` is an offset: validated
        upstream, not read again). Same kernel, same tables: same results.
        """
        if type(offset) is not int or offset < 0 or type(inplace) is not bool or not self._fast_ok:
            return None
        seq_axis = decode_seq_axis(q, k, layout)  # None under torch.compile
        cache = self._caches.get("original")
        if cache is None or seq_axis is None:
            return None
        self._check_inv_freq(eager=True)
        ids = None
        if position_ids is not None:
            if type(position_ids) is Positions:
                if position_ids.axes != 1 or position_ids.packed:
                    return None
                if position_ids.start is not None:
                    offset = position_ids.start
                else:
                    ids = position_ids.ids
            elif type(position_ids) is torch.Tensor:
                ids = position_ids
            else:
                return None
        seq_len = q.shape[seq_axis]
        if type(position_ids) is Positions and position_ids.seq_len != seq_len:
            return None
        needed = 0 if ids is not None else offset + seq_len
        cached = cache.cpu(needed) if q.is_cpu else cache.ready(q.device, needed)
        if cached is None:
            return None
        out = decode_fast(
            q, k, cached[0], cached[1], seq_axis, interleaved=self.interleaved, inplace=inplace,
            head_dim=self.original_freqs.head_dim, offset=offset, rows=ids,
        )  # fmt: skip
        return (out[0], out[1]) if out else None

    @property
    def _fast_ok(self) -> bool:
        """Static frequencies and this class's own tables: the cached table is the whole story."""
        return self.log_frequency_scale is None and not self.schedule.length_dependent and type(self).tables is RoPE.tables

    def _split_flat(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """vLLM's ``[total_tokens, H * D]`` as packed ``[total_tokens, H, D]`` (other inputs unchanged)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return x
        return split_heads(x, self.head_dim, name)

    def rotate(
        self,
        x: torch.Tensor,
        *,
        position_ids: torch.Tensor | Positions | None = None,
        offset: int = 0,
        layout: Layout = "bhsd",
        inplace: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        """Rotate one tensor ``x`` (``[B, H, S, D]``, ``[B, S, H, D]`` or packed ``[total_tokens, H, D]``);
        arguments as in :meth:`forward`.

        Example:
            >>> rope = RoPE(8)
            >>> x = torch.randn(1, 2, 3, 8)
            >>> torch.equal(rope.rotate(x), rope(x, x)[0])
            True
        """
        original = x
        x = self._split_flat(x, "x")
        self._check_head_dim((x,), ("x",))
        positions = self._positions(x, position_ids, offset, layout, cu_seqlens, max_seqlen, "x")
        tables = self.tables(positions, dtype=table_dtype(x.dtype) if isinstance(x, torch.Tensor) else torch.float32)
        out = rotate([x], tables, layout=layout, inplace=inplace, names=("x",))[0]
        if original is not x:
            return original if inplace else out.reshape(original.shape)
        return out
