"""The exponential cone and its dual: projection (optimality conditions, against CVXPY +
Clarabel), its Jacobian (central differences away from kinks, one-sided slopes at them), kink
flags, dtypes, extreme inputs, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from tests.conic.cones._checks import (
    central_jacobian,
    check_moreau,
    unit_rows,
    worst_gap_to_clarabel,
)

from dxopt.conic.cones.exp import DUAL_TO_PRIMAL, ExpCone, ExpDualCone

K = ExpCone()
KD = ExpDualCone()
INTERIOR = torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)  # interior of K and of K*


def in_k(x: torch.Tensor) -> torch.Tensor:
    r, s, t = x.unbind(-1)
    ps = torch.where(s > 0, s, torch.ones_like(s))
    return ((s > 0) & (s * torch.exp(r / ps) <= t)) | ((s == 0) & (r <= 0) & (t >= 0))


def in_kd(x: torch.Tensor) -> torch.Tensor:
    u, v, w = x.unbind(-1)
    nu = torch.where(u < 0, u, -torch.ones_like(u))
    return ((u < 0) & (-u * torch.exp(v / nu) <= math.e * w)) | ((u == 0) & (v >= 0) & (w >= 0))


def sample(region: str, n: int, seed: int) -> torch.Tensor:
    """Points of one region of the case analysis (unit norm)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 3, generator=g, dtype=torch.float64)
    a = z.abs() + 0.05
    if region == "k":
        s = a[:, 1]
        ratio = torch.clamp(z[:, 0] * 2, -8, 3)
        v = torch.stack([ratio * s, s, s * torch.exp(ratio) * (1 + a[:, 2])], -1)
    elif region == "polar":
        u = -a[:, 0]
        ratio = torch.clamp(z[:, 1] * 2, -3, 8)
        w = -u * torch.exp(ratio) / math.e * (1 + a[:, 2])
        v = -torch.stack([u, ratio * u, w], -1)
    elif region == "face":
        v = torch.stack([-a[:, 0], -a[:, 1], z[:, 2]], -1)
    else:
        v = torch.randn(4 * n, 3, generator=g, dtype=torch.float64)
        keep = ~in_k(v) & ~in_kd(-v) & ~((v[:, 0] <= 0) & (v[:, 1] <= 0))
        v = v[keep][:n]
    return unit_rows(v)


REGIONS = ("k", "polar", "face", "generic")


@pytest.mark.parametrize("region", REGIONS)
def test_projection_optimality_conditions(region):
    v = sample(region, 400, seed=REGIONS.index(region))
    scale = torch.exp(torch.linspace(-30, 30, v.shape[0], dtype=torch.float64))[:, None]
    v = v * scale
    p = K.project(v)
    check_moreau(
        p, v, member=in_k, member_dual=in_kd, interior=INTERIOR, interior_dual=INTERIOR, rtol=1e-13
    )
    if region == "k":
        assert torch.equal(p, v)
    if region == "polar":
        assert torch.equal(p, torch.zeros_like(v))
    if region == "face":
        expect = torch.stack([v[:, 0], 0 * v[:, 0], v[:, 2].clamp(min=0)], -1)
        assert torch.equal(p, expect)


def test_projection_matches_cvxpy_clarabel():
    cp = pytest.importorskip("cvxpy")
    x = cp.Variable(3)
    par = cp.Parameter(3)
    prob = cp.Problem(
        cp.Minimize(cp.sum_squares(x - par)), [cp.constraints.ExpCone(x[0], x[1], x[2])]
    )
    v = torch.cat([sample(r, 12, seed=10 + i) for i, r in enumerate(REGIONS)])
    p = K.project(v)
    assert bool(in_k(p + 1e-14 * INTERIOR).all())
    worst = worst_gap_to_clarabel(prob, x, par, v, p)
    # the interior-point answer is accurate to about sqrt(its gap tolerance)
    assert worst <= 1e-5, worst


def test_extreme_ratios_and_scales_stay_exact():
    tiny = 1e-300
    v = torch.tensor(
        [
            [tiny, -1.0, 0.5],
            [tiny, -1.0, -0.5],
            [-1.0, tiny, -0.5],
            [1.0, tiny, -0.3],
            [tiny, 1.0, -2.0],
            [1.0, -1e-20, 1e-30],
            [-1e-8, 1e-12, -1.0],
            [50.0, 1.0, 1.0],
            [-1.0, 1e-3, -1e-300],
        ],
        dtype=torch.float64,
    )
    for scale in (2.0**-660, 1.0, 2.0**660):  # powers of two: scaling is exact (or underflows)
        p = K.project(v * scale)
        assert bool(torch.isfinite(p).all())
        check_moreau(
            p,
            v * scale,
            member=in_k,
            member_dual=in_kd,
            interior=INTERIOR,
            interior_dual=INTERIOR,
            rtol=1e-13,
        )
        # positive homogeneity: Pi(c v) = c Pi(v)
        assert torch.allclose(p / scale, K.project(v * scale / scale), rtol=1e-13, atol=1e-300)
        assert bool(torch.isfinite(K.dproject(v * scale)).all())


def test_dproject_matches_central_differences_away_from_kinks():
    v = torch.cat([sample(r, 150, seed=20 + i) for i, r in enumerate(REGIONS)])
    v = v[~K.kink_primal(v, 1e-3)]
    assert v.shape[0] > 400
    jac = K.dproject(v)
    fd = central_jacobian(K.project, v, 1e-6)
    err = (jac - fd).abs().amax(dim=(-1, -2))
    assert float(err.max()) <= 1e-7, float(err.max())
    # the Jacobian of a projection is symmetric with eigenvalues in [0, 1]
    assert torch.allclose(jac, jac.transpose(-1, -2), atol=1e-12)
    eig = torch.linalg.eigvalsh(jac)
    assert float(eig.min()) >= -1e-12 and float(eig.max()) <= 1 + 1e-12


def test_kinks_are_flagged_and_one_sided_slopes_differ_there():
    v0 = sample("generic", 50, seed=31)
    b = K.project(v0)  # points of the boundary of K with outward normals n
    n = unit_rows(v0 - b)
    keep = ~K.kink_primal(b + 1e-2 * n, 1e-3)  # a clean generic side
    b, n = b[keep], n[keep]
    assert b.shape[0] > 20
    assert bool(K.kink_primal(b, 1e-9).all())
    h = 1e-7
    outside = (K.project(b + h * n) - K.project(b)) / h  # Pi(b + h n) = b: slope 0
    inside = (K.project(b) - K.project(b - h * n)) / h  # Pi = identity inside: slope n
    assert float(outside.abs().max()) <= 1e-6
    assert torch.allclose(inside, n, atol=1e-6)
    # just off the kink, each side's Jacobian gives its own one-sided slope
    d_out = K.dproject(b + 1e-6 * n) @ n[..., None]
    d_in = K.dproject(b - 1e-6 * n) @ n[..., None]
    assert float(d_out.abs().max()) <= 1e-5
    assert torch.allclose(d_in[..., 0], n, atol=1e-12)
    # the other kink sets: the apex, the planes bounding the face case, t = 0 on the face
    others = torch.tensor(
        [[0.0, 0.0, 0.0], [-1.0, 0.0, -0.5], [-1.0, 0.0, 0.5], [0.0, -1.0, 0.3], [-1.0, -1.0, 0.0]],
        dtype=torch.float64,
    )
    assert bool(K.kink_primal(others, 1e-12).all())
    # far from every kink: not flagged
    clean = torch.tensor(
        [[-1.0, 1.0, 3.0], [1.0, -1.0, -3.0], [-1.0, -1.0, 1.0]], dtype=torch.float64
    )
    assert not bool(K.kink_primal(clean, 1e-3).any())


def test_float32_agrees_with_float64_and_keeps_its_dtype():
    v = torch.cat([sample(r, 100, seed=40 + i) for i, r in enumerate(REGIONS)])
    p64 = K.project(v)
    p32 = K.project(v.float())
    assert p32.dtype == torch.float32
    assert float((p32.double() - p64).abs().max()) <= 1e-6
    j32 = K.dproject(v.float())
    assert j32.dtype == torch.float32
    keep = ~K.kink_primal(v, 1e-3)
    assert float((j32.double() - K.dproject(v))[keep].abs().max()) <= 1e-5


def test_batch_shapes():
    v = torch.randn(2, 5, 3, dtype=torch.float64)
    assert K.project(v).shape == (2, 5, 3)
    assert K.dproject(v).shape == (2, 5, 3, 3)
    assert K.kink_primal(v, 1e-6).shape == (2, 5)
    assert K.kink(v, torch.full((2, 5), 1e-6, dtype=torch.float64)).shape == (2, 5)
    assert K.dist(v).shape == (2, 5)
    assert torch.allclose(K.project(v)[1, 3], K.project(v[1, 3]))


def test_dist_and_dist_dual():
    v = torch.cat([sample(r, 50, seed=50 + i) for i, r in enumerate(REGIONS)])
    assert bool((K.dist(sample("k", 20, 1)) == 0).all())
    assert bool((K.dist_dual(-sample("polar", 20, 2)) <= 1e-15).all())
    # dist(v, K) = |Pi_{K*}(-v)| (Moreau), and dist(v, K*) = |Pi_K(-v)|
    assert torch.allclose(
        K.dist(v), torch.linalg.vector_norm(K.project_dual(-v), dim=-1), atol=1e-14
    )
    assert torch.allclose(
        K.dist_dual(v), torch.linalg.vector_norm(K.project(-v), dim=-1), atol=1e-14
    )


def test_dual_cone_projection_and_moreau():
    v = torch.cat([sample(r, 100, seed=60 + i) for i, r in enumerate(REGIONS)])
    v = torch.cat([v, -v])
    pd = KD.project(v)
    # Pi_{K*}(v) in K*, Pi_{K*}(v) - v in K (the dual of K*), orthogonal
    check_moreau(
        pd, v, member=in_kd, member_dual=in_k, interior=INTERIOR, interior_dual=INTERIOR, rtol=1e-13
    )
    # Moreau for the pair: v = Pi_K(v) - Pi_{K*}(-v)
    assert torch.allclose(K.project(v) - KD.project(-v), v, atol=1e-15)
    assert torch.allclose(KD.project_dual(v), K.project(v), atol=1e-15)
    keep = ~KD.kink_primal(v, 1e-3)
    fd = central_jacobian(KD.project, v[keep], 1e-6)
    assert float((KD.dproject(v[keep]) - fd).abs().max()) <= 1e-7
    assert torch.equal(KD.kink_primal(v, 1e-4), K.kink(v, 1e-4))


def test_dual_to_primal_map():
    t = torch.tensor(DUAL_TO_PRIMAL, dtype=torch.float64)
    u = -sample("polar", 200, seed=70)  # points of K*
    assert bool(in_kd(u).all())
    assert bool(in_k(u @ t.T + 1e-13 * INTERIOR).all())
    w = sample("generic", 200, seed=71)
    outside = ~in_kd(w + 1e-9 * INTERIOR)
    assert not bool(in_k(w[outside] @ t.T).any())


def test_backend_names():
    import clarabel

    assert isinstance(K.clarabel(), clarabel.ExponentialConeT)
    assert K.scs() == ("ep", 1)
    assert KD.scs() == ("ed", 1)
    assert K.dim == 3 and KD.dim == 3
    with pytest.raises(NotImplementedError, match="DUAL_TO_PRIMAL"):
        KD.clarabel()


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match=r"v must have shape \(\.\.\., 3\)"):
        K.project(torch.zeros(4, 2))
    with pytest.raises(TypeError, match="floating-point"):
        K.dproject(torch.zeros(4, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        K.project([1.0, 2.0, 3.0])  # type: ignore[arg-type]
