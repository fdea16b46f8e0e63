"""The built-in methods of ``rotary bench``: the two memory-traffic limits, rotary's paths, Hugging Face (eager and compiled), rotary-embedding-torch and the complex form."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .harness import METHODS, Inputs, Method

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


def _complex_form(inp: Inputs) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Meta LLaMA's form: pairs (2i, 2i+1) as complex numbers times a precomputed ``freqs_cis``."""
    S = inp.shape.seq_len
    freqs_cis = torch.polar(torch.ones(S, inp.shape.head_dim // 2), torch.outer(torch.arange(S).float(), inp.rope.inv_freq))

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
    from ..kernels.eager import rotate_torch

    c, s = inp.cos.view(1, 1, *inp.cos.shape), inp.sin.view(1, 1, *inp.sin.shape)

    def forward(q, k):
        return (
            rotate_torch(q, c, s, interleaved=False, inplace=False),
            rotate_torch(k, c, s, interleaved=False, inplace=False),
        )

    return forward


def _inplace_forward_backward(inp: Inputs):
    # In-place rotation needs a non-leaf input (as q straight out of a projection is): one cheap
    # q * 1 per call makes it, and is part of what is timed.
    q_leaf, k_leaf = inp.q.detach().clone().requires_grad_(), inp.k.detach().clone().requires_grad_()

    def call() -> None:
        q_leaf.grad = k_leaf.grad = None
        q, k = q_leaf * 1, k_leaf * 1
        inp.rope(q, k, inplace=True)
        torch.autograd.backward((q, k), (inp.grad_q, inp.grad_k))

    return call


def _builtin_methods() -> list[Method]:
    return [
        Method("limit: in-place pass (mul_)", lambda i: lambda: (i.q.mul_(1.0), i.k.mul_(1.0))),
        Method("limit: copy (clone)", lambda i: lambda: (i.q.clone(), i.k.clone())),
        Method("rotary fused, in place", lambda i: lambda: i.rope(i.q, i.k, inplace=True)),
        Method("rotary fused, out of place", lambda i: lambda: i.rope(i.q, i.k)),
        Method("rotary pure-torch path", lambda i: (lambda f: lambda: f(i.q, i.k))(_torch_path(i))),
        Method("HF eager apply_rotary_pos_emb", lambda i: lambda: _hf()(i.q, i.k, i.hf_cos, i.hf_sin)),
        Method("HF under torch.compile", lambda i: lambda: _hf_compiled()(i.q, i.k, i.hf_cos, i.hf_sin)),
        Method("rotary-embedding-torch 0.9.1", lambda i: (lambda f: lambda: f(i.q, i.k))(_ret(i))),
        Method("complex form (Meta LLaMA)", lambda i: (lambda f: lambda: f(i.q, i.k))(_complex_form(i))),
        # forward + backward
        Method("rotary fused, out of place", lambda i: _fwd_bwd(lambda q, k: i.rope(q, k), i), backward=True),
        Method(
            "rotary fused, in place",
            _inplace_forward_backward,
            backward=True,
            note="includes one q*1, k*1 to make non-leaf inputs",
        ),
        Method("rotary pure-torch path", lambda i: _fwd_bwd(_torch_path(i), i), backward=True),
        Method(
            "HF eager apply_rotary_pos_emb",
            lambda i: _fwd_bwd(lambda q, k: _hf()(q, k, i.hf_cos, i.hf_sin), i),
            backward=True,
        ),
        Method(
            "HF under torch.compile",
            lambda i: _fwd_bwd(lambda q, k: _hf_compiled()(q, k, i.hf_cos, i.hf_sin), i),
            backward=True,
        ),
        Method("rotary-embedding-torch 0.9.1", lambda i: _fwd_bwd(_ret(i), i), backward=True),
        Method("complex form (Meta LLaMA)", lambda i: _fwd_bwd(_complex_form(i), i), backward=True),
    ]


METHODS.extend(_builtin_methods())
