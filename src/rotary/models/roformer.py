"""RoFormer (Su et al. 2021): the BERT-style encoder that introduced RoPE, loadable from Hugging Face.

    input_ids, token_type_ids -> word + token-type embeddings -> LayerNorm -> dropout
        [-> embeddings_project when embedding_size != hidden_size]
        -> num_hidden_layers x post-LayerNorm block:
               x = LayerNorm(x + dropout(o_proj(attention(x))))   RoPE on q, k (and v if rotary_value),
               x = LayerNorm(x + dropout(W2 act(W1 x)))           interleaved pairs (2i, 2i+1)
        -> head: none (hidden states), masked LM, or sequence classification

Unlike BERT there is no absolute position embedding: position enters only through the rotation.
Positions are ``0..S-1`` per row, padding included, as in Hugging Face's implementation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from .. import positions as P
from .._checks import check_positive_int
from ..errors import InputError, InputTypeError
from ..nn.attention import RotaryAttention
from ..positions import Positions
from ..rope import RoPE
from ..tables import RotaryTables, table_dtype
from ._inputs import check_token_ids

__all__ = ["RoFormer", "RoFormerConfig", "load_state_dict"]

Head = Literal["masked_lm", "sequence_classification"]
HEADS = ("masked_lm", "sequence_classification")

#: Hugging Face ``hidden_act`` names -> functions (the ones RoFormer checkpoints use)
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


@dataclass
class RoFormerConfig:
    """RoFormer hyper-parameters, named as in Hugging Face's ``RoFormerConfig``.

    ``embedding_size=None`` means ``hidden_size`` (then there is no ``embeddings_project``).
    """

    vocab_size: int = 50000
    embedding_size: int | None = None
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 1536
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    rotary_value: bool = False
    num_labels: int = 2
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            value = getattr(self, name)
            check_positive_int(value, name)
        if self.hidden_size % self.num_attention_heads:
            raise InputError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise InputError(f"head size {self.hidden_size // self.num_attention_heads} must be even for RoPE")
        if self.hidden_act not in ACTIVATIONS:
            raise InputError(f"unsupported hidden_act {self.hidden_act!r}; supported: {', '.join(sorted(ACTIVATIONS))}")

    @classmethod
    def from_hf(cls, config: Any) -> RoFormerConfig:
        """From a transformers ``RoFormerConfig``, its ``to_dict()``, or a path to ``config.json``."""
        if isinstance(config, (str, Path)):
            path = Path(config)
            path = path / "config.json" if path.is_dir() else path
            config = json.loads(path.read_text())
        values = config if isinstance(config, dict) else config.to_dict() if hasattr(config, "to_dict") else None
        if values is None:
            raise InputTypeError(
                f"config must be a transformers RoFormerConfig, a dict or a path, got {type(config).__name__}"
            )
        if values.get("model_type", "roformer") != "roformer":
            raise InputError(f"config is for model_type {values['model_type']!r}, not 'roformer'")
        if values.get("is_decoder") or values.get("add_cross_attention"):
            raise InputError("only the RoFormer encoder is supported (config has is_decoder/add_cross_attention set)")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known}
        if "num_labels" not in values and isinstance(values.get("id2label"), dict):
            kwargs["num_labels"] = len(values["id2label"])
        return cls(**kwargs)


class RoFormerEmbeddings(nn.Module):
    def __init__(self, c: RoFormerConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.embedding_size, padding_idx=c.pad_token_id)  # type: ignore[arg-type]
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.embedding_size)  # type: ignore[arg-type]
        self.norm = nn.LayerNorm(c.embedding_size, eps=c.layer_norm_eps)  # type: ignore[arg-type]
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.norm(self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)))


class RoFormerLayer(nn.Module):
    """Post-LayerNorm block (BERT): normalisation after each residual addition."""

    def __init__(self, c: RoFormerConfig, rope: RoPE) -> None:
        super().__init__()
        self.attention = RotaryAttention(
            c.hidden_size,
            c.num_attention_heads,
            rope=rope,
            rotary_value=c.rotary_value,
            dropout=c.attention_probs_dropout_prob,
            bias=True,
        )
        self.attention_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(c.hidden_size, c.intermediate_size)
        self.output = nn.Linear(c.intermediate_size, c.hidden_size)
        self.output_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None, positions: Positions, tables: RotaryTables
    ) -> torch.Tensor:
        attended = self.attention(x, attention_mask=attention_mask, position_ids=positions, tables=tables)
        x = self.attention_norm(x + self.dropout(attended))
        return self.output_norm(x + self.dropout(self.output(self.act(self.intermediate(x)))))


class RoFormerMaskedLMHead(nn.Module):
    def __init__(self, c: RoFormerConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.embedding_size)  # type: ignore[arg-type]
        self.norm = nn.LayerNorm(c.embedding_size, eps=c.layer_norm_eps)  # type: ignore[arg-type]
        self.decoder = nn.Linear(c.embedding_size, c.vocab_size)  # type: ignore[arg-type]
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(x))))


class RoFormerClassificationHead(nn.Module):
    """Classifies from the first token ([CLS]): dropout, dense, activation, dropout, projection."""

    def __init__(self, c: RoFormerConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.out_proj = nn.Linear(c.hidden_size, c.num_labels)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(x[:, 0])
        return self.out_proj(self.dropout(self.act(self.dense(x))))


class RoFormer(nn.Module):
    """The RoFormer encoder, with ``head`` ``None`` (hidden states), ``"masked_lm"`` or ``"sequence_classification"``.

    Example:
        >>> from rotary.models import RoFormer, RoFormerConfig
        >>> config = RoFormerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        ...                         intermediate_size=64, max_position_embeddings=64)
        >>> model = RoFormer(config, head="masked_lm").eval()
        >>> model(torch.randint(100, (2, 7))).shape
        torch.Size([2, 7, 100])
    """

    def __init__(self, config: RoFormerConfig, head: Head | None = None) -> None:
        super().__init__()
        if head is not None and head not in HEADS:
            raise InputError(f"unknown head {head!r}; use None, {', '.join(map(repr, HEADS))}")
        self.config, self.head = config, head
        self.embeddings = RoFormerEmbeddings(config)
        self.embeddings_project = (
            nn.Linear(config.embedding_size, config.hidden_size)  # type: ignore[arg-type]
            if config.embedding_size != config.hidden_size
            else None
        )
        # one RoPE for all layers; the paper's pairing (2i, 2i+1)
        self.rope = RoPE(
            config.hidden_size // config.num_attention_heads,
            interleaved=True,
            max_position=config.max_position_embeddings,
        )
        self.layers = nn.ModuleList(RoFormerLayer(config, self.rope) for _ in range(config.num_hidden_layers))
        self.mlm_head = RoFormerMaskedLMHead(config) if head == "masked_lm" else None
        self.classifier = RoFormerClassificationHead(config) if head == "sequence_classification" else None
        self.apply(self._init_weights)
        if self.mlm_head is not None and config.tie_word_embeddings:
            self.mlm_head.decoder.weight = self.embeddings.word_embeddings.weight

    def set_rope_scaling(self, scaling: Mapping[str, Any] | None) -> None:
        """Give every layer :meth:`rotary.RoPE.with_scaling`'s RoPE for ``scaling`` (a Hugging Face block or None).

        Raises ``ConfigError`` for an invalid block.

        Example:
            >>> from rotary.models import RoFormer, RoFormerConfig
            >>> model = RoFormer(RoFormerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
            ...                                 num_attention_heads=4, intermediate_size=64))
            >>> model.set_rope_scaling({"rope_type": "linear", "factor": 2.0})
            >>> model.layers[0].attention.rope.freqs.rope_type
            'linear'
        """
        if scaling is not None and not isinstance(scaling, Mapping):
            raise InputTypeError(f"scaling must be a dict (a rope_scaling block) or None, got {type(scaling).__name__}")
        rope = self.rope.with_scaling(scaling).to(self.rope.inv_freq.device)
        self.rope = rope
        for layer in self.layers:
            layer.attention.rope = rope

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[B, S, hidden_size]``, or the head's logits (``[B, S, vocab_size]``, ``[B, num_labels]``).

        ``input_ids``: int64 ``[B, S]``; ``attention_mask``: ``[B, S]`` 1 = token, 0 = padding; ``token_type_ids``:
        ``[B, S]``, default 0; ``position_ids``: ``[S]`` or ``[B, S]``, default ``0..S-1``.
        """
        check_token_ids(input_ids, self.config.vocab_size)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        else:
            check_token_ids(
                token_type_ids,
                self.config.type_vocab_size,
                name="token_type_ids",
                table="type_vocab_size",
                shape=tuple(input_ids.shape),
            )
        batch, seq_len = input_ids.shape
        if position_ids is None:
            positions = P.arange(seq_len, device=input_ids.device)
        else:
            positions = P.from_ids(position_ids, batch=batch, seq_len=seq_len, device=input_ids.device)
        x = self.embeddings(input_ids, token_type_ids)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        tables = self.rope.tables(positions, dtype=table_dtype(x.dtype))  # once, for every layer
        for layer in self.layers:
            x = layer(x, attention_mask, positions, tables)
        if self.mlm_head is not None:
            return self.mlm_head(x)
        if self.classifier is not None:
            return self.classifier(x)
        return x

    # -- loading Hugging Face weights ---------------------------------------------------------

    @classmethod
    def from_hf(
        cls, model_or_state_dict: Any, config: Any = None, *, head: Head | None | Literal["auto"] = "auto"
    ) -> RoFormer:
        """A RoFormer from Hugging Face RoFormer weights; in eval mode, equal to transformers' (~1e-5 in fp32).

        ``model_or_state_dict``: a transformers RoFormer model (any head), its ``state_dict()``, or a ``.safetensors`` /
        ``.bin`` file or a directory holding one (:func:`load_state_dict`); ``config``: a ``RoFormerConfig``, dict or
        path (default the model's or the directory's); ``head``: ``"auto"`` (the weights') or as :class:`RoFormer`.
        """
        directory = None
        if isinstance(model_or_state_dict, (str, Path)):
            path = Path(model_or_state_dict)
            directory = path if path.is_dir() else path.parent
            state_dict = load_state_dict(path)
        elif isinstance(model_or_state_dict, nn.Module):
            state_dict = model_or_state_dict.state_dict()
            config = config if config is not None else getattr(model_or_state_dict, "config", None)
        elif isinstance(model_or_state_dict, dict):
            state_dict = model_or_state_dict
        else:
            raise InputTypeError(
                "model_or_state_dict must be a transformers RoFormer model, a state dict or a path, "
                f"got {type(model_or_state_dict).__name__}"
            )
        if config is None:
            if directory is None or not (directory / "config.json").exists():
                raise InputError("config is required: pass the transformers RoFormerConfig (or a path to config.json)")
            config = directory / "config.json"
        rc = config if isinstance(config, RoFormerConfig) else RoFormerConfig.from_hf(config)
        state_dict = _strip_prefix(state_dict)
        if head == "auto":
            head = (
                "masked_lm"
                if any(k.startswith("cls.predictions.") for k in state_dict)
                else "sequence_classification"
                if any(k.startswith("classifier.") for k in state_dict)
                else None
            )
        model = cls(rc, head=head)
        model._check_position_table(state_dict)
        mapped = _map_hf_keys(state_dict, rc, head)
        try:
            missing, unexpected = model.load_state_dict(mapped, strict=False)
        except RuntimeError as exc:  # shape mismatches
            raise InputError(f"weights do not fit this RoFormer config: {exc}") from None
        tied = {"mlm_head.decoder.weight"} if head == "masked_lm" and rc.tie_word_embeddings else set()
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise InputError(f"weights do not fit this RoFormer config: missing {missing}, unexpected {unexpected}")
        return model.eval()

    def _check_position_table(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Hugging Face stores its sinusoidal table; it must be the standard one our RoPE computes."""
        table = state_dict.get("encoder.embed_positions.weight")
        if table is None:
            return
        n, dim = table.shape
        if dim != self.rope.head_dim:
            raise InputError(
                f"the checkpoint's encoder.embed_positions.weight has width {dim}, its head size, but this config has "
                f"head size {self.rope.head_dim} (hidden_size / num_attention_heads); the config does not match the "
                "checkpoint: check hidden_size and num_attention_heads"
            )
        cos, sin = self.rope.cos_sin(torch.arange(n))
        # HF layout: [sin(θ_0..θ_{d/2-1}) | cos(...)]; ours is interleaved, so take every other channel
        expected = torch.cat((sin[:, 0::2], cos[:, 0::2]), dim=-1)
        if dim != expected.shape[-1] or not torch.allclose(table.float(), expected, atol=1e-4):
            raise InputError(
                "encoder.embed_positions.weight is not the standard RoFormer sinusoidal table "
                f"(base 10000, head size {self.rope.head_dim}); this checkpoint uses different frequencies"
            )


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a ``.safetensors`` / ``.bin`` file or a directory holding one; never unpickles arbitrary objects."""
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).exists():
                path = path / name
                break
        else:
            raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {path}")
    if not path.exists():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    if path.suffix in (".bin", ".pt", ".pth"):
        return torch.load(path, map_location="cpu", weights_only=True)
    raise InputError(f"unsupported weights file {path.name!r}: use .safetensors or .bin")


def _strip_prefix(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.removeprefix("roformer."): v for k, v in state_dict.items()}


def _map_hf_keys(state_dict: dict[str, torch.Tensor], c: RoFormerConfig, head: str | None) -> dict[str, torch.Tensor]:
    """Rename Hugging Face RoFormer keys to this module's names (weights unchanged: same pairing)."""
    renames = {
        "embeddings.LayerNorm.": "embeddings.norm.",
        "attention.self.query.": "attention.q_proj.",
        "attention.self.key.": "attention.k_proj.",
        "attention.self.value.": "attention.v_proj.",
        "attention.output.dense.": "attention.o_proj.",
        "attention.output.LayerNorm.": "attention_norm.",
        "intermediate.dense.": "intermediate.",
        "output.dense.": "output.",
        "output.LayerNorm.": "output_norm.",
        "cls.predictions.transform.dense.": "mlm_head.dense.",
        "cls.predictions.transform.LayerNorm.": "mlm_head.norm.",
        "cls.predictions.decoder.": "mlm_head.decoder.",
    }
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key == "encoder.embed_positions.weight":
            continue  # recomputed by RoPE (checked in _check_position_table)
        if head != "masked_lm" and key.startswith("cls."):
            continue
        if key == "cls.predictions.bias":
            out.setdefault("mlm_head.decoder.bias", value)  # tied to decoder.bias in transformers
            continue
        if head != "sequence_classification" and key.startswith("classifier."):
            continue
        new = key.replace("encoder.layer.", "layers.")
        for old, repl in renames.items():
            if old in new:
                new = new.replace(old, repl)
                break
        out[new] = value
    if head == "masked_lm" and c.tie_word_embeddings:
        out.pop("mlm_head.decoder.weight", None)  # shares embeddings.word_embeddings.weight
    return out
