"""The numbers behind the figures and reports (rotary.analysis)."""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import rotary
from helpers import NAMED, assert_named, hf_frequencies
from rotary import RoPE, analysis, frequencies, reference
from rotary.frequencies import Frequencies, default_inv_freq
from rotary.tables import TableCache
from strategies import FAST, odd_values
from variant_checks import is_int, is_number


# decay ---------------------------------------------------------------------------------------
def test_decay_bound_is_32_5_at_distance_0_for_d_128():
    assert float(analysis.decay_bound(128, 10000.0, [0])[0]) == pytest.approx(32.5, abs=1e-12)
    assert float(analysis.decay_bound(64, 10000.0, [0])[0]) == pytest.approx(16.5, abs=1e-12)  # (d/2 + 1) / 2


def test_decay_bound_matches_a_direct_sum():
    d, base = 128, 10000.0
    for m in (1, 7, 100, 256):
        theta = [base ** (-2 * i / d) for i in range(d // 2)]
        partial, total = 0j, 0.0
        for t in theta:
            partial += cmath.exp(1j * m * t)
            total += abs(partial)
        assert float(analysis.decay_bound(d, base, [m])[0]) == pytest.approx(total / (d // 2), rel=1e-12)


def test_decay_bound_envelope_decreases_to_256():
    bound = analysis.decay_bound(128)  # distances 0..256
    assert bound.shape == (257,)
    # it oscillates, so compare windows: the peaks of 64-token windows and the means of 32-token ones fall
    window_max = [float(bound[i : i + 64].max()) for i in range(0, 256, 64)]
    assert all(a > b for a, b in zip(window_max, window_max[1:])), window_max
    window_mean = [float(bound[i : i + 32].mean()) for i in range(0, 256, 32)]
    assert all(a > b for a, b in zip(window_mean, window_mean[1:])), window_mean
    assert float(bound[256]) < 32.5 / 3


def test_measured_decay_all_ones_is_sum_of_cosines():
    rope = RoPE(32)
    dist = [0, 1, 5, 40]
    got = analysis.measured_decay(rope, dist, kind="ones")
    inv = rope.inv_freq.double()
    want = [abs(float(2 * torch.cos(m * inv).sum())) for m in dist]  # each pair of ones gives 2 cos(mθ)
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    assert float(got[0]) == pytest.approx(32.0)


def test_measured_decay_random_uses_rotated_vectors():
    rope = RoPE(16)
    got = analysis.measured_decay(rope, [0, 3], kind="random", samples=5, seed=1)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 1, 1, 16, generator=g, dtype=torch.float64)
    k = torch.randn(5, 1, 1, 16, generator=g, dtype=torch.float64)
    for j, m in enumerate((0, 3)):
        qm = reference.rotate_matrix(q, torch.tensor([m]), rope.inv_freq)
        assert float(got[j]) == pytest.approx(float((qm * k).sum(-1).abs().mean()), rel=1e-6)


def test_measured_decay_rejects_bad_kind():
    with pytest.raises(ValueError, match="kind"):
        analysis.measured_decay(RoPE(8), [0], kind="zeros")
    with pytest.raises(ValueError, match="distances"):
        analysis.measured_decay(RoPE(8), [-1])


def test_decay_bound_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        analysis.decay_bound(127)


# per-pair profile ----------------------------------------------------------------------------
def test_pair_0_wavelength_is_2pi_and_unscaled_pairs_unchanged():
    p = analysis.scaling_profile(frequencies(128))
    assert p.wavelength[0] == pytest.approx(2 * math.pi, rel=1e-12)
    assert p.wavelength[63] == pytest.approx(2 * math.pi * 10000 ** (126 / 128), rel=1e-6)
    assert set(p.kind) == {"unchanged"} and p.full_factor == 1.0


def _fake(inv_freq: torch.Tensor, d: int, rope_type: str = "fake") -> Frequencies:
    return Frequencies(
        inv_freq=inv_freq.float(), attention_scaling=1.0, head_dim=d, rotary_dim=d, base=10000.0, rope_type=rope_type
    )


def test_profile_classifies_a_hand_made_ramp():
    d, factor = 16, 4.0
    base_inv = default_inv_freq(10000.0, d).double()
    ramp = torch.tensor([0, 0, 0.25, 0.5, 0.75, 1, 1, 1], dtype=torch.float64)
    inv = base_inv * (1 - ramp) + base_inv / factor * ramp
    p = analysis.scaling_profile(_fake(inv, d))
    assert p.kind == ["extrapolated"] * 2 + ["blended"] * 3 + ["interpolated"] * 3
    assert p.full_factor == pytest.approx(factor, rel=1e-6)
    assert p.ramp == pytest.approx(ramp.tolist(), abs=1e-6)


def test_profile_marks_zero_frequencies_not_rotated_and_raised_pairs():
    d = 8
    inv = default_inv_freq(10000.0, d).clone()
    inv[0] *= 2
    inv[3] = 0
    p = analysis.scaling_profile(_fake(inv, d))
    assert p.kind[0] == "raised" and p.kind[3] == "not rotated" and math.isinf(p.wavelength[3])


def test_profile_rejects_mismatched_pairs():
    with pytest.raises(ValueError, match="pairs"):
        analysis.scaling_profile(_fake(torch.ones(3), 8))


# the scaling methods (from the `scaling` work) -----------------------------------------------
def test_yarn_blended_range_matches_its_formula():
    d, base, orig, beta_fast, beta_slow, factor = 128, 10000.0, 4096, 32.0, 1.0, 4.0
    f = frequencies(
        d,
        base=base,
        scaling={
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": orig,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
        },
    )
    p = analysis.scaling_profile(f)

    def correction_dim(rotations: float) -> float:  # YaRN paper / transformers: pair index turning `rotations` times
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(correction_dim(beta_fast)), 0), min(math.ceil(correction_dim(beta_slow)), d - 1)
    assert p.pairs_of("extrapolated") == list(range(0, low + 1))
    assert p.pairs_of("blended") == list(range(low + 1, high))
    assert p.pairs_of("interpolated") == list(range(high, d // 2))
    want_ramp = [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(d // 2)]
    assert p.ramp == pytest.approx(want_ramp, abs=1e-5)
    assert f.attention_scaling == pytest.approx(0.1 * math.log(factor) + 1)


def test_linear_interpolates_every_pair():
    p = analysis.scaling_profile(frequencies(64, scaling={"rope_type": "linear", "factor": 4.0}))
    assert set(p.kind) == {"interpolated"} and p.full_factor == pytest.approx(4.0)


# precision and inspect -----------------------------------------------------------------------
def test_precision_limits():
    lim = {p.dtype: p for p in analysis.precision_limits(4096)}
    assert [lim[k].exact_positions for k in ("bfloat16", "float16", "float32")] == [256, 2048, 2**24]
    # 4095 lies in [2048, 4096): bf16 spacing 2^(11-7) = 16, fp16 spacing 2; half of each
    assert lim["bfloat16"].position_error == 8 and lim["float16"].position_error == 1
    assert lim["float32"].position_error == 0 and lim["float32"].angle_error == 2.0 ** (11 - 23) / 2
    # bf16 actually rounds 4095 by that much
    assert abs(float(torch.tensor(4095.0).to(torch.bfloat16)) - 4095) <= lim["bfloat16"].position_error


def test_inspect_warns_about_pairs_that_never_turn_and_precision():
    info = analysis.inspect_rope(RoPE(16, max_position=4096))
    slow = [i for i, t in enumerate(info.turns) if t < 1]
    assert slow == [6, 7]  # wavelengths 6283 and 19869 tokens > 4096
    assert any("pairs 6-7 never complete a turn" in w for w in info.warnings)
    assert any(w.startswith("bfloat16") for w in info.warnings)
    assert not any(w.startswith("float32") for w in info.warnings)
    long = analysis.inspect_rope(RoPE(16, max_position=131072))
    assert any(w.startswith("float32 angles") for w in long.warnings)
    d = info.to_dict()
    assert d["pairs"][0]["turns"] == pytest.approx(4096 / (2 * math.pi))


def test_inspect_rejects_bad_context():
    with pytest.raises(ValueError, match="context"):
        analysis.inspect_rope(RoPE(8), context=0)


# scores, positions ---------------------------------------------------------------------------
def test_score_matrix_depends_on_relative_distance_only():
    rope = RoPE(32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(32, generator=g), torch.randn(32, generator=g)
    s = analysis.score_matrix(rope, q, k, 24)
    assert torch.allclose(s[1:, 1:], s[:-1, :-1], atol=1e-5)  # Toeplitz
    qm = reference.rotate_matrix(q.double().expand(1, 5, 32), torch.arange(5), rope.inv_freq)
    kn = reference.rotate_matrix(k.double().expand(1, 5, 32), torch.arange(5), rope.inv_freq)
    assert torch.allclose(s[:5, :5], qm[0] @ kn[0].T, atol=1e-5)
    with pytest.raises(ValueError, match=r"shape \[32\]"):
        analysis.score_matrix(rope, torch.ones(16), k, 4)


def test_position_pca_is_the_top_two_principal_components():
    rope = RoPE(16)
    coords, explained = analysis.position_pca(rope, 50)
    assert coords.shape == (50, 2)
    theta = torch.arange(50, dtype=torch.float64)[:, None] * rope.inv_freq.double()[None, :]
    x = torch.cat((theta.cos(), theta.sin()), -1)
    x = x - x.mean(0)
    eig = torch.linalg.eigvalsh(x.T @ x).flip(0)
    assert (coords**2).sum(0).tolist() == pytest.approx(eig[:2].tolist(), rel=1e-6)
    assert explained.tolist() == pytest.approx((eig[:2] / eig.sum()).tolist(), rel=1e-6)
    with pytest.raises(ValueError, match="seq_len"):
        analysis.position_pca(rope, 2)


# verify --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", [dict(head_dim=32), dict(head_dim=32, interleaved=True), dict(head_dim=48, rotary_dim=16)]
)
def test_verify_passes_for_correct_configurations(kwargs):
    checks = analysis.verify(RoPE(**kwargs), seq_len=16)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert len(checks) == 8


def test_verify_catches_tables_built_for_the_other_pairing():
    rope = RoPE(32)
    rope._caches["original"] = TableCache(rope.inv_freq, 1.0, True, 64)  # interleaved tables, half pairing
    failed = {c.name for c in analysis.verify(rope, seq_len=16) if not c.passed}
    assert "tables match the half pairing" in failed
    assert "fast == block-diagonal matrix" in failed
    # (norms may survive: the fused kernel reads one angle per pair, so it still rotates, by wrong angles)


@FAST
@given(
    # a valid head width and base half of the time (from odd_values alone, 1 of 25 draws was valid)
    head_dim=st.one_of(st.sampled_from([2, 4, 8, 16]), odd_values),
    base=st.one_of(st.sampled_from([10000.0, 10.0, 1.5]), odd_values),
    distances=st.sampled_from([None, [0, 3], [-2, 5], [1.5], "abc", [], range(4)]),
)
@example(head_dim=8, base=10000.0, distances=[-2, 5])  # valid: distances of any sign
@example(head_dim=8, base=1.5, distances=range(4))  # valid: a base in (1, 2), a range
def test_decay_bound_matches_its_formula_or_names_the_argument(head_dim, base, distances):
    # valid: head_dim an even int > 0, base a finite number > 0, distances None or a sequence of ints (any sign),
    # and the angles [len(distances), head_dim / 2] complex128 within the analyses' 4 GiB (rotary._limits)
    m = list(range(257)) if distances is None else distances
    valid = is_int(head_dim) and head_dim > 0 and head_dim % 2 == 0 and is_number(base) and base > 0
    valid = valid and isinstance(m, (list, range)) and all(is_int(v) for v in m) and 16 * len(m) * head_dim <= 2**32
    try:
        bound = analysis.decay_bound(head_dim, base, distances)
    except NAMED as exc:
        assert not valid, f"valid arguments were refused: {exc}"
        assert_named(exc, "head_dim", "base", "distances")
        return
    assert valid, "invalid arguments were accepted"
    m = list(range(257)) if distances is None else list(distances)
    assert bound.shape == (len(m),) and bound.dtype == torch.float64
    half = head_dim // 2
    theta = float(base) ** (-2.0 * np.arange(half) / head_dim)  # NumPy, float64
    for j, dist in enumerate(m[:3]):  # (1 / (d/2)) Σ_j |Σ_{i<j} e^{i m θ_i}|
        total = np.abs(np.cumsum(np.exp(1j * dist * theta))).sum()
        assert float(bound[j]) == pytest.approx(total / half, rel=1e-9, abs=1e-12)


@FAST
@given(
    # weighted to valid values (2 of 25 draws reached the PCA)
    seq_len=st.sampled_from([3, 5, 1, 2, 3, 5, 0, -1, 2.5, True, "4", 10**6]),
    samples=st.sampled_from([1, 3, 1, 3, 0, -2, 1.5, 10**9]),
    distances=st.sampled_from([[0, 2], [0], [0, 2], [-1], [0.5], []]),
)
def test_scores_and_decay_measurements_or_a_named_error(seq_len, samples, distances):
    rope = rotary.RoPE(8)
    q = torch.randn(8, generator=torch.Generator().manual_seed(0))
    # valid: seq_len an int >= 1 (score_matrix) or >= 3 (position_pca, a 2-D PCA), samples an int >= 1,
    # distances a non-empty list of ints >= 0; and the float64 arrays each builds within 4 GiB (rotary._limits):
    # [S, max(S, 2 D)], [S, 3 D/2 + S], [samples, len(distances), D] for this D = 8
    seq_ok = is_int(seq_len) and seq_len >= 1
    scores_ok = seq_ok and 8 * seq_len * max(seq_len, 16) <= 2**32
    pca_ok = seq_ok and seq_len >= 3 and 8 * seq_len * (12 + seq_len) <= 2**32
    decay_ok = is_int(samples) and samples >= 1 and distances and all(is_int(v) and v >= 0 for v in distances)
    decay_ok = decay_ok and 64 * samples * len(distances) <= 2**32
    # the oracles: q at positions 0 .. S - 1 rotated by rotary.reference with transformers' default frequencies
    # (restated; docs/core.md: RoPE's are bit-identical), and the PCA of [cos mθ, sin mθ] by its eigenvalues
    inv_freq = hf_frequencies({"rope_type": "default"}, 10000.0, 8)[0]
    try:
        scores = analysis.score_matrix(rope, q, q, seq_len)
    except NAMED as exc:
        assert not scores_ok, f"a valid seq_len was refused: {exc}"
        assert_named(exc, "seq_len")
    else:
        assert scores_ok, "an invalid seq_len was accepted"
        qr = reference.rotate_complex(q.double().expand(seq_len, 8), torch.arange(seq_len), inv_freq)
        torch.testing.assert_close(scores, qr @ qr.T)
    try:
        pca = analysis.position_pca(rope, seq_len)
    except NAMED as exc:
        assert not pca_ok, f"a valid seq_len was refused: {exc}"
        assert_named(exc, "seq_len")
    else:
        assert pca_ok and pca[0].shape == (seq_len, 2)
        theta = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq.double()[None, :]
        x = torch.cat((theta.cos(), theta.sin()), -1)
        eig = torch.linalg.eigvalsh((x - x.mean(0)).T @ (x - x.mean(0))).flip(0)
        assert (pca[0] ** 2).sum(0).tolist() == pytest.approx(eig[:2].tolist(), rel=1e-6, abs=1e-9)
        assert pca[1].tolist() == pytest.approx((eig[:2] / eig.sum()).tolist(), rel=1e-6, abs=1e-9)
    try:
        decay = analysis.measured_decay(rope, distances, samples=samples)
    except NAMED as exc:
        assert not decay_ok, f"valid samples and distances were refused: {exc}"
        assert_named(exc, "samples", "distances")
    else:
        assert decay_ok, "invalid samples or distances were accepted"
        assert decay.shape == (len(distances),) and bool((decay >= 0).all())


@FAST
@given(
    rope=st.sampled_from([None, "rope", 64, torch.nn.Linear(2, 2)]),
    seq_len=st.sampled_from([4, 0, 2.5, 10**7]),
)
def test_analysis_names_a_rope_that_is_not_one(rope, seq_len):
    q = torch.ones(8)
    calls = {
        "score_matrix": lambda: analysis.score_matrix(rope, q, q, 4),
        "position_pca": lambda: analysis.position_pca(rope, 4),
        "measured_decay": lambda: analysis.measured_decay(rope, [0, 1]),
        "verify": lambda: analysis.verify(rope, seq_len=4),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"{name} measures a rotary.RoPE, got rope={type(rope).__name__}"):
            call()
    # valid: seq_len an int >= 1 whose checks fit in 4 GiB: 48 S (2 S + 12 D) bytes for D = 8
    valid = is_int(seq_len) and seq_len >= 1 and 48 * seq_len * (2 * seq_len + 96) <= 2**32
    try:
        checks = analysis.verify(rotary.RoPE(8), seq_len=seq_len)
    except NAMED as exc:
        assert not valid, f"a valid seq_len was refused: {exc}"
        assert_named(exc, "seq_len")
    else:
        assert valid and all(c.passed for c in checks)
