"""``RoPE``: frequencies + schedule + table cache -> ``tables(positions)``; ``forward`` rotates q and k.

    positions ──► RoPE.tables(positions) ──► RotaryTables ──► rotary.rotate(xs, tables) ──► kernels
                  (frequencies of the call,                   (one call for q and k)
                   cached rows or computed rows)

The table side (frequencies, schedule, caches, ``tables``, ``prepare``) is :class:`rotary.rope_tables.TableSource`;
this module adds the constructors from configs and the rotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

from . import plans
from . import positions as P
from . import rotation as R
from .errors import InputTypeError
from .hf.config import head_dim_noted, read_hf_config
from .kernels.extension import load_cpu_extension
from .plans import Plan
from .positions import Positions
from .rope_tables import CACHE_ROWS, TableSource, keep_float32
from .rope_types import ConfigError
from .rotation import Layout, check_layout, rotate, split_heads
from .tables import table_dtype

__all__ = ["CACHE_ROWS", "RoPE", "keep_float32"]


def _mrope_message(settings: Any) -> str:
    """Why :meth:`RoPE.from_hf_config` refuses a multimodal-RoPE config, and the exact calls to use instead."""
    section = list(settings.mrope_section)
    layout = {
        "interleaved": "interleaved as in Qwen3-VL",
        "paired_hw": "height and width paired as in ERNIE-4.5-VL",
    }.get(settings.mrope_layout, "in chunks as in Qwen2-VL")
    axes = len(section) if settings.mrope_layout == "chunked" else 3
    args = [str(settings.head_dim), f"base={settings.base!r}"]
    if settings.rotary_dim is not None:
        args.append(f"rotary_dim={settings.rotary_dim}")
    if dict(settings.scaling) != {"rope_type": "default"}:
        args.append(f"scaling={dict(settings.scaling)!r}")
    if settings.interleaved:
        args.append("interleaved=True")
    return (
        f"model_type {settings.model_type!r} uses multimodal RoPE (M-RoPE): mrope_section {section} (laid out "
        f"{layout}) "
        "gives each frequency slot the temporal, height or width position of a token, which a 1-D RoPE cannot "
        f"represent; load it with rotary.MRoPE.from_hf_config(config) and pass positions [{axes}, B, S] "
        "(rotary.multimodal_positions(...) builds them for text, images and videos). On text alone (t = h = w) its "
        f"tables equal those of rotary.RoPE({', '.join(args)}), if a 1-D RoPE of the text positions is what you want"
    )


class RoPE(TableSource):
    """Rotary position embedding for the q and k of attention.

    Tables are fp32 (float64 for float64 inputs), from float64 angles, for any int64 position on every device;
    ``.to(bfloat16)`` leaves them fp32; shareable by layers and threads. Caching, numerics: docs/core.md.

    Args:
        head_dim, rotary_dim: channels per head ``D`` (even); channels rotated ``r`` (even, ``<= D``; default ``D``).
        base: RoPE base ``theta`` (> 0); default the scaling block's ``rope_theta``, else 10000.
        scaling: Hugging Face-style scaling block, e.g. ``{"rope_type": "yarn", "factor": 4.0, ...}``.
        interleaved: ``False``: pairs (i, i + r/2) (Hugging Face); ``True``: (2i, 2i + 1) (RoFormer, GPT-J).
        max_position: initial cache length (a size, never a limit on positions).
        dynamic: how ``dynamic`` / ``longrope`` follow the length: ``"hf"`` replays transformers' state call for
            call, ``"stateless"`` uses the current call's length only (docs/scaling.md).
        strict: ``False`` turns its value errors into warnings.
        learnable_frequencies: train ``α`` (``log_frequency_scale``, fp32 ``[r/2]``, init 0): pair ``i`` turns with
            ``θ_i · exp(α_i)``; tables computed per call with gradients; not with length-dependent types.

    Attributes:
        inv_freq: fp32 ``[r/2]``, the latest call's frequencies (Hugging Face's buffer); read-only (docs/core.md).

    Raises:
        rotary.errors.InputError: a bad argument, or tables over 4 GiB; ConfigError: a bad scaling block.

    Example:
        >>> rope = RoPE(64)
        >>> q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)  # GQA: 8 q heads, 2 kv heads
        >>> q_rot, k_rot = rope(q, k)
        >>> q_rot.shape, k_rot.shape
        (torch.Size([2, 8, 16, 64]), torch.Size([2, 2, 16, 64]))
    """

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
        """Build the RoPE a Hugging Face model uses, from its config (never modified); the keys read: docs/scaling.md.

        The pairing comes from ``rotary.hf.PAIRING``; another ``model_type`` needs ``interleaved=``. Multimodal-RoPE
        configs are refused with an error naming :meth:`rotary.MRoPE.from_hf_config` and the equal 1-D ``RoPE``.

        Args:
            config: a transformers ``PretrainedConfig`` (4.x or 5.x), a path to a config.json (or its folder), or a
                dict.
            layer_type: for configs with one block per layer type (Gemma-3's ``"sliding_attention"``, Gemma 4's
                ``per_layer_config``, DeepSeek-V4's ``main`` / ``compress``): which layer's RoPE to build.
            strict: ``False`` turns configuration mistakes into warnings (odd real checkpoints).
            dynamic, max_position: see :class:`RoPE`.
            interleaved: the pairing of a ``model_type`` the table does not list (``True``: pairs (2i, 2i+1)).

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
        try:
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
        except ConfigError as exc:
            raise head_dim_noted(exc, settings) from None

    def with_scaling(self, scaling: Mapping[str, Any] | None) -> RoPE:
        """A new :class:`RoPE` with this one's settings and another scaling block.

        Example:
            >>> trained = RoPE(64, max_position=512)
            >>> stretched = trained.with_scaling({"rope_type": "linear", "factor": 4.0})
            >>> torch.equal(stretched.inv_freq, trained.inv_freq / 4)
            True
        """
        if scaling is not None and not isinstance(scaling, Mapping):
            raise InputTypeError(
                f"scaling must be a dict (a rope_scaling block) or None, got {type(scaling).__name__} {scaling!r:.40}"
            )
        block = dict(scaling or {})
        theta = block.pop("rope_theta", None)
        if theta is not None and theta != self.original_freqs.base:
            raise ConfigError(
                f"the block's rope_theta={theta!r} differs from this RoPE's base={self.original_freqs.base!r}; "
                "with_scaling keeps the base: drop rope_theta, or build a new RoPE with that base"
            )
        rope = type(self)(
            self.head_dim,
            base=self.original_freqs.base,
            rotary_dim=self._frequency_args["rotary_dim"],
            scaling=block,
            interleaved=self.interleaved,
            max_position=self.max_position,
            dynamic=self.dynamic,
            strict=self._frequency_args["strict"],
            learnable_frequencies=self.learnable_frequencies,
        )
        if self.log_frequency_scale is not None and rope.log_frequency_scale is not None:
            with torch.no_grad():  # the learned factors carry over to the rescaled frequencies
                rope.log_frequency_scale.copy_(self.log_frequency_scale)
        return rope

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
        packed = cu_seqlens is not None or (isinstance(x, torch.Tensor) and x.dim() == 3)
        R.check_rank(x, name, packed)
        batch_dim, seq_dim = (0, 0) if packed else check_layout(layout)
        return P.from_call(  # type: ignore[return-value]  (default=True: never None)
            batch=1 if packed else x.shape[batch_dim],
            seq_len=x.shape[seq_dim],
            packed=packed,
            device=x.device,
            position_ids=position_ids,
            offset=offset,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
        )

    def _check_head_dim(self, xs: tuple[torch.Tensor, ...], names: tuple[str, ...]) -> None:
        for x, name in zip(xs, names):
            if isinstance(x, torch.Tensor) and x.dim() in (3, 4):
                R.check_head_dim(x, name, self)

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

        Args:
            q: ``[B, Hq, S, D]`` (``layout="bhsd"``), ``[B, S, Hq, D]`` (``"bshd"``), packed ``[total_tokens, Hq, D]``,
                or vLLM's flat ``[total_tokens, Hq * D]`` (split into heads of ``head_dim``).
            k: same layout, ``Hk`` heads (GQA/MQA: ``Hk`` divides ``Hq``), same S and D.
            position_ids: integer ``[S]``, ``[B, S]`` or packed ``[total_tokens]``, or a
                :class:`~rotary.positions.Positions`; default ``offset + arange(S)``.
            offset: first position when ``position_ids`` is None (decoding with a KV cache); both is an error.
            layout: ``"bhsd"`` or ``"bshd"``.
            inplace: rotate q and k (and, under autograd, their gradients) in place, bit-identical to out of place;
                not for q or k needed unrotated elsewhere, nor leaves that require grad.
            cu_seqlens: int ``[N + 1]`` boundaries of packed sequences (flash-attn's varlen; positions restart at 0).
            max_seqlen: the longest packed sequence (optional, spares reading ``cu_seqlens``).

        Returns:
            ``(q_rotated, k_rotated)`` with the shapes and dtypes of ``q`` and ``k``.

        Raises:
            rotary.errors.InputError: shapes, layouts or positions that do not fit (the message names them).
        """
        key = self._key(q, k, position_ids, layout, inplace) if cu_seqlens is None and max_seqlen is None else None
        if key is not None:
            recorded = self._plans.get(key)
            if recorded is not None and recorded.run is not None and self._covers(recorded, offset):
                out = R.run_plan(recorded, (q, k), offset, position_ids)
                if out:  # (empty: a signature or rows the plan does not cover)
                    return out[0], out[1]
        flat = (q, k)
        q, k = self._split_flat(q, "q"), self._split_flat(k, "k")
        self._check_head_dim((q, k), ("q", "k"))
        positions = self._positions(q, position_ids, offset, layout, cu_seqlens, max_seqlen, "q")
        tables = self.tables(positions, dtype=table_dtype(q.dtype))
        q, k = rotate([q, k], tables, layout=layout, inplace=inplace, kinds=("q", "k"), names=("q", "k"))
        if key is not None:
            self._record(key, flat, (q, k), position_ids, layout, inplace)
        if flat[0] is not q and flat[0].dim() == 2:  # back to [total_tokens, H * D]
            return (flat[0], flat[1]) if inplace else (q.reshape(flat[0].shape), k.reshape(flat[1].shape))
        return q, k

    # plans (rotary.plans) ------------------------------------------------------------------------
    def _key(
        self, q: torch.Tensor, k: torch.Tensor | None, position_ids: object, layout: str, inplace: bool
    ) -> tuple | None:
        """The Python part of a call's signature (:mod:`rotary.plans`), or ``None`` for a call that is never planned."""
        if (
            (inplace is not True and inplace is not False)
            or type(q) is not torch.Tensor
            or not (k is None or type(k) is torch.Tensor)
            or not (position_ids is None or type(position_ids) is torch.Tensor)
            or not plans.plannable()
        ):
            return None
        return layout, inplace, position_ids is None, q.shape, None if k is None else k.shape

    @property
    def _plannable(self) -> bool:
        """Static frequencies and this class's own tables: the cached table is the whole story of a call's tables."""
        return (
            self.log_frequency_scale is None and not self.schedule.length_dependent and type(self).tables is RoPE.tables
        )

    def _record(
        self,
        key: tuple,
        xs: tuple[torch.Tensor, ...],
        outs: tuple[torch.Tensor, ...],
        position_ids: torch.Tensor | None,
        layout: str,
        inplace: bool,
    ) -> None:
        """After a general call succeeded: record a plan of the whole cached table when the kernel plan allows it."""
        recorded = R.recorded_plan()
        tables = self._plan_tables(outs[0].device, table_dtype(outs[0].dtype), position_ids)
        if recorded is None or recorded.backend != "cpu" or tables is None or any(x.dim() != 4 for x in xs):
            self._plans.put(key, plans.GENERAL)
            return
        ext = load_cpu_extension()
        signature = ext.signature(list(xs), *tables[:2], position_ids, inplace)  # type: ignore[union-attr]
        code = R.layout_code(layout, False)
        kernel = ext.RopePlan(signature, *tables, code, self.interleaved, inplace)  # type: ignore[union-attr]
        plan = Plan("cpu", code, self.interleaved, inplace, tables, signature, self._guard(), kernel.with_offset)
        self._plans.put(key, plan)

    def _plan_tables(
        self, device: torch.device, dtype: torch.dtype, position_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The whole cached ``(cos, sin)`` and the frequencies past them that a plan replays, or ``None``.

        Shared by :meth:`forward` and :func:`rotary.rmsnorm_rotate`.
        """
        cache = self._caches.get("original")
        cached = None if cache is None else cache.ready(device, 0, dtype)
        if (
            cached is None
            or not self._plannable
            or (position_ids is not None and (position_ids.dtype != torch.int64 or position_ids.device != device))
        ):
            return None
        return (*cached, self._row_frequencies_on(self.original_freqs, device))

    def _guard(self) -> tuple[torch.Tensor, int]:
        """What a plan of this RoPE holds for its frequency buffer: the buffer and its ``_version``."""
        buffer = self._buffers["inv_freq"]
        return buffer, buffer._version

    def _plan_window(
        self, plan: Plan, seq_len: int, position_ids: torch.Tensor | None, offset: object
    ) -> tuple[int, torch.Tensor | None, torch.Tensor | None] | None:
        """``(row_offset, position_ids, frequencies)`` of a recorded plan's call, or ``None`` when the plan does not
        cover these values (its frequency buffer replaced or edited in place; an ``offset`` of another type,
        negative, past the plan's table, or given with ``position_ids``)."""
        if not self._covers(plan, offset):
            return None
        if position_ids is not None:
            return None if offset else (0, position_ids, plan.tables[2])  # type: ignore[index]
        if offset < 0 or offset + seq_len > plan.tables[0].shape[0]:  # type: ignore[index]
            return None
        return offset, None, None

    def _covers(self, plan: Plan, offset: object) -> bool:
        """Whether a recorded plan may take this call: an ``offset`` that is an int (the kernel's entry says the
        rest: a negative one, one past the plan's table, or one given with ``position_ids`` is no call of the
        plan's), and the plan's frequency buffer, neither replaced nor edited in place since."""
        buffer = self._buffers["inv_freq"]
        guard = plan.guard
        return type(offset) is int and guard[0] is buffer and guard[1] == buffer._version  # type: ignore[index]

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
        """Rotate one tensor ``x`` (``[B, H, S, D]``, ``[B, S, H, D]`` or packed ``[total_tokens, H, D]``), as
        :meth:`forward`.

        Example:
            >>> rope = RoPE(8)
            >>> x = torch.randn(1, 2, 3, 8)
            >>> torch.equal(rope.rotate(x), rope(x, x)[0])
            True
        """
        key = self._key(x, None, position_ids, layout, inplace) if cu_seqlens is None and max_seqlen is None else None
        if key is not None:
            recorded = self._plans.get(key)
            if recorded is not None and recorded.run is not None and self._covers(recorded, offset):
                done = R.run_plan(recorded, (x,), offset, position_ids)
                if done:
                    return done[0]
        original = x
        x = self._split_flat(x, "x")
        self._check_head_dim((x,), ("x",))
        positions = self._positions(x, position_ids, offset, layout, cu_seqlens, max_seqlen, "x")
        tables = self.tables(positions, dtype=table_dtype(x.dtype) if isinstance(x, torch.Tensor) else torch.float32)
        out = rotate([x], tables, layout=layout, inplace=inplace, names=("x",))[0]
        if key is not None:
            self._record(key, (original,), (out,), position_ids, layout, inplace)
        if original is not x:
            return original if inplace else out.reshape(original.shape)
        return out
