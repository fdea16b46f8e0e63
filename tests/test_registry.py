"""Scoped registrations: what a block registers, replaces or removes is undone when it ends, raising or not."""

from __future__ import annotations

import pytest

from rotary._registry import Registry, scoped
from rotary.rope_types import ROPE_TYPES, register_rope_type


def test_a_scope_puts_back_a_replaced_builtin_and_drops_an_added_type_even_when_the_block_raises():
    builtin = ROPE_TYPES["linear"]
    with pytest.raises(RuntimeError, match="inside"), ROPE_TYPES.scope():
        register_rope_type("linear")(lambda *args: None)
        register_rope_type("test-scoped")(lambda *args: None)
        del ROPE_TYPES["default"]
        assert ROPE_TYPES["linear"] is not builtin and "test-scoped" in ROPE_TYPES
        raise RuntimeError("inside")
    assert ROPE_TYPES["linear"] is builtin and "test-scoped" not in ROPE_TYPES and "default" in ROPE_TYPES
    assert list(ROPE_TYPES)[:2] == ["default", "linear"]  # the order of registration, which listings show


def test_scoped_restores_lists_and_dicts_in_place_and_refuses_anything_else():
    methods, suites = ["a"], Registry(s=1)
    same_methods, same_suites = methods, suites
    with scoped(methods, suites):
        methods.append("b")
        suites["t"] = 2
    assert methods == ["a"] and suites == {"s": 1}
    assert methods is same_methods and suites is same_suites
    with pytest.raises(TypeError, match="scoped\\(\\) restores dicts and lists, got tuple"), scoped(("a",)):
        pass
