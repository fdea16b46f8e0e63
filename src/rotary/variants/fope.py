"""FoPE: RoPE whose per-pair phasor is a Fourier series over the well-trained frequencies.

*Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length Generalization* (Hua et al.,
2024). Multiplying a pair by ``C_d(n) + i S_d(n)`` is what the kernels compute from cos/sin tables, so FoPE is a
producer of per-head tables whose ``cos² + sin²`` is not 1. It follows vLLM's ``FourierRotaryEmbedding``;
the formulas and the differences from the paper's code: docs/variants.md, "FoPE".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .._checks import check_bool, check_positive_int, is_int, is_number, is_positive_int
from ..errors import ConfigError, InputError
from ..frequencies import frequencies
from ..hf.raw import config_as_dict, text_part
from ..positions import Positions
from ..rotation import Layout, check_layout, rotate
from ..tables import RotaryTables, angles, expand_pairs, table_dtype

__all__ = ["FOPE_KEYS", "FoPE", "fope_kept_frequencies"]

#: the RoPE-block keys that turn FoPE on in vLLM and SGLang (InternLM / Intern-S1-Pro configs)
FOPE_KEYS = frozenset({"fope_init_factor", "fope_sep_head", "num_inv_freq"})


def fope_kept_frequencies(
    inv_freq: torch.Tensor, max_position_embeddings: int, num_inv_freq: int | None = None
) -> torch.Tensor:
    """The frequencies FoPE keeps, a prefix ``[F]`` of ``inv_freq`` (``[r/2]`` fp32, falling).

    The first ``num_inv_freq`` (vLLM's key), else those that turn at least once in the training length
    ``max_position_embeddings`` ``N`` (``θ_i > 2π / N``).

    Example:
        >>> inv = frequencies(16).inv_freq
        >>> fope_kept_frequencies(inv, 1000).shape, fope_kept_frequencies(inv, 1000, num_inv_freq=3).shape
        (torch.Size([5]), torch.Size([3]))
    """
    if num_inv_freq is not None:
        if not is_int(num_inv_freq) or not 1 <= num_inv_freq <= inv_freq.shape[-1]:
            raise ConfigError(
                f"num_inv_freq must be an int in [1, {inv_freq.shape[-1]}] (pairs kept), got {num_inv_freq!r}"
            )
        return inv_freq[:num_inv_freq]
    check_positive_int(max_position_embeddings, "max_position_embeddings")
    kept = inv_freq[inv_freq > 2 * math.pi / max_position_embeddings]
    if kept.numel() == 0:
        raise ConfigError(
            f"every frequency has a period longer than max_position_embeddings={max_position_embeddings}, so FoPE "
            "clips them all and nothing rotates; give the training length (or num_inv_freq)"
        )
    return kept


class FoPE(nn.Module):
    """Fourier position embedding: per-head Fourier-series tables over RoPE's kept frequencies.

    Args:
        head_dim, base, rotary_dim: ``D`` (even); RoPE base ``theta``; channels rotated (default ``D``).
        num_key_value_heads: ``H_kv``; coefficients are per key/value head, or one shared set without
            ``separate_heads`` (``fope_sep_head``).
        max_position_embeddings, num_inv_freq: which frequencies are kept (:func:`fope_kept_frequencies`).
        init_std: the coefficients start at the identity plus Gaussian noise of this deviation, drawn from
            ``generator`` (0: RoPE over the kept frequencies); :meth:`set_coefficients` loads a checkpoint's.
        interleaved: the pairing (``False``: pairs (i, i + r/2), vLLM's neox style).

    ``inv_freq`` (fp32 ``[F]``, a buffer) holds the kept frequencies; ``cos_coef``, ``sin_coef`` are ``[H_c, F, F]``
    parameters (``H_c = H_kv``, or 1 when shared).

    Example:
        >>> fope = FoPE(16, num_key_value_heads=2, max_position_embeddings=64, init_std=0.1,
        ...             generator=torch.Generator().manual_seed(0))
        >>> t = fope.tables(torch.arange(5))
        >>> t.cos.shape, t.heads, fope.inv_freq.shape
        (torch.Size([5, 2, 16]), 2, torch.Size([3]))
        >>> q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
        >>> [x.shape for x in fope(q, k)]
        [torch.Size([1, 4, 5, 16]), torch.Size([1, 2, 5, 16])]
    """

    def __init__(
        self,
        head_dim: int,
        *,
        num_key_value_heads: int,
        max_position_embeddings: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        num_inv_freq: int | None = None,
        separate_heads: bool = True,
        init_std: float = 0.0,
        interleaved: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        check_positive_int(num_key_value_heads, "num_key_value_heads")
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or not 0 <= init_std < math.inf:
            raise InputError(f"init_std must be a finite number >= 0, got {init_std!r}")
        full = frequencies(head_dim, base=base, rotary_dim=rotary_dim)
        self.head_dim, self.rotary_dim = head_dim, full.rotary_dim
        self.num_key_value_heads = num_key_value_heads
        self.separate_heads = check_bool(separate_heads, "separate_heads")
        self.interleaved = check_bool(interleaved, "interleaved")
        self.inv_freq: torch.Tensor
        self.register_buffer(
            "inv_freq", fope_kept_frequencies(full.inv_freq, max_position_embeddings, num_inv_freq), persistent=False
        )
        kept = self.inv_freq.shape[0]
        shape = (num_key_value_heads if self.separate_heads else 1, kept, kept)
        eye = torch.eye(kept).expand(shape)
        self.cos_coef = nn.Parameter(eye + init_std * torch.randn(shape, generator=generator))
        self.sin_coef = nn.Parameter(eye + init_std * torch.randn(shape, generator=generator))

    @classmethod
    def from_hf_config(cls, config: Any, *, init_std: float = 0.0) -> FoPE:
        """Build it from a config whose RoPE block has FoPE's keys (InternLM / Intern-S1-Pro, as vLLM reads them).

        ``config``: a transformers config, a config.json path or a dict (multimodal: its ``text_config``). Any of
        ``fope_init_factor``, ``fope_sep_head``, ``num_inv_freq`` turns FoPE on; the coefficients start as in
        :class:`FoPE` until :meth:`set_coefficients` loads the checkpoint's.

        Example:
            >>> d = {"hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 5e6,
            ...      "max_position_embeddings": 262144,
            ...      "rope_scaling": {"rope_type": "default", "fope_init_factor": 0.5, "fope_sep_head": True}}
            >>> fope = FoPE.from_hf_config(d)
            >>> fope.head_dim, fope.cos_coef.shape
            (128, torch.Size([2, 45, 45]))
        """
        d = text_part(config_as_dict(config), "max_position_embeddings")
        block = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if not isinstance(block, Mapping) or all(block.get(k) is None for k in FOPE_KEYS):
            raise ConfigError(
                f"the config's RoPE block sets none of FoPE's keys {sorted(FOPE_KEYS)} (got {block!r}); vLLM uses FoPE "
                "only when one is set; for plain RoPE use rotary.RoPE.from_hf_config"
            )
        head_dim = d.get("head_dim")
        if head_dim is None and is_positive_int(d.get("hidden_size")) and is_positive_int(d.get("num_attention_heads")):
            head_dim = d["hidden_size"] // d["num_attention_heads"]
        base = block.get("rope_theta", d.get("rope_theta", 10000.0))
        values = {
            "head_dim": head_dim,
            "num_key_value_heads": d.get("num_key_value_heads", d.get("num_attention_heads")),
            "max_position_embeddings": d.get("max_position_embeddings"),
        }
        for key, value in values.items():
            if not is_positive_int(value):
                raise ConfigError(f"FoPE needs the config's {key} as a positive int, got {value!r}")
        if not is_number(base) or base <= 1:
            raise ConfigError(f"rope_theta must be a number > 1, got {base!r}")
        separate = block.get("fope_sep_head")
        return cls(
            values["head_dim"],
            num_key_value_heads=values["num_key_value_heads"],
            max_position_embeddings=values["max_position_embeddings"],
            base=float(base),
            num_inv_freq=block.get("num_inv_freq"),
            separate_heads=True if separate is None else separate,
            init_std=init_std,
        )

    def set_coefficients(self, cos_coef: torch.Tensor, sin_coef: torch.Tensor) -> None:
        """Copy a checkpoint's ``[H_c, F, F]`` coefficients in (shared: the first of ``[H_kv, F, F]``, as vLLM)."""
        if not self.separate_heads:
            cos_coef, sin_coef = (
                c[:1] if isinstance(c, torch.Tensor) and c.dim() == 3 else c for c in (cos_coef, sin_coef)
            )
        for name, value in (("cos_coef", cos_coef), ("sin_coef", sin_coef)):
            if not isinstance(value, torch.Tensor) or value.shape != self.cos_coef.shape:
                raise InputError(
                    f"{name} must be a tensor of shape {tuple(self.cos_coef.shape)} ([heads, kept frequencies, kept "
                    f"frequencies]), got {getattr(value, 'shape', value)!r}"
                )
        with torch.no_grad():
            self.cos_coef.copy_(cos_coef)
            self.sin_coef.copy_(sin_coef)

    def tables(self, position_ids: torch.Tensor | Positions, *, dtype: torch.dtype = torch.float32) -> RotaryTables:
        """Tables of ``position_ids`` (int ``[S]``, ``[B, S]`` or 1-D Positions), differentiable in the coefficients.

        Per head ``[S, H_kv, r]`` / ``[B, S, H_kv, r]`` (shared: ``[S, r]`` / ``[B, S, r]``), fp32 or float64; pairs
        past the kept frequencies have cos 1 and sin 0. With grouped queries call :meth:`forward`, which expands the
        tables to the query heads (as ``rope=`` of :class:`rotary.nn.RotaryAttention`: ``Hq == H_kv`` or
        ``separate_heads=False``).
        """
        if isinstance(position_ids, Positions) and position_ids.axes == 1 and not position_ids.packed:
            position_ids = position_ids.ids
        if (
            not isinstance(position_ids, torch.Tensor)
            or position_ids.is_floating_point()
            or position_ids.dim() not in (1, 2)
        ):
            raise InputError(f"position_ids must be an integer tensor [S] or [B, S], got {position_ids!r:.80}")
        theta = angles(position_ids, self.inv_freq)  # float64 [..., F]
        # the Fourier series of each output pair, in float64: [..., F] x [H, F, F] -> [..., H, F]
        cos = torch.einsum("...f,hfd->...hd", theta.cos(), self.cos_coef.to(theta.device, torch.float64))
        sin = torch.einsum("...f,hfd->...hd", theta.sin(), self.sin_coef.to(theta.device, torch.float64))
        pad = self.rotary_dim // 2 - cos.shape[-1]  # clipped pairs: frequency 0, unrotated
        cos = torch.cat((cos, cos.new_ones(cos.shape[:-1] + (pad,))), dim=-1)
        sin = torch.cat((sin, sin.new_zeros(sin.shape[:-1] + (pad,))), dim=-1)
        if not self.separate_heads:
            cos, sin = cos.squeeze(-2), sin.squeeze(-2)
        out = table_dtype(dtype)
        heads = self.num_key_value_heads if self.separate_heads else None
        return RotaryTables.unchecked(
            expand_pairs(cos.to(out), self.interleaved),
            expand_pairs(sin.to(out), self.interleaved),
            self.interleaved,
            heads=heads,
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, *, position_ids: torch.Tensor | None = None, layout: Layout = "bhsd"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply FoPE to queries and keys (shapes and dtypes kept); a query head uses its key/value head's tables.

        ``q`` ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]``, ``Hq`` a multiple of ``H_kv``; ``k`` the same
        layout with ``H_kv`` heads; ``position_ids`` int ``[S]`` or ``[B, S]``, default ``arange(S)``.
        """
        check_layout(layout)
        head_axis = 1 if layout == "bhsd" else 2
        hq, hk = q.shape[head_axis], k.shape[head_axis]
        if hk != self.num_key_value_heads or hq % hk:
            raise InputError(
                f"k has {hk} heads and q {hq}; FoPE was built for {self.num_key_value_heads} key/value heads and q "
                "needs a multiple of them"
            )
        if position_ids is None:
            position_ids = torch.arange(q.shape[3 - head_axis], device=q.device)
        tables = self.tables(position_ids, dtype=q.dtype)
        if not self.separate_heads or hq == hk:
            q_out, k_out = rotate([q, k], tables, layout=layout)
            return q_out, k_out
        group = hq // hk
        q_tables = RotaryTables.unchecked(
            tables.cos.repeat_interleave(group, dim=-2),
            tables.sin.repeat_interleave(group, dim=-2),
            tables.interleaved,
            heads=hq,
        )
        return rotate([q], q_tables, layout=layout)[0], rotate([k], tables, layout=layout)[0]
