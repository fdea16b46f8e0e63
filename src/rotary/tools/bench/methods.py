"""The built-in methods of ``rotary bench``: the two memory-traffic limits, rotary's paths, Hugging Face
(eager and compiled), rotary-embedding-torch and the complex form; on the GPU also rotary with device
positions and caller tables, Liger's rope and flash-attn's Triton rotary."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .harness import (
    COPY,
    INPLACE_PASS,
    INPLACE_TRAINING,
    METHODS,
    OUT_OF_PLACE_TRAINING,
    TRAINING_PASSES,
    TWO_COPIES,
    Inputs,
    Method,
    Prepared,
    Result,
    installed,
    register_suite,
    time_interleaved,
)

__all__: list[str] = []


def _fwd_bwd(forward: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]], inp: Inputs):
    q, k = inp.q.detach().clone().requires_grad_(), inp.k.detach().clone().requires_grad_()

    def call() -> None:
        q.grad = k.grad = None
        qo, ko = forward(q, k)
        torch.autograd.backward((qo, ko), (inp.grad_q, inp.grad_k))

    return call


def _hf():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb


def _hf_compiled():
    global _HF_COMPILED
    if _HF_COMPILED is None:
        import torch._dynamo

        # every shape x dtype x grad mode is one more specialisation of the same function: without
        # a higher limit dynamo would stop compiling after 8 and silently run the rest eagerly
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
        # compile in this process: a pool of compile workers starting up in the background would
        # take CPU from whatever group is being timed at that moment
        import torch._inductor.config

        torch._inductor.config.compile_threads = 1
        _HF_COMPILED = torch.compile(_hf(), dynamic=False)
    return _HF_COMPILED


_HF_COMPILED = None


def _compiled_module(inp: Inputs) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """rotary's ``RoPE`` under ``torch.compile`` (the kernel is a ``torch.library`` op in the graph)."""
    _hf_compiled()  # the same dynamo limits and in-process compilation as the HF row
    compiled = torch.compile(inp.rope, dynamic=False)

    def forward(q, k):
        return compiled(q, k)

    return forward


def _complex_form(inp: Inputs) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Meta LLaMA's form: pairs (2i, 2i+1) as complex numbers times a precomputed ``freqs_cis``."""
    S = inp.shape.seq_len
    freqs_cis = torch.polar(
        torch.ones(S, inp.shape.head_dim // 2), torch.outer(torch.arange(S).float(), inp.rope.inv_freq)
    )

    def forward(q, k):
        out = []
        for x in (q, k):
            xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            out.append(torch.view_as_real(xc * freqs_cis).flatten(-2).type_as(x))
        return out[0], out[1]

    return forward


def _ret(inp: Inputs):
    from rotary_embedding_torch import RotaryEmbedding

    emb = RotaryEmbedding(dim=inp.shape.head_dim)

    def forward(q, k):
        return emb.rotate_queries_or_keys(q), emb.rotate_queries_or_keys(k)

    return forward


def _torch_path(inp: Inputs):
    from rotary.kernels.eager import rotate_torch

    c, s = inp.cos.view(1, 1, *inp.cos.shape), inp.sin.view(1, 1, *inp.sin.shape)

    def forward(q, k):
        return (
            rotate_torch(q, c, s, interleaved=False, inplace=False),
            rotate_torch(k, c, s, interleaved=False, inplace=False),
        )

    return forward


class _Source(torch.autograd.Function):
    """A non-leaf copy of a leaf whose backward hands the gradient on unchanged."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad


class _Fresh(torch.autograd.Function):
    """Identity forward; the backward hands on a gradient made in advance, as attention's backward does."""

    @staticmethod
    def forward(ctx, x, box: list):  # type: ignore[override]
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return ctx.box.pop(), None


def _training_step(
    inp: Inputs, rotate: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
) -> Prepared:
    """``rotate(q, k)`` forward and backward as a training step runs it."""
    q_leaf, k_leaf = inp.q.detach().clone().requires_grad_(), inp.k.detach().clone().requires_grad_()

    def prepare():
        q_leaf.grad = k_leaf.grad = None
        q, k = _Source.apply(q_leaf), _Source.apply(k_leaf)
        boxes = [inp.grad_q.clone()], [inp.grad_k.clone()]

        def step() -> None:
            qr, kr = rotate(q, k)
            torch.autograd.backward((_Fresh.apply(qr, boxes[0]), _Fresh.apply(kr, boxes[1])), (inp.grad_q, inp.grad_k))

        return step

    prepared = Prepared(prepare)
    prepared.leaves = (q_leaf, k_leaf)  # whose .grad the last step wrote (for checks)
    return prepared


def _training_passes(inp: Inputs) -> Prepared:
    """The training-step rows' limit: q, k and both gradients cloned as those rows clone them, each passed over
    once in place.
    """

    def prepare():
        tensors = (inp.q.clone(), inp.k.clone(), inp.grad_q.clone(), inp.grad_k.clone())
        return lambda: [t.mul_(1.0) for t in tensors]

    return Prepared(prepare)


def _two_copies(inp: Inputs):
    """The fwd+bwd limit: forward and backward each read two tensors and write new ones."""
    return lambda: (inp.q.clone(), inp.k.clone(), inp.grad_q.clone(), inp.grad_k.clone())


#: the optional packages of the baselines (transformers and rotary-embedding-torch are in the [dev]
#: extra; Liger and flash-attn are GPU packages); a method needing one is skipped without it
HF, RET = "transformers", "rotary_embedding_torch"
LIGER, FLASH = "liger_kernel.ops.rope", "flash_attn.ops.triton.rotary"
BOTH = ("cpu", "cuda")


def _half_pairing(make: Callable[[Inputs], Callable[[], object]]) -> Callable[[Inputs], Callable[[], object] | None]:
    """``make`` for half-pairing groups only (HF's and Liger's functions rotate pairs (i, i + D/2))."""
    return lambda i: None if i.interleaved else make(i)


def _builtin_methods() -> list[Method]:
    return [
        Method(INPLACE_PASS, lambda i: lambda: (i.q.mul_(1.0), i.k.mul_(1.0)), devices=BOTH, inplace=True),
        Method(COPY, lambda i: lambda: (i.q.clone(), i.k.clone()), devices=BOTH),
        Method(
            "rotary fused, in place",
            lambda i: lambda: i.rope(i.q, i.k, offset=i.shape.start, inplace=True),
            devices=BOTH,
            inplace=True,
        ),
        Method("rotary fused, out of place", lambda i: lambda: i.rope(i.q, i.k, offset=i.shape.start), devices=BOTH),
        Method("rotary pure-torch path", lambda i: (lambda f: lambda: f(i.q, i.k))(_torch_path(i))),
        Method(
            "HF eager apply_rotary_pos_emb",
            _half_pairing(lambda i: lambda: _hf()(i.q, i.k, i.hf_cos, i.hf_sin)),
            requires=HF,
            devices=BOTH,
        ),
        Method(
            "HF under torch.compile",
            _half_pairing(lambda i: lambda: _hf_compiled()(i.q, i.k, i.hf_cos, i.hf_sin)),
            requires=HF,
            devices=BOTH,
        ),
        Method("rotary-embedding-torch 0.9.1", lambda i: (lambda f: lambda: f(i.q, i.k))(_ret(i)), requires=RET),
        Method(
            "rotary RoPE module under torch.compile", lambda i: (lambda f: lambda: f(i.q, i.k))(_compiled_module(i))
        ),
        Method("complex form (Meta LLaMA)", lambda i: (lambda f: lambda: f(i.q, i.k))(_complex_form(i))),
        # forward + backward
        Method(TWO_COPIES, _two_copies, backward=True, devices=BOTH),
        Method(
            "rotary fused, out of place", lambda i: _fwd_bwd(lambda q, k: i.rope(q, k), i), backward=True, devices=BOTH
        ),
        Method(TRAINING_PASSES, _training_passes, backward=True, devices=BOTH),
        Method(
            INPLACE_TRAINING,
            lambda i: _training_step(i, lambda q, k: i.rope(q, k, inplace=True)),
            backward=True,
            devices=BOTH,
            inplace=True,
        ),
        Method(OUT_OF_PLACE_TRAINING, lambda i: _training_step(i, i.rope), backward=True, devices=BOTH),
        Method("rotary pure-torch path", lambda i: _fwd_bwd(_torch_path(i), i), backward=True),
        Method(
            "HF eager apply_rotary_pos_emb",
            _half_pairing(lambda i: _fwd_bwd(lambda q, k: _hf()(q, k, i.hf_cos, i.hf_sin), i)),
            backward=True,
            requires=HF,
            devices=BOTH,
        ),
        Method(
            "HF under torch.compile",
            _half_pairing(lambda i: _fwd_bwd(lambda q, k: _hf_compiled()(q, k, i.hf_cos, i.hf_sin), i)),
            backward=True,
            requires=HF,
            devices=BOTH,
        ),
        Method("rotary RoPE module under torch.compile", lambda i: _fwd_bwd(_compiled_module(i), i), backward=True),
        Method("rotary-embedding-torch 0.9.1", lambda i: _fwd_bwd(_ret(i), i), backward=True, requires=RET),
        Method("complex form (Meta LLaMA)", lambda i: _fwd_bwd(_complex_form(i), i), backward=True),
    ]


METHODS.extend(_builtin_methods())


# the GPU's own rows ----------------------------------------------------------------------------


def _apply_rotary_tables(inp: Inputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """:func:`rotary.apply_rotary` on q and k with the caller's fp32 device tables ``[S, D]``."""
    from rotary.functional import apply_rotary

    def call():
        return (
            apply_rotary(inp.q, inp.cos, inp.sin, interleaved=inp.interleaved),
            apply_rotary(inp.k, inp.cos, inp.sin, interleaved=inp.interleaved),
        )

    return call


def _apply_rotary_positions(inp: Inputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """:func:`rotary.apply_rotary` on q and k with whole tables ``[T, D]`` and ``position_ids`` ``[B, S]``."""
    from rotary.functional import apply_rotary

    def call():
        return (
            apply_rotary(
                inp.q, inp.table_cos, inp.table_sin, position_ids=inp.position_ids, interleaved=inp.interleaved
            ),
            apply_rotary(
                inp.k, inp.table_cos, inp.table_sin, position_ids=inp.position_ids, interleaved=inp.interleaved
            ),
        )

    return call


def _liger_apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Liger's rope on q, k ``[B, H, S, D]`` with HF's tables ``[1, S, D]`` (it rotates a contiguous transposed
    copy, or q itself at S = 1); returns ``(q, k)``.
    """
    from liger_kernel.ops.rope import LigerRopeFunction

    out = LigerRopeFunction.apply(q, k, cos, sin)
    return out[0], out[1]


def _half_width(inp: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole tables as flash-attn takes them: one value per pair, ``[T, D/2]``, in q's dtype."""
    pick = (lambda t: t[:, ::2]) if inp.interleaved else (lambda t: t[:, : t.shape[1] // 2])
    return (
        pick(inp.table_cos).to(inp.dtype).contiguous(),  # type: ignore[arg-type]
        pick(inp.table_sin).to(inp.dtype).contiguous(),  # type: ignore[arg-type]
    )


class _FlashRotary(torch.autograd.Function):
    """flash-attn's Triton ``apply_rotary`` with the conjugate rotation as its backward."""

    @staticmethod
    def forward(ctx, x, cos, sin, offsets, interleaved):  # type: ignore[override]
        from flash_attn.ops.triton.rotary import apply_rotary

        ctx.save_for_backward(cos, sin, offsets)
        ctx.interleaved = interleaved
        return apply_rotary(x, cos, sin, seqlen_offsets=offsets, interleaved=interleaved)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        from flash_attn.ops.triton.rotary import apply_rotary

        cos, sin, offsets = ctx.saved_tensors
        dx = apply_rotary(grad, cos, sin, seqlen_offsets=offsets, interleaved=ctx.interleaved, conjugate=True)
        return dx, None, None, None, None


def _flash(
    inp: Inputs, *, inplace: bool = False, autograd: bool = False
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """flash-attn's Triton rotary on ``[B, S, H, D]`` views of q and k (nothing copied), half-width tables and
    ``seqlen_offsets`` ``[B]``; ``autograd``: through :class:`_FlashRotary`.
    """
    from flash_attn.ops.triton.rotary import apply_rotary

    cos, sin = _half_width(inp)
    offsets = inp.position_ids[:, 0].contiguous()  # type: ignore[index]

    def one(x: torch.Tensor) -> torch.Tensor:
        if autograd:
            return _FlashRotary.apply(x.transpose(1, 2), cos, sin, offsets, inp.interleaved).transpose(1, 2)
        out = apply_rotary(
            x.transpose(1, 2), cos, sin, seqlen_offsets=offsets, interleaved=inp.interleaved, inplace=inplace
        )
        return out.transpose(1, 2)

    def forward(q, k):
        return one(q), one(k)

    return forward


_LIGER_NOTE = "rotates [B, S, H, D]-contiguous copies of q and k in place (at S = 1: q and k themselves)"
_FLASH_NOTE = "q and k in two launches, half-width tables [T, D/2], seqlen_offsets on the device"


def _gpu_methods() -> list[Method]:
    cuda = ("cuda",)
    return [
        Method(
            "rope(q, k, position_ids=device ids)",
            lambda i: lambda: i.rope(i.q, i.k, position_ids=i.position_ids),
            devices=cuda,
        ),
        Method("rotary.apply_rotary, device cos/sin [S, D]", _apply_rotary_tables, devices=cuda),
        Method("rotary.apply_rotary, device tables [T, D] + position_ids", _apply_rotary_positions, devices=cuda),
        Method(
            "Liger rope (LigerRopeFunction)",
            _half_pairing(lambda i: lambda: _liger_apply(i.q, i.k, i.hf_cos, i.hf_sin)),
            note=_LIGER_NOTE,
            requires=LIGER,
            devices=cuda,
        ),
        Method(
            "flash-attn Triton rotary, out of place",
            lambda i: (lambda f: lambda: f(i.q, i.k))(_flash(i)),
            note=_FLASH_NOTE,
            requires=FLASH,
            devices=cuda,
        ),
        Method(
            "flash-attn Triton rotary, in place",
            lambda i: (lambda f: lambda: f(i.q, i.k))(_flash(i, inplace=True)),
            note=_FLASH_NOTE,
            requires=FLASH,
            devices=cuda,
            inplace=True,
        ),
        # forward + backward
        Method(
            "Liger rope (LigerRopeFunction)",
            _half_pairing(lambda i: _fwd_bwd(lambda q, k: _liger_apply(q, k, i.hf_cos, i.hf_sin), i)),
            backward=True,
            note=_LIGER_NOTE,
            requires=LIGER,
            devices=cuda,
        ),
        Method(
            "flash-attn Triton rotary, out of place",
            lambda i: _fwd_bwd(_flash(i, autograd=True), i),
            backward=True,
            note=_FLASH_NOTE + "; backward: the conjugate rotation, as flash_attn.layers.rotary",
            requires=FLASH,
            devices=cuda,
        ),
    ]


METHODS.extend(_gpu_methods())


# decoding: one rope(q, k) call per layer and step --------------------------------------------------

DECODE_POSITION = 4096


def decode_suite(options) -> list[Result]:
    """One decoding step's rotation at Llama-3-8B's shape (q ``[1, 32, 1, 128]``, k ``[1, 8, 1, 128]``,
    position 4096): rotary's forms against transformers' ``apply_rotary_pos_emb``; skipped by ``--quick``
    unless named in ``--suites``.
    """
    from rotary.rope import RoPE

    if getattr(options, "quick", False) and "decode" not in (getattr(options, "suites", None) or "").split(","):
        return []  # the quick run has its own small decode shape; --suites decode asks for this one
    dtypes = [d for d in options.dtypes.split(",")] if getattr(options, "dtypes", None) else ["fp32"]
    results: list[Result] = []
    for name in dtypes:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
        g = torch.Generator().manual_seed(0)
        q, k = torch.randn(1, 32, 1, 128, generator=g).to(dtype), torch.randn(1, 8, 1, 128, generator=g).to(dtype)
        rope = RoPE(128, max_position=2 * DECODE_POSITION)
        ids = torch.tensor([[DECODE_POSITION]])
        tables = rope.tables(ids)
        cos, sin = rope.cos_sin(ids)
        hf_cos, hf_sin = cos.to(dtype), sin.to(dtype)
        apply = _hf() if installed(HF) else None  # without transformers: rotary's rows, no ratio
        calls = _decode_calls(rope, q, k, ids, tables, apply, hf_cos, hf_sin)
        medians = time_interleaved(calls, options.repeats)
        hf = medians.get("HF eager apply_rotary_pos_emb")
        group = f"decode step 1x32/8x1x128 at position {DECODE_POSITION} {name}"
        for method, median in medians.items():
            ratios = {"HF eager speedup": hf / median} if hf else {}
            results.append(Result(group, method, False, median, options.repeats, ratios=ratios))
    return results


def _decode_calls(rope, q, k, ids, tables, apply, hf_cos, hf_sin) -> dict[str, Callable[[], object]]:
    from rotary.rotation import rotate

    calls = {
        "rope(q, k, offset=4096)": lambda: rope(q, k, offset=DECODE_POSITION),
        "rope(q, k, position_ids=[[4096]])": lambda: rope(q, k, position_ids=ids),
        "rope(q, k, offset=4096, inplace=True)": lambda: rope(q, k, offset=DECODE_POSITION, inplace=True),
        "rotary.rotate([q, k], tables once per forward)": lambda: rotate([q, k], tables, kinds=("q", "k")),
    }
    if apply is not None:
        calls["HF eager apply_rotary_pos_emb"] = lambda: apply(q, k, hf_cos, hf_sin)
    return calls


register_suite("decode", decode_suite)
