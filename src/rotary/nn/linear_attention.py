"""Linear attention with RoPE in true O(N) (Su's scheme), and its O(N²) reference.

With a feature map φ, ``Σ_j φ(q_i)ᵀφ(k_j) v_j = φ(q_i)ᵀ [Σ_j φ(k_j) v_jᵀ]``: a ``d × d`` state summed once.
RoPE enters the numerator only (rotated features can have negative inner products)::

    out_i = Σ_j [R_i φ(q_i)]ᵀ[R_j φ(k_j)] v_j  /  (Σ_j φ(q_i)ᵀ φ(k_j) + eps)

φ is elu+1 or relu; R_i rotates each channel pair by the angle of row i of ``cos, sin`` (RoPE: position_i times the
pair's frequency); both sums run over the kept keys only: ``j <= i`` when causal, and ``key_padding_mask[b, j] != 0``.
``feature_map="cosine"`` is ``sim = 1 + cos(R_i q_i, R_j k_j)``: the features ``[R q̂, 1]`` in both sums. Causal
attention is summed chunk by chunk: memory O(chunk² + d²) per head whatever N is. Sources: docs/attention.md.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .. import positions as P
from .._checks import check_bool, check_causal_rope, check_positive_int
from ..errors import InputError, InputTypeError
from ..positions import Positions, check_attention_mask
from ..rope import RoPE
from ..rotation import rotate
from ..tables import RotaryTables, table_dtype
from .attention import check_hidden_states

__all__ = ["FEATURE_MAPS", "RotaryLinearAttention", "linear_attention_reference", "rotary_linear_attention"]

FeatureMap = Literal["elu", "relu", "cosine"]
#: feature maps φ for Su's scheme; "cosine" selects the 1 + cosine-similarity scheme instead
FEATURE_MAPS = ("elu", "relu", "cosine")


def _phi(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    if feature_map == "elu":
        return F.elu(x) + 1.0
    if feature_map == "relu":
        return F.relu(x)
    raise InputError(f"unknown feature_map {feature_map!r}; choose one of {', '.join(FEATURE_MAPS)}")


def _with_one(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((x, torch.ones_like(x[..., :1])), dim=-1)


def _features(
    q: torch.Tensor, k: torch.Tensor, tables: RotaryTables, feature_map: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(numerator q, numerator k, denominator q, denominator k) features, ``[B, H, S, D or D+1]``."""
    if feature_map == "cosine":
        q_hat, k_hat = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        q_rot, k_rot = rotate([q_hat, k_hat], tables, kinds=("q", "k"), names=("q", "k"))
        q_num, k_num = _with_one(q_rot), _with_one(k_rot)
        return q_num, k_num, q_num, k_num
    phi_q, phi_k = _phi(q, feature_map), _phi(k, feature_map)
    q_num, k_num = rotate([phi_q, phi_k], tables, kinds=("q", "k"), names=("q", "k"))
    return q_num, k_num, phi_q, phi_k


def _key_mask(key_padding_mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """A ``[B, S]`` bool mask of the keys to keep (1/0 or bool, like RotaryAttention's attention_mask)."""
    if key_padding_mask is None:
        return None
    mask = check_attention_mask(key_padding_mask, name="key_padding_mask")
    if mask.shape != (q.shape[0], q.shape[2]):
        raise InputError(f"key_padding_mask must be [B, S] = {(q.shape[0], q.shape[2])}, got {tuple(mask.shape)}")
    return mask.to(q.device)


def _global_sum(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``out_i = Σ_j (q_i·k_j) v_j`` over all j: one ``[D, Dv]`` state. ``[B,H,S,D]``, ``[B,H,S,Dv]``."""
    state = torch.einsum("bhsd,bhse->bhde", k, v)
    return torch.einsum("bhsd,bhde->bhse", q, state)


def _causal_sum(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``out_i = Σ_{j<=i} (q_i·k_j) v_j`` chunk by chunk: an earlier-chunk state plus a triangular block."""
    seq_len = q.shape[2]
    state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    inside = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    outputs = []
    for start in range(0, seq_len, chunk_size):
        q_c, k_c, v_c = (t[:, :, start : start + chunk_size] for t in (q, k, v))
        n = q_c.shape[2]
        block = (q_c @ k_c.transpose(-1, -2)).masked_fill(~inside[:n, :n], 0.0)
        outputs.append(q_c @ state + block @ v_c)
        state = state + k_c.transpose(-1, -2) @ v_c
    return torch.cat(outputs, dim=2)


def _check_eps(eps: float) -> float:
    """The denominator's ``eps``: a finite number >= 0 (relu features or masked keys can sum to 0)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise InputError(
            f"eps must be a finite number >= 0, got {eps!r}: it keeps the denominator away from 0 (relu features "
            "or masked keys can sum to 0); the default is 1e-6"
        )
    return float(eps)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise InputError(
                f"{name} must be a floating [B, H, S, D] tensor, got {getattr(t, 'shape', type(t).__name__)}"
            )
    if q.shape != k.shape:
        raise InputError(f"q and k must have the same shape [B, H, S, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise InputError(f"v must be [B, H, S, Dv] with q's B, H, S = {tuple(q.shape[:3])}, got {tuple(v.shape)}")


def rotary_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    feature_map: FeatureMap = "elu",
    causal: bool = False,
    interleaved: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    chunk_size: int = 64,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Linear attention with RoPE in O(N·d²) time (see the module docstring): ``[B, H, S, Dv]`` in ``v``'s dtype.

    Args:
        q, k, v: ``[B, H, S, D]`` unrotated (φ, then the rotation, are applied here), ``[B, H, S, Dv]``.
        cos, sin: ``[S, r]`` or ``[B, S, r]`` from :meth:`rotary.RoPE.cos_sin` for the pairing ``interleaved``.
        feature_map: ``"elu"`` (elu+1), ``"relu"``, or ``"cosine"``.
        causal, chunk_size: sum over ``j <= i`` only, chunk by chunk.
        key_padding_mask: ``[B, S]`` bool/0-1, 0 = padding key (excluded from both sums).
        eps: added to the denominator. Computed in fp32 (float64 for float64 inputs).

    Example:
        >>> from rotary.nn import rotary_linear_attention, linear_attention_reference
        >>> q, k, v = torch.randn(3, 1, 2, 50, 16).double()
        >>> cos, sin = RoPE(16).cos_sin(torch.arange(50))
        >>> fast = rotary_linear_attention(q, k, v, cos, sin, causal=True, chunk_size=8)
        >>> torch.allclose(fast, linear_attention_reference(q, k, v, cos, sin, causal=True))
        True
    """
    tables = RotaryTables.from_tensors(cos, sin, interleaved=interleaved)
    return _linear_attention(
        q,
        k,
        v,
        tables,
        feature_map=feature_map,
        causal=causal,
        key_padding_mask=key_padding_mask,
        chunk_size=chunk_size,
        eps=eps,
    )


def _linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tables: RotaryTables,
    *,
    feature_map: str,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    chunk_size: int,
    eps: float,
) -> torch.Tensor:
    _check_qkv(q, k, v)
    if feature_map not in FEATURE_MAPS:
        raise InputError(f"unknown feature_map {feature_map!r}; choose one of {', '.join(FEATURE_MAPS)}")
    check_positive_int(chunk_size, "chunk_size")
    check_bool(causal, "causal")
    _check_eps(eps)
    keep_keys = _key_mask(key_padding_mask, q)
    out_dtype = v.dtype
    if q.shape[2] == 0:  # no tokens: nothing to attend
        return v.new_zeros(v.shape)
    compute = torch.promote_types(v.dtype, torch.float32)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    q_num, k_num, q_den, k_den = _features(q, k, tables, feature_map)
    if keep_keys is not None:
        keep = keep_keys.to(compute)[:, None, :, None]
        k_num, k_den = k_num * keep, k_den * keep
    # the denominator needs only Σ_j φ(k_j), a [D] vector per query: a prefix sum (all terms >= 0,
    # so accumulating in one pass loses nothing to cancellation)
    if causal:
        numerator = _causal_sum(q_num, k_num, v, chunk_size)
        denominator = (q_den * k_den.cumsum(dim=2)).sum(-1, keepdim=True)
    else:
        numerator = _global_sum(q_num, k_num, v)
        denominator = q_den @ k_den.sum(dim=2, keepdim=True).transpose(-1, -2)
    return (numerator / (denominator + eps)).to(out_dtype)


def linear_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    feature_map: FeatureMap = "elu",
    causal: bool = False,
    interleaved: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The same attention through the explicit ``[S, S]`` similarity matrix: O(N²), a test oracle."""
    _check_qkv(q, k, v)
    if feature_map not in FEATURE_MAPS:
        raise InputError(f"unknown feature_map {feature_map!r}; choose one of {', '.join(FEATURE_MAPS)}")
    check_bool(causal, "causal")
    _check_eps(eps)
    keep_keys = _key_mask(key_padding_mask, q)
    out_dtype = v.dtype
    compute = torch.promote_types(v.dtype, torch.float32)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    q_num, k_num, q_den, k_den = _features(
        q, k, RotaryTables.from_tensors(cos, sin, interleaved=interleaved), feature_map
    )
    numerator_scores = q_num @ k_num.transpose(-1, -2)
    denominator_scores = q_den @ k_den.transpose(-1, -2)
    seq_len = q.shape[2]
    keep = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device)
    if causal:
        keep = keep.tril()
    keep = keep[None, None]
    if keep_keys is not None:
        keep = keep & keep_keys[:, None, None, :]
    numerator_scores = numerator_scores * keep
    denominator_scores = denominator_scores * keep
    return ((numerator_scores @ v) / (denominator_scores.sum(-1, keepdim=True) + eps)).to(out_dtype)


class RotaryLinearAttention(nn.Module):
    """Multi-head linear attention with RoPE in the numerator, O(N) in sequence length.

    ``hidden_size``, ``num_heads``: ``E``, ``H`` (``E // H`` even); ``feature_map``, ``causal``, ``chunk_size`` as
    :func:`rotary_linear_attention`; ``rope``: ``True`` (``RoPE(head_dim)``) or a table producer (:class:`rotary.XPos`
    only when causal); ``bias``: biases on the projections.

    Example:
        >>> from rotary.nn import RotaryLinearAttention
        >>> attn = RotaryLinearAttention(64, 4, causal=True)
        >>> attn(torch.randn(2, 100, 64)).shape
        torch.Size([2, 100, 64])
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        feature_map: FeatureMap = "elu",
        causal: bool = False,
        chunk_size: int = 64,
        rope: bool | nn.Module = True,
        bias: bool = False,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads)):
            check_positive_int(value, name)
        if hidden_size % num_heads:
            raise InputError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
        if feature_map not in FEATURE_MAPS:
            raise InputError(f"unknown feature_map {feature_map!r}; choose one of {', '.join(FEATURE_MAPS)}")
        check_positive_int(chunk_size, "chunk_size")
        check_bool(bias, "bias")
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, hidden_size // num_heads
        if self.head_dim % 2:
            raise InputError(
                f"head_dim = hidden_size // num_heads = {self.head_dim} must be even (RoPE rotates channel pairs); "
                "change hidden_size or num_heads"
            )
        self.feature_map, self.causal, self.chunk_size = feature_map, check_bool(causal, "causal"), chunk_size
        self.eps = _check_eps(eps)
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        if rope is True:
            rope = RoPE(self.head_dim)
        elif not (isinstance(rope, nn.Module) and callable(getattr(rope, "tables", None))):
            raise InputTypeError(
                f"rope must be True or an nn.Module with tables(positions) like rotary.RoPE, got {type(rope).__name__}"
            )
        self.rope = rope
        check_causal_rope(rope, self.causal, type(self).__name__)  # xPos: causal only

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        position_ids: torch.Tensor | Positions | None = None,
        attention_mask: torch.Tensor | None = None,
        tables: RotaryTables | None = None,
    ) -> torch.Tensor:
        """``hidden_states: [B, S, E]`` -> ``[B, S, E]``.

        ``position_ids``: integer ``[S]`` or ``[B, S]`` (or Positions), default ``0..S-1``; ``attention_mask``: ``[B,
        S]`` 1 = token, 0 = padding (ignored keys); ``tables``: computed once per model forward, default from
        ``self.rope``.
        """
        check_hidden_states(hidden_states, self.hidden_size, self.q_proj)
        check_causal_rope(self.rope, self.causal, type(self).__name__)  # causal or rope may have been reassigned
        batch, seq_len, _ = hidden_states.shape
        device = hidden_states.device
        shape = (batch, seq_len, self.num_heads, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if tables is None:
            if position_ids is None:
                positions = P.arange(seq_len, device=device)
            else:
                positions = P.from_ids(position_ids, batch=batch, seq_len=seq_len, device=device)
            tables = self.rope.tables(positions, dtype=table_dtype(q.dtype))
        out = _linear_attention(
            q,
            k,
            v,
            tables,
            feature_map=self.feature_map,
            causal=self.causal,
            key_padding_mask=attention_mask,
            chunk_size=self.chunk_size,
            eps=self.eps,
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, self.hidden_size))
