"""Moving a trained :class:`~rotary.models.Decoder` to another position encoding: every weight outside the encoding
keeps its shape, so :func:`transfer_position_encoding` copies them into the same model with the new one, a
starting point for fine-tuning.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..errors import InputError
from .decoder import Decoder

__all__ = ["position_state_names", "transfer_position_encoding"]


def _position_modules(model: Decoder) -> list[nn.Module]:
    """The modules of the model's position encoding: token embedding, rotary producers, every layer's score bias."""
    found = [model.embed_positions, model.rope, model.nope]
    for layer in model.layers:
        found += [layer.attn.rope if isinstance(layer.attn.rope, nn.Module) else None, layer.attn.position_bias]
    return [m for m in found if m is not None]


def position_state_names(model: Decoder) -> set[str]:
    """The ``state_dict`` entries that belong to the model's position encoding.

    Example:
        >>> from rotary.models import DecoderConfig
        >>> learned = DecoderConfig(hidden_size=32, num_layers=1, num_heads=2, position_encoding="learned")
        >>> sorted(position_state_names(Decoder(learned)))
        ['embed_positions.embedding.weight']
    """
    owners = {id(m) for m in _position_modules(model)}
    prefixes = [name + "." for name, module in model.named_modules(remove_duplicate=False) if id(module) in owners]
    return {key for key in model.state_dict() if any(key.startswith(p) for p in prefixes)}


def transfer_position_encoding(source: Decoder, position_encoding: str, **changes) -> Decoder:
    """A new ``Decoder`` with ``position_encoding`` and every weight of ``source`` outside its position encoding.

    ``source`` is left untouched; ``changes``: other ``DecoderConfig`` fields, which must not change the copied
    weights' shapes. The new model takes ``source``'s device, dtype and mode; the new encoding's own weights are
    freshly initialised (torch's global RNG). Raises ``rotary.errors.InputError`` if the non-position weights differ
    in names or shapes.

    Example:
        >>> from rotary.models import DecoderConfig
        >>> config = DecoderConfig(hidden_size=32, num_layers=1, num_heads=2, position_encoding="sinusoidal")
        >>> sinusoidal = Decoder(config)
        >>> rope = transfer_position_encoding(sinusoidal, "rope")
        >>> rope.config.position_encoding, torch.equal(rope.lm_head.weight, sinusoidal.lm_head.weight)
        ('rope', True)
    """
    config = dataclasses.replace(source.config, position_encoding=position_encoding, **changes)
    target = Decoder(config)
    source_state, target_state = source.state_dict(), target.state_dict()
    wanted = set(source_state) - position_state_names(source)
    offered = set(target_state) - position_state_names(target)
    if wanted != offered:
        raise InputError(
            f"the models differ outside their position encodings: only in the source {sorted(wanted - offered)[:6]}, "
            f"only in the new model {sorted(offered - wanted)[:6]}; transfer_position_encoding changes the "
            "encoding, not the architecture"
        )
    shapes = [k for k in wanted if source_state[k].shape != target_state[k].shape]
    if shapes:
        k = sorted(shapes)[0]
        raise InputError(
            f"{k} is {tuple(source_state[k].shape)} in the source and {tuple(target_state[k].shape)} in the new model; "
            "changes must not alter the shapes of the copied weights"
        )
    parameter = next(source.parameters())
    target.to(device=parameter.device, dtype=parameter.dtype)
    with torch.no_grad():
        for key in wanted:
            target_state[key].copy_(source_state[key])
    return target.train(source.training)
