"""Generation with :class:`~rotary.models.Decoder`: KV caches, the decoding step, sampling and capture.

    prompt -> prefill (eager, fills one cache per layer) -> logits of the last token -> next_token
           -> decode_step(token, caches) per new token (static caches: captured by torch.compile or a
              CUDA graph when asked) -> next_token ...

Sampling and stopping stay on the device (nothing is read on the host per token), so a finished row emits
``pad_token_id`` rather than stopping the loop; sampling draws ``argmax(probs / q)``, ``q ~ Exp(1)``, the numbers
``torch.multinomial`` draws without its host check. The switches, the capture and what it keeps: docs/attention.md,
"Generation without host synchronisation".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import devices
from .. import positions as P
from .._checks import check_bool, check_int, check_positive_int, is_number
from ..errors import InputError, InputTypeError
from ..nn.cache import KVCache, StaticKVCache
from ..positions import check_attention_mask
from ._inputs import embedding_ids

__all__ = ["CAPTURE_LENGTH_STEP", "CAPTURE_MODES", "CapturedDecoding", "GenerationMixin", "next_token"]

#: what ``Decoder.generate(capture=...)`` accepts
CAPTURE_MODES = ("compile", "cuda_graph")
#: static caches of captured generation are this many slots long, rounded up: prompts of about the same
#: length reuse one cache and one captured step (capturing or compiling again costs seconds)
CAPTURE_LENGTH_STEP = 64


class CapturedDecoding:
    """The static caches and captured step ``generate(capture=...)`` keeps for its next call (copies start without)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.caches: list[StaticKVCache] = []
        self.step: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.keep: list[Any] = []  # tensors a CUDA graph reads and nothing else would keep alive

    def clear(self) -> None:
        self.key, self.caches, self.step, self.keep = None, [], None, []

    def __deepcopy__(self, memo: dict) -> CapturedDecoding:
        return CapturedDecoding()

    def __reduce__(self) -> tuple[type, tuple]:
        return (CapturedDecoding, ())


def next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The next token of every row from its logits ``[B, V]``, on the device: int64 ``[B, 1]``.

    ``temperature``: 0 for greedy (argmax), else a sample of ``softmax(logits / temperature)`` from ``generator``;
    ``top_k``: keep the ``k`` largest logits of each row (``None``: all).

    Example:
        >>> next_token(torch.tensor([[0.1, 2.0, -1.0]])).tolist()
        [[1]]
    """
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    # shifted first, so that a tiny temperature gives -inf and 0, never inf - inf = NaN
    logits = (logits - logits.max(-1, keepdim=True).values) / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / q).argmax(-1, keepdim=True)


class GenerationMixin:
    """Decoding for :class:`~rotary.models.Decoder`: caches, the decoding step, :meth:`generate` and its capture.

    The model provides ``config``, ``layers``, ``embed_tokens``, ``rope``, ``nope``, ``forward``, ``_logits`` and
    ``_captured = CapturedDecoding()``.
    """

    def new_cache(
        self,
        *,
        batch: int | None = None,
        max_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> list[KVCache] | list[StaticKVCache]:
        """One cache per layer, for :meth:`forward` ``(cache=...)`` and :meth:`decode_step`.

        Without ``max_len``: empty :class:`rotary.nn.KVCache` s. With it (and ``batch``):
        :class:`rotary.nn.StaticKVCache` s of ``max_len`` slots (prompt with padding plus new tokens), keys ``[batch,
        num_kv_heads, max_len, head_dim]``, of ``dtype`` and on ``device`` (default the model's).

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4)).eval()
            >>> ids = torch.randint(50, (2, 5))
            >>> cache = model.new_cache(batch=2, max_len=8)
            >>> with torch.no_grad():
            ...     prefill = model(ids, cache=cache)  # writes slots 0 .. 4
            ...     logits = model.decode_step(prefill[:, -1:].argmax(-1), cache)  # slot 5
            >>> logits.shape, int(cache[0].filled), tuple(cache[0].keys.shape)
            (torch.Size([2, 50]), 6, (2, 4, 8, 8))
        """
        if max_len is None:
            if batch is not None or dtype is not None or device is not None:
                raise InputError(
                    "batch, dtype and device size a static cache: pass max_len too (new_cache(batch=B, max_len=L)), "
                    "or none of them for growing KVCaches"
                )
            return [KVCache() for _ in self.layers]
        if batch is None:
            raise InputError(f"a static cache (max_len={max_len!r}) is made for one batch size: pass batch=B as well")
        weight = self.embed_tokens.weight
        c = self.config
        caches = [
            StaticKVCache(
                batch,
                c.num_kv_heads,
                max_len,
                c.head_dim,
                dtype=weight.dtype if dtype is None else dtype,  # type: ignore[arg-type]
                device=weight.device if device is None else device,
            )
            for _ in self.layers
        ]
        group = object()  # written together by every forward: the layers share one attention mask (StaticStep)
        for cache in caches:
            cache.group = group
        return caches

    def release_captured(self) -> None:
        """Free what :meth:`generate` keeps between calls with ``capture=...`` (the next such call captures again)."""
        self._capture_state().clear()

    def _capture_state(self) -> CapturedDecoding:
        """What :meth:`generate` keeps between captured calls (made here for unpickled models)."""
        held = self.__dict__.get("_captured")
        if held is None:
            held = self.__dict__["_captured"] = CapturedDecoding()
        return held

    def decode_step(self, input_ids: torch.Tensor, cache: list[StaticKVCache]) -> torch.Tensor:
        """One decoding step on static caches: the fp32 logits ``[B, V]`` of the token after ``input_ids``.

        ``input_ids``: int64 ``[B, 1]`` (or ``[B, S]``: the logits of the last); ``cache``: from :meth:`new_cache`,
        filled by a prefill. The tokens go to the next slot of every cache; nothing is read on the host (off the CPU),
        so the step can be captured.

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4)).eval()
            >>> cache = model.new_cache(batch=1, max_len=4)
            >>> with torch.no_grad():
            ...     _ = model(torch.tensor([[1, 2]]), cache=cache)
            ...     model.decode_step(torch.tensor([[3]]), cache).shape
            torch.Size([1, 50])
        """
        if not isinstance(cache, (list, tuple)) or not cache or not all(isinstance(c, StaticKVCache) for c in cache):
            raise InputTypeError(
                f"decode_step needs static caches (model.new_cache(batch=B, max_len=L)), got {type(cache).__name__}; "
                "with growing KVCaches call the model itself: model(input_ids, cache=cache)"
            )
        return self.forward(input_ids, cache=cache)[:, -1].float()

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        cache: str | None = None,
        capture: str | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
    ) -> torch.Tensor:
        """Continue ``input_ids`` by ``max_new_tokens`` tokens: int64 ``[B, S + max_new_tokens]``; see the module.

        Args:
            input_ids, attention_mask: int64/int32 ``[B, S]``, ``S >= 1``; 1 = token / 0 = left padding.
            temperature, top_k, generator: as :func:`next_token` (0 = greedy).
            use_cache: ``False`` recomputes the whole sequence every step (slow; a check of the cache).
            cache: ``"dynamic"`` (:class:`rotary.nn.KVCache`, the default) or ``"static"``
                (:class:`rotary.nn.StaticKVCache`).
            capture: ``"compile"`` or ``"cuda_graph"``: capture the decoding step (static cache implied).
            eos_token_id, pad_token_id: a row that emits eos then emits pad (default eos); every row runs all steps.

        Raises ``rotary.errors.InputError`` for a bad temperature, ``cache`` or ``capture`` (``"cuda_graph"`` off CUDA),
        and on the CPU for ids outside the vocabulary or a bad mask.

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4)).eval()
            >>> ids = torch.randint(50, (2, 5))
            >>> model.generate(ids, 4, cache="static").equal(model.generate(ids, 4))
            True
        """
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        if not is_number(temperature) or temperature < 0:
            raise InputError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
        if top_k is not None:
            check_positive_int(top_k, "top_k")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InputTypeError(
                f"generator must be a torch.Generator or None, got {generator!r} ({type(generator).__name__})"
            )
        use_cache = check_bool(use_cache, "use_cache")
        if cache not in (None, "dynamic", "static"):
            raise InputError(f"cache must be 'dynamic' (KVCache) or 'static' (StaticKVCache), got {cache!r}")
        if capture not in (None, *CAPTURE_MODES):
            raise InputError(f"capture must be None, 'compile' or 'cuda_graph', got {capture!r}")
        if capture is not None and cache == "dynamic":
            raise InputError(f"capture={capture!r} needs static shapes: use cache='static' (or leave cache unset)")
        static = cache == "static" or capture is not None
        if static and not use_cache:
            raise InputError(
                "use_cache=False recomputes every step without a cache; it cannot go with a static cache or capture"
            )
        vocab = self.config.vocab_size
        for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
            if value is not None and (check_int(value, name, minimum=0) >= vocab):
                raise InputError(f"{name}={value} is not a token id of this model (vocab_size={vocab})")
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise InputError(
                f"generate needs a prompt of at least one token, input_ids [B, S] with S >= 1, got "
                f"{getattr(input_ids, 'shape', input_ids)}"
            )
        ids, unknown = embedding_ids(input_ids, vocab)
        device = ids.device
        if capture == "cuda_graph" and device.type != "cuda":
            raise InputError(
                f"capture='cuda_graph' records the decoding step in a torch.cuda.CUDAGraph, which needs the model and "
                f"input_ids on a CUDA device, got {device}; use capture='compile' (any device) or capture=None"
            )
        mask = self._prompt_mask(attention_mask, ids)
        pad = eos_token_id if pad_token_id is None else pad_token_id
        stop = None if eos_token_id is None else (eos_token_id, pad)
        sample = dict(temperature=temperature, top_k=top_k, generator=generator)
        if max_new_tokens == 0:
            tokens = input_ids
        elif static:
            tokens = self._generate_static(input_ids, ids, unknown, mask, max_new_tokens, sample, capture, stop)
        else:
            tokens = self._generate_dynamic(input_ids, ids, unknown, mask, max_new_tokens, sample, use_cache, stop)
        return tokens

    def _prompt_mask(self, attention_mask: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
        """The prompt's 0/1 mask ``[B, S]`` (int), checked: a token in every row, left padding only."""
        if attention_mask is None:
            return torch.ones_like(ids)
        mask = check_attention_mask(attention_mask).to(ids.device).long()
        if mask.shape != ids.shape:
            raise InputError(f"attention_mask must be [B, S] = {tuple(ids.shape)}, got {tuple(mask.shape)}")
        if not devices.host_checks(ids.device):  # not read: the caller's contract there
            return mask
        # a row of padding only is an empty prompt: there is no token to continue
        empty = mask.sum(dim=1) == 0
        # new tokens are appended on the right: padding after a row's tokens would sit between its
        # prompt and its continuation, so the row would continue differently from its unpadded prompt
        right = (mask[:, 1:] < mask[:, :-1]).any(dim=1)
        if bool(empty.any()):
            rows = empty.nonzero().flatten().tolist()
            raise InputError(
                f"attention_mask row(s) {rows[:8]} mark no token: generate needs a prompt of at least one token in "
                "every row; drop those rows or give each a token"
            )
        if bool(right.any()):
            rows = right.nonzero().flatten().tolist()
            raise InputError(
                f"generate needs left padding, but row(s) {rows[:8]} have padding after their tokens (right "
                "padding); pad prompts on the left (tokenizer.padding_side = 'left')"
            )
        return mask

    @staticmethod
    def _stop(
        token: torch.Tensor, finished: torch.Tensor | None, stop: tuple[int, int] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows already finished emit the pad id; a row that emits eos is finished from now on."""
        if stop is None:
            return token, None
        eos, pad = stop
        if finished is not None:
            token = torch.where(finished, pad, token)
        done = token == eos
        return token, done if finished is None else finished | done

    def _generate_dynamic(
        self,
        input_ids: torch.Tensor,
        ids: torch.Tensor,
        unknown: torch.Tensor | None,
        mask: torch.Tensor,
        max_new_tokens: int,
        sample: dict,
        use_cache: bool,
        stop: tuple[int, int] | None,
    ) -> torch.Tensor:
        """:meth:`generate` on growing :class:`KVCache` s (or none: recomputing every step)."""
        self._prepare_tables(ids.shape[1] + max_new_tokens, ids.device)
        cache = self.new_cache() if use_cache else None
        new: list[torch.Tensor] = []
        step_input, finished = ids, None
        for _ in range(max_new_tokens):
            logits = self._logits(step_input, attention_mask=mask, position_ids=None, cache=cache, unknown=unknown)[
                :, -1
            ].float()
            token, finished = self._stop(next_token(logits, **sample), finished, stop)
            new.append(token)
            mask = torch.cat((mask, torch.ones_like(token)), dim=1)
            if use_cache:
                step_input, unknown = token, None
            else:
                step_input = torch.cat((step_input, token), dim=1)
                if unknown is not None:
                    unknown = torch.cat((unknown, torch.zeros_like(token, dtype=torch.bool)), dim=1)
        return torch.cat((input_ids, *new), dim=1)

    def _generate_static(
        self,
        input_ids: torch.Tensor,
        ids: torch.Tensor,
        unknown: torch.Tensor | None,
        mask: torch.Tensor,
        max_new_tokens: int,
        sample: dict,
        capture: str | None,
        stop: tuple[int, int] | None,
    ) -> torch.Tensor:
        """:meth:`generate` on static caches: an eager prefill, then one (captured) :meth:`decode_step` per token."""
        batch, prompt = ids.shape
        device, dtype = ids.device, self.embed_tokens.weight.dtype
        length = prompt + max_new_tokens - 1  # the last token is sampled, never fed back
        if capture is None:
            caches = self.new_cache(batch=batch, max_len=length, dtype=dtype, device=device)
            self._prepare_tables(length, device)

            def step(token: torch.Tensor) -> torch.Tensor:
                return self.decode_step(token, caches)  # type: ignore[arg-type]

        else:
            caches, step = self._captured_step(capture, batch, length, dtype, device)
        logits = self._logits(ids, attention_mask=mask, position_ids=None, cache=caches, unknown=unknown)[:, -1].float()
        out = torch.empty(batch, max_new_tokens, dtype=torch.int64, device=device)
        token, finished = self._stop(next_token(logits, **sample), None, stop)
        out[:, :1] = token
        for t in range(1, max_new_tokens):
            token, finished = self._stop(next_token(step(token), **sample), finished, stop)
            out[:, t : t + 1] = token
        return torch.cat((input_ids, out), dim=1)

    def _prepare_tables(self, length: int, device: torch.device) -> None:
        """Size the rotary tables for positions ``0 .. length - 1`` on ``device``: a device never reads them back."""
        if devices.host_checks(device):
            return  # the CPU sizes its tables from bounds it reads for free
        for producer in (self.rope, self.nope):
            prepare = getattr(producer, "prepare", None)
            if callable(prepare):
                prepare(length, device=device)

    def _captured_step(
        self, capture: str, batch: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[list[StaticKVCache], Callable[[torch.Tensor], torch.Tensor]]:
        """The static caches (reset) and captured step for this shape, kept from an earlier call when they fit."""
        max_len = -(-length // CAPTURE_LENGTH_STEP) * CAPTURE_LENGTH_STEP
        weights = tuple(p.data_ptr() for p in self.parameters())  # new parameter storage: capture again
        key = (capture, batch, max_len, dtype, device, weights)
        held = self._capture_state()
        if held.key != key:
            held.clear()
            self._prepare_tables(max_len, device)
            caches = self.new_cache(batch=batch, max_len=max_len, dtype=dtype, device=device)
            if capture == "compile":
                step, keep = self._compiled_step(caches, device), []
            else:
                step, keep = self._cuda_graph_step(caches, batch, device)
            held.key, held.caches, held.step, held.keep = key, caches, step, keep  # type: ignore[assignment]
        for c in held.caches:
            c.reset()
        return held.caches, held.step  # type: ignore[return-value]

    def _compiled_step(
        self, caches: list[StaticKVCache], device: torch.device
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """:meth:`decode_step` compiled: Inductor, and CUDA graphs on CUDA (``mode="reduce-overhead"``)."""
        cuda = device.type == "cuda"
        compiled = torch.compile(
            self.decode_step, mode="reduce-overhead" if cuda else None, fullgraph=True, dynamic=False
        )

        def step(token: torch.Tensor) -> torch.Tensor:
            if cuda:
                torch.compiler.cudagraph_mark_step_begin()  # the previous step's logits are consumed
            return compiled(token, caches)

        return step

    def _cuda_graph_step(
        self, caches: list[StaticKVCache], batch: int, device: torch.device
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[Any]]:
        """:meth:`decode_step` recorded in a ``torch.cuda.CUDAGraph`` after a warm-up on a side stream."""
        token = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.decode_step(token, caches)
        torch.cuda.current_stream(device).wait_stream(side)
        for c in caches:
            c.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.decode_step(token, caches)
        # the graph reads the rotary tables it was captured with: keep them alive even if the cache grows
        keep: list[Any] = [graph, token, logits]
        for producer in (self.rope, self.nope):
            if producer is not None and callable(getattr(producer, "tables", None)):
                keep.append(producer.tables(P.arange(1, device=device)))

        def step(new_token: torch.Tensor) -> torch.Tensor:
            token.copy_(new_token)
            graph.replay()
            return logits

        return step, keep
