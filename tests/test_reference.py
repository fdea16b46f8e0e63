"""The reference forms against the seeds' worked examples, computed from first principles."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rotary
from helpers import hf_frequencies
from rotary import reference
from strategies import FAST


def test_2d_rotation_by_60_degrees_seed_003():
    inv = torch.tensor([1.0], dtype=torch.float64)
    R = reference.rotation_matrix(math.pi / 3, inv, 2)
    out = R @ torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert out.tolist() == pytest.approx([-1.23205081, 1.8660254], abs=1e-8)
    assert float(out.norm()) == pytest.approx(math.sqrt(5), abs=1e-12)  # 2.236, kept
    x = np.array([[1.0, 2.0]])
    assert reference.rotate_numpy(x, np.array([math.pi / 3]), np.array([1.0]))[0].tolist() == pytest.approx(
        out.tolist(), abs=1e-12
    )


def test_wo_ai_ni_example_seed_003():
    """ "爱" in "我爱你": d = 4, x = [0.2, 0.1, -0.3, 0.7], the second token (m = 1), paper pairing."""
    x = [0.2, 0.1, -0.3, 0.7]
    m = 1
    theta = [10000 ** (-2 * i / 4) for i in range(2)]  # θ_i = 10000^(-2i/d): 1 and 0.01
    # the element-wise form of the paper: x ⊙ cos(mθ) + rotate(x) ⊙ sin(mθ), rotate = (-x1, x0, -x3, x2)
    c = [math.cos(m * theta[i // 2]) for i in range(4)]
    s = [math.sin(m * theta[i // 2]) for i in range(4)]
    rot = [-x[1], x[0], -x[3], x[2]]
    want = [x[i] * c[i] + rot[i] * s[i] for i in range(4)]
    assert want == pytest.approx(
        [
            0.2 * math.cos(1) - 0.1 * math.sin(1),
            0.2 * math.sin(1) + 0.1 * math.cos(1),
            -0.3 * math.cos(0.01) - 0.7 * math.sin(0.01),
            -0.3 * math.sin(0.01) + 0.7 * math.cos(0.01),
        ]
    )
    inv = rotary.frequencies(4).inv_freq
    t = torch.tensor(x, dtype=torch.float64).view(1, 1, 1, 4)
    pos = torch.tensor([m])
    assert reference.rotate_matrix(t, pos, inv, interleaved=True).flatten().tolist() == pytest.approx(want, abs=1e-7)
    assert reference.rotate_complex(t, pos, inv, interleaved=True).flatten().tolist() == pytest.approx(want, abs=1e-7)
    fast = rotary.RoPE(4, interleaved=True).rotate(t, offset=m)
    assert fast.flatten().tolist() == pytest.approx(want, abs=1e-7)
    assert float(fast.norm()) == pytest.approx(math.sqrt(sum(v * v for v in x)), abs=1e-7)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_matrix_is_orthogonal_block_structure(interleaved):
    inv = rotary.frequencies(10, rotary_dim=6).inv_freq
    R = reference.rotation_matrix(17, inv, 10, interleaved=interleaved)
    assert torch.allclose(R @ R.T, torch.eye(10, dtype=torch.float64), atol=1e-12)
    assert torch.equal(R[6:, 6:], torch.eye(4, dtype=torch.float64))  # pass-through block
    # R_m^T R_n = R_{n-m}: the relative property in matrix form
    Rm, Rn = (reference.rotation_matrix(p, inv, 10, interleaved=interleaved) for p in (5, 12))
    assert torch.allclose(Rm.T @ Rn, reference.rotation_matrix(7, inv, 10, interleaved=interleaved), atol=1e-12)


def test_three_references_agree_in_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 12, generator=g, dtype=torch.float64)
    pos = torch.tensor([0, 1, 5, 100, 1000, 4096, 65536])
    inv = rotary.frequencies(12, rotary_dim=8).inv_freq
    for inter in (False, True):
        a = reference.rotate_matrix(x, pos, inv, interleaved=inter)
        b = reference.rotate_complex(x, pos, inv, interleaved=inter)
        c = reference.rotate_numpy(x.numpy(), pos.numpy(), inv.numpy(), interleaved=inter)
        assert torch.allclose(a, b, atol=1e-12) and np.allclose(a.numpy(), c, atol=1e-12)


@FAST
@given(
    head_dim=st.sampled_from([2, 4, 8, 6]),
    positions=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
    base=st.sampled_from([10.0, 500.0, 10000.0, 1e6]),
    interleaved=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_reference_forms_agree_with_each_other_and_with_rope(head_dim, positions, base, interleaved, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, len(positions), head_dim, generator=g, dtype=torch.float64)
    p = torch.tensor(positions)
    rope = rotary.RoPE(head_dim, base=base, interleaved=interleaved)
    # transformers' default frequencies, restated (docs/core.md: RoPE's inv_freq is bit-identical to them)
    inv_freq = hf_frequencies({"rope_type": "default"}, base, head_dim)[0].double()
    assert torch.equal(rope.inv_freq.double(), inv_freq)
    by_matrix = reference.rotate_matrix(x, p, inv_freq, interleaved=interleaved)
    by_complex = reference.rotate_complex(x, p, inv_freq, interleaved=interleaved)
    by_numpy = torch.from_numpy(reference.rotate_numpy(x.numpy(), p.numpy(), inv_freq.numpy(), interleaved=interleaved))
    torch.testing.assert_close(by_complex, by_matrix, rtol=0, atol=1e-10)
    torch.testing.assert_close(by_numpy, by_matrix, rtol=0, atol=1e-10)
    torch.testing.assert_close(x.norm(dim=-1), by_matrix.norm(dim=-1), rtol=0, atol=1e-10)  # a rotation
    out = rope.rotate(x[:, None], position_ids=p)[:, 0]
    torch.testing.assert_close(out, by_matrix, rtol=0, atol=1e-9)
