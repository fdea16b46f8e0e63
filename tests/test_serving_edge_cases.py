"""Edge cases of ``rotary.rotate_and_cache``'s kernel paths that an adversarial review found: the CUDA
branches (run by Triton's interpreter) give what the general path gives or refuse what it refuses (in
place with v sharing k's memory, k overlapping q, packed q with 2-D positions), and no kernel writes an
inference tensor outside inference mode."""

from __future__ import annotations

import textwrap

import pytest
import torch

import rotary
from helpers import run_interpreted

CUDA_BRANCH = textwrap.dedent(
    """
    import torch, rotary
    from rotary import devices, serving
    devices.host_checks = lambda device: False
    D, T = 8, 8
    cos, sin = rotary.RoPE(D).cos_sin(torch.arange(16))
    csc = torch.cat((cos[:, :4], sin[:, :4]), -1)
    pos = torch.tensor([[0, 1, 2], [3, 4, 5]])
    g = torch.Generator().manual_seed(0)
    q0, k0 = torch.randn(2, 3, 4, D, generator=g), torch.randn(2, 3, 2, D, generator=g)

    def v_is_k(fused, form):
        serving._fused_kernel_device = lambda q: fused
        q, k = q0.clone(), k0.clone()
        kc, vc = torch.zeros(2, T, 2, D), torch.zeros(2, T, 2, D)
        if form == "csc":
            rotary.rotate_and_cache(q, k, k, kc, vc, pos.clone(), positions=pos, cos_sin_cache=csc, inplace=True)
        else:
            tables = serving.tables_from_cos_sin_cache(csc, pos)
            rotary.rotate_and_cache(q, k, k, kc, vc, pos.clone(), tables, inplace=True)
        return vc

    general = v_is_k(False, "tables")
    for form in ("csc", "tables"):
        print("v_is_k", form, torch.equal(v_is_k(True, form), general))

    serving._fused_kernel_device = lambda q: True
    for form in ("csc", "tables"):
        q = q0.clone()
        try:
            if form == "csc":
                rotary.rotate_and_cache(q, q[:, :, :2], k0, torch.zeros(2, T, 2, D), torch.zeros(2, T, 2, D),
                                        pos.clone(), positions=pos, cos_sin_cache=csc, inplace=True)
            else:
                rotary.rotate_and_cache(q, q[:, :, :2], k0, torch.zeros(2, T, 2, D), torch.zeros(2, T, 2, D),
                                        pos.clone(), serving.tables_from_cos_sin_cache(csc, pos), inplace=True)
            print("overlap", form, False)
        except rotary.errors.InputError:
            print("overlap", form, True)

    qp, kp, vp = (torch.randn(5, h, D, generator=g) for h in (4, 2, 2))
    try:
        rotary.rotate_and_cache(qp, kp, vp, torch.zeros(1, T, 2, D), torch.zeros(1, T, 2, D),
                                torch.tensor([0, 2, 4, 6, 7]),
                                positions=torch.tensor([[1, 9, 3, 0, 15]]), cos_sin_cache=csc)
        print("packed_2d_positions", False)
    except rotary.errors.InputError:
        print("packed_2d_positions", True)
    """
)


@pytest.fixture(scope="module")
def cuda_branch() -> dict[str, bool]:
    lines = run_interpreted(CUDA_BRANCH).split("\n")
    return {" ".join(line.split()[:-1]): line.split()[-1] == "True" for line in lines if line.strip()}


@pytest.mark.parametrize("form", ["csc", "tables"])
def test_cuda_in_place_with_v_sharing_k_writes_what_the_general_path_writes(cuda_branch, form):
    assert cuda_branch[f"v_is_k {form}"]


@pytest.mark.parametrize("form", ["csc", "tables"])
def test_cuda_in_place_with_k_overlapping_q_is_refused_as_on_the_cpu(cuda_branch, form):
    assert cuda_branch[f"overlap {form}"]


def test_cuda_packed_q_with_2d_positions_is_refused_as_on_the_general_path(cuda_branch):
    assert cuda_branch["packed_2d_positions"]


def test_cpu_kernel_refuses_to_write_an_inference_cache_outside_inference_mode():
    rope = rotary.RoPE(8)
    cos, sin = rope.cos_sin(torch.arange(16))
    with torch.inference_mode():
        k_cache, v_cache = torch.zeros(1, 8, 1, 8), torch.zeros(1, 8, 1, 8)
    q, k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8)
    with pytest.raises(rotary.InputError, match="k_cache is an inference tensor"):
        rotary.rotate_and_cache(
            q,
            k,
            v,
            k_cache,
            v_cache,
            torch.arange(3)[None],
            positions=torch.arange(3)[None],
            cos_sin_cache=torch.cat((cos[:, :4], sin[:, :4]), -1),
        )


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda rope, q, k: rope(q, k, inplace=True), id="decoding fast path"),
        pytest.param(lambda rope, q, k: rope(q, k, position_ids=torch.arange(3)[None], inplace=True), id="general"),
        pytest.param(lambda rope, q, k: rotary.rotate([q, k], rope.tables(torch.arange(3)), inplace=True), id="rotate"),
    ],
)
def test_no_in_place_rotation_writes_an_inference_tensor_outside_inference_mode(write):
    rope = rotary.RoPE(8)
    with torch.inference_mode():
        q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    before = q.clone()
    with pytest.raises(rotary.InputError, match="(q|x0) is an inference tensor"):
        write(rope, q, k)
    assert torch.equal(q, before)
    with torch.inference_mode():  # inside it, as torch allows
        write(rope, q, k)
    assert not torch.equal(q, before)
