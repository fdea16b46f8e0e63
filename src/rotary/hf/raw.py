"""A Hugging Face config as a plain dict, for producers that read keys transformers keeps as unvalidated extras
(dual-chunk RoPE, FoPE).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, InputTypeError

__all__ = ["config_as_dict", "text_part"]


def config_as_dict(config: Any) -> dict[str, Any]:
    """A deep copy of ``config`` as a dict: a ``PretrainedConfig``, a dict, or a path to config.json (or its folder).

    Example:
        >>> config_as_dict({"model_type": "qwen2", "rope_theta": 1e6})["rope_theta"]
        1000000.0
    """
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        path = os.path.join(path, "config.json") if os.path.isdir(path) else path
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no config file at {path!r}; pass a config.json path, a dict or a PretrainedConfig"
            )
        with open(path, encoding="utf-8") as fh:
            try:
                data = json.load(fh)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path} is not valid JSON ({exc}); pass a Hugging Face config.json") from None
    elif isinstance(config, Mapping):
        data = config
    elif callable(getattr(config, "to_dict", None)):
        data = config.to_dict()
    else:
        raise InputTypeError(
            "config must be a transformers PretrainedConfig, a dict or a path to config.json, got "
            f"{type(config).__name__}"
        )
    if not isinstance(data, Mapping):
        raise ConfigError("the config does not hold a JSON object; pass a Hugging Face config.json")
    return copy.deepcopy(dict(data))


def text_part(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``data``, or its ``text_config`` when ``key`` is there and not at the top (multimodal wrappers).

    Example:
        >>> text_part({"text_config": {"rope_theta": 5e6}}, "rope_theta")
        {'rope_theta': 5000000.0}
    """
    inner = data.get("text_config")
    if key not in data and isinstance(inner, Mapping) and key in inner:
        return dict(inner)
    return dict(data)
