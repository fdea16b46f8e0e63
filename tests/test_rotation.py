"""rotary.rotate (rotation.py): the inputs it takes and refuses, the in-place rules, float64 accuracy."""

import pytest
import torch

import rotary


@pytest.fixture
def setup():
    rope = rotary.RoPE(64)
    return rope, rope.tables(torch.arange(8)), torch.randn(1, 4, 8, 64)


def test_rotate_takes_any_iterable_but_not_a_lone_tensor(setup):
    rope, tables, q = setup
    (out,) = rotary.rotate((x for x in [q]), tables)
    assert torch.equal(out, rope.rotate(q))
    with pytest.raises(TypeError, match=r"pass \[x\]"):
        rotary.rotate(q, tables)
    with pytest.raises(TypeError, match="list of tensors"):
        rotary.rotate(5, tables)


def test_a_4d_input_beside_a_packed_one_is_named_without_blaming_cu_seqlens():
    # the first input 3-D makes the call packed; a later 4-D one was told "packed k (with cu_seqlens) must be 3-D"
    # although no cu_seqlens was passed (rotary.rotate takes none)
    rope = rotary.RoPE(64)
    packed, four_d = torch.randn(5, 4, 64), torch.randn(1, 4, 5, 64)
    with pytest.raises(rotary.InputError, match=r"^k must be 3-D \[total_tokens, H, D\] as q is \(packed\)") as got:
        rope(packed, four_d, position_ids=torch.arange(5))
    assert "cu_seqlens" not in str(got.value) and "(1, 4, 5, 64)" in str(got.value)
    with pytest.raises(rotary.InputError, match=r"^x1 must be 3-D \[total_tokens, H, D\] as x0 is \(packed\)"):
        rotary.rotate([packed, four_d], rope.tables(torch.arange(5)))
    # with cu_seqlens, the packed call is the caller's choice: the message still says so
    with pytest.raises(rotary.InputError, match=r"packed q \(with cu_seqlens\) must be 3-D"):
        rope(four_d, packed, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))


def test_sparse_and_mkldnn_inputs_are_named(setup):
    # each failed inside torch ("Cannot access storage of SparseTensorImpl", "Could not run 'aten::empty_strided'
    # with arguments from the 'MkldnnCPU' backend")
    rope, tables, q = setup
    for x in (q.to_sparse(), q.to_mkldnn()):
        with pytest.raises(rotary.InputTypeError, match=r"x0 must be a dense \(strided\) tensor.*to_dense"):
            rotary.rotate([x], tables)
        with pytest.raises(rotary.InputTypeError, match=r"k must be a dense \(strided\) tensor.*to_dense"):
            rope(q, x)
        with pytest.raises(rotary.InputTypeError, match=r"x must be a dense \(strided\) tensor.*to_dense"):
            rotary.apply_rotary(x, tables.cos[:8], tables.sin[:8])


def test_rotate_refuses_fp8_inputs(setup):
    _, tables, q = setup
    with pytest.raises(TypeError, match="float8"):
        rotary.rotate([q.to(torch.float8_e4m3fn)], tables)


def test_float64_inputs_get_float64_accuracy_from_the_module(setup):
    rope, _, q = setup
    pos = torch.arange(2**20, 2**20 + 8)
    want = rotary.reference.rotate_matrix(q.double(), pos, rope.inv_freq.double())
    got = rope.rotate(q.double(), position_ids=pos)
    assert got.dtype == torch.float64
    assert float((got - want).abs().max()) < 1e-12  # float64 accuracy at position 2**20, not fp32's 1e-7
    cos, sin = rope.cos_sin(pos, dtype=torch.float64)
    assert cos.dtype == torch.float64
    assert float((rotary.apply_rotary(q.double(), cos, sin) - want).abs().max()) < 1e-12
    cos32, sin32 = rope.cos_sin(pos)  # tables given in fp32: the accuracy is theirs
    assert float((rotary.apply_rotary(q.double(), cos32, sin32) - want).abs().max()) > 1e-9


def test_inplace_on_a_leaf_that_requires_grad_is_named(setup):
    _, tables, _ = setup
    leaf = torch.randn(1, 4, 8, 64, requires_grad=True)
    with pytest.raises(ValueError, match="leaf tensor that requires grad"):
        rotary.rotate([leaf], tables, inplace=True)
    with torch.no_grad():  # allowed, as torch allows it
        rotary.rotate([leaf], tables, inplace=True)


def test_inplace_refuses_self_overlap_torch_cannot_classify(setup):
    _, tables, _ = setup
    base = torch.randn(1 * 4 * 8 * 64)
    # strides that make elements alias without an expanded (stride 0) dim
    x = base.as_strided((1, 4, 8, 64), (0, 64, 32, 1))
    with pytest.raises(ValueError, match="overlapping memory"):
        rotary.rotate([x], tables, inplace=True)
