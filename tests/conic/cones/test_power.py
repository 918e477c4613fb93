"""The power cone: projection (optimality conditions, against CVXPY + Clarabel), its Jacobian
(central differences away from kinks, one-sided slopes at them), kink flags, dtypes, extreme
inputs, bad inputs."""

from __future__ import annotations

import pytest
import torch
from tests.conic.cones._checks import (
    central_jacobian,
    check_moreau,
    unit_rows,
    worst_gap_to_clarabel,
)

from dxopt.conic.cones.power import PowerCone

ALPHAS = (0.1, 0.3, 0.5, 0.8)
INTERIOR = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)  # interior of K_a and of K_a*


def _geo(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
    return x.clamp(min=0) ** a * y.clamp(min=0) ** (1 - a)


def members(a: float):
    def in_k(v: torch.Tensor) -> torch.Tensor:
        x, y, z = v.unbind(-1)
        return (x >= 0) & (y >= 0) & (_geo(x, y, a) >= z.abs())

    def in_kd(v: torch.Tensor) -> torch.Tensor:
        u, w, z = v.unbind(-1)
        return (u >= 0) & (w >= 0) & (_geo(u / a, w / (1 - a), a) >= z.abs())

    return in_k, in_kd


def sample(a: float, region: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(4 * n, 3, generator=g, dtype=torch.float64)
    frac = torch.rand(4 * n, generator=g, dtype=torch.float64)
    sign = torch.sign(z[:, 2])
    in_k, in_kd = members(a)
    if region == "k":
        x, y = z[:, 0].abs(), z[:, 1].abs()
        v = torch.stack([x, y, sign * frac * _geo(x, y, a)], -1)
    elif region == "polar":
        u, w = z[:, 0].abs(), z[:, 1].abs()
        v = -torch.stack([u, w, sign * frac * _geo(u / a, w / (1 - a), a)], -1)
    elif region == "flat":
        v = z.clone()
        v[:, 2] = 0
        v = v[~in_k(v) & ~in_kd(-v)]
    else:
        v = z[~in_k(z) & ~in_kd(-z) & (z[:, 2] != 0)]
    return unit_rows(v[:n])


REGIONS = ("k", "polar", "flat", "generic")


@pytest.mark.parametrize("a", ALPHAS)
@pytest.mark.parametrize("region", REGIONS)
def test_projection_optimality_conditions(a, region):
    cone = PowerCone(a)
    in_k, in_kd = members(a)
    v = sample(a, region, 300, seed=REGIONS.index(region))
    scale = torch.exp(torch.linspace(-30, 30, v.shape[0], dtype=torch.float64))[:, None]
    v = v * scale
    p = cone.project(v)
    check_moreau(
        p, v, member=in_k, member_dual=in_kd, interior=INTERIOR, interior_dual=INTERIOR, rtol=1e-13
    )
    if region == "k":
        assert torch.equal(p, v)
    if region == "polar":
        assert torch.equal(p, torch.zeros_like(v))
    if region == "flat":
        assert torch.equal(
            p, torch.stack([v[:, 0].clamp(min=0), v[:, 1].clamp(min=0), 0 * v[:, 2]], -1)
        )


@pytest.mark.parametrize("a", (0.2, 0.7))
def test_projection_matches_cvxpy_clarabel(a):
    cp = pytest.importorskip("cvxpy")
    cone = PowerCone(a)
    in_k, _ = members(a)
    x = cp.Variable(3)
    par = cp.Parameter(3)
    prob = cp.Problem(
        cp.Minimize(cp.sum_squares(x - par)), [cp.constraints.PowCone3D(x[0], x[1], x[2], a)]
    )
    v = torch.cat([sample(a, r, 8, seed=10 + i) for i, r in enumerate(REGIONS)])
    p = cone.project(v)
    assert bool(in_k(p + 1e-14 * INTERIOR).all())
    worst = worst_gap_to_clarabel(prob, x, par, v, p)
    assert worst <= 1e-5, worst


def test_tiny_roots_and_extreme_scales():
    # x > 0 > y with small z: the root rho ~ (x^a (|z|/|y|)^(1-a))^(1/a) is far below |z|
    v = torch.tensor(
        [
            [0.35, -0.69, 0.02],
            [1.0, -1.0, 1e-8],
            [-1.0, 1.0, 1e-12],
            [-0.78, 0.62, 0.0032],
            [1e-300, 1.0, -0.5],
            [-1.0, -1.0, 3.0],
            [1.0, 1e-20, 0.5],
        ],
        dtype=torch.float64,
    )
    for a in ALPHAS:
        cone = PowerCone(a)
        in_k, in_kd = members(a)
        for scale in (2.0**-660, 1.0, 2.0**660):
            vs = v * scale
            p = cone.project(vs)
            assert bool(torch.isfinite(p).all())
            check_moreau(
                p,
                vs,
                member=in_k,
                member_dual=in_kd,
                interior=INTERIOR,
                interior_dual=INTERIOR,
                rtol=1e-13,
            )
            # positive homogeneity, to round-off relative to |v| (small entries go subnormal)
            diff = (p / scale - cone.project(vs / scale)).abs().amax(-1)
            assert bool((diff <= 1e-13 * torch.linalg.vector_norm(v, dim=-1)).all())
            assert bool(torch.isfinite(cone.dproject(vs)).all())


@pytest.mark.parametrize("a", ALPHAS)
def test_dproject_matches_central_differences_away_from_kinks(a):
    cone = PowerCone(a)
    v = torch.cat([sample(a, r, 100, seed=20 + i) for i, r in enumerate(REGIONS)])
    v = v[~cone.kink_primal(v, 1e-3)]
    assert v.shape[0] > 200
    jac = cone.dproject(v)
    fd = central_jacobian(cone.project, v, 1e-6)
    err = (jac - fd).abs().amax(dim=(-1, -2))
    assert float(err.max()) <= 1e-7, float(err.max())
    assert torch.allclose(jac, jac.transpose(-1, -2), atol=1e-12)
    eig = torch.linalg.eigvalsh(jac)
    assert float(eig.min()) >= -1e-12 and float(eig.max()) <= 1 + 1e-12


@pytest.mark.parametrize("a", (0.3, 0.8))
def test_kinks_are_flagged_and_one_sided_slopes_differ_there(a):
    cone = PowerCone(a)
    v0 = sample(a, "generic", 60, seed=31)
    b = cone.project(v0)
    n = unit_rows(v0 - b)
    keep = ~cone.kink_primal(b + 1e-2 * n, 1e-3) & ~cone.kink_primal(b - 1e-2 * n, 1e-3)
    b, n = b[keep], n[keep]
    assert b.shape[0] > 10
    assert bool(cone.kink_primal(b, 1e-9).all())
    h = 1e-7
    outside = (cone.project(b + h * n) - cone.project(b)) / h
    inside = (cone.project(b) - cone.project(b - h * n)) / h
    assert float(outside.abs().max()) <= 1e-6
    assert torch.allclose(inside, n, atol=1e-6)
    d_out = cone.dproject(b + 1e-6 * n) @ n[..., None]
    d_in = cone.dproject(b - 1e-6 * n) @ n[..., None]
    assert float(d_out.abs().max()) <= 1e-5
    assert torch.allclose(d_in[..., 0], n, atol=1e-12)
    others = torch.tensor(
        [[0.0, 0.0, 0.0], [1.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    assert bool(cone.kink_primal(others, 1e-12).all())
    clean = torch.tensor(
        [[1.0, 1.0, 0.1], [-1.0, -1.0, 0.1], [1.0, -1.0, 0.5]], dtype=torch.float64
    )
    assert not bool(cone.kink_primal(clean, 1e-3).any())


def test_float32_agrees_with_float64_and_keeps_its_dtype():
    cone = PowerCone(0.3)
    v = torch.cat([sample(0.3, r, 100, seed=40 + i) for i, r in enumerate(REGIONS)])
    p32 = cone.project(v.float())
    assert p32.dtype == torch.float32
    assert float((p32.double() - cone.project(v)).abs().max()) <= 1e-6
    j32 = cone.dproject(v.float())
    assert j32.dtype == torch.float32
    keep = ~cone.kink_primal(v, 1e-3)
    assert float((j32.double() - cone.dproject(v))[keep].abs().max()) <= 1e-5


def test_dual_side_and_moreau():
    a = 0.3
    cone = PowerCone(a)
    in_k, in_kd = members(a)
    v = torch.cat([sample(a, r, 100, seed=60 + i) for i, r in enumerate(REGIONS)])
    v = torch.cat([v, -v])
    pd = cone.project_dual(v)
    check_moreau(
        pd, v, member=in_kd, member_dual=in_k, interior=INTERIOR, interior_dual=INTERIOR, rtol=1e-13
    )
    keep = ~cone.kink(v, 1e-3)
    fd = central_jacobian(cone.project_dual, v[keep], 1e-6)
    assert float((cone.dproject_dual(v[keep]) - fd).abs().max()) <= 1e-7


def test_dist_and_batch_shapes():
    cone = PowerCone(0.4)
    v = torch.randn(2, 5, 3, dtype=torch.float64)
    assert cone.project(v).shape == (2, 5, 3)
    assert cone.dproject(v).shape == (2, 5, 3, 3)
    assert cone.kink_primal(v, 1e-6).shape == (2, 5)
    assert cone.dist(v).shape == (2, 5)
    assert bool((cone.dist(sample(0.4, "k", 20, 1)) == 0).all())
    flat = v.reshape(-1, 3)
    assert torch.allclose(
        cone.dist(flat), torch.linalg.vector_norm(cone.project_dual(-flat), dim=-1), atol=1e-14
    )


def test_backend_names_and_bad_inputs():
    import clarabel

    cone = PowerCone(0.25)
    assert isinstance(cone.clarabel(), clarabel.PowerConeT)
    assert cone.scs() == ("p", 0.25)
    assert cone.dim == 3
    for bad in (0.0, 1.0, -0.5, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match=r"alpha must be a number in the open interval"):
            PowerCone(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"v must have shape \(\.\.\., 3\)"):
        cone.project(torch.zeros(3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        cone.project(torch.zeros(3, 3, dtype=torch.int32))
