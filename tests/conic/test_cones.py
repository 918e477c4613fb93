"""Each cone's projection and its derivative, against closed forms and float64 central
differences, in every region; the kink flags and the one-sided rule; the PSD storage."""

from __future__ import annotations

import math

import pytest
import torch

from dxopt.conic import NonnegCone, PSDCone, SecondOrderCone, ZeroCone, smat, svec

F64 = torch.float64


def fd_jacobian(f, v: torch.Tensor, h: float) -> torch.Tensor:
    cols = [(f(v + h * e) - f(v - h * e)) / (2 * h) for e in torch.eye(v.numel(), dtype=F64)]
    return torch.stack(cols, dim=-1)


def check_derivative(cone, v: torch.Tensor) -> None:
    """The analytic Jacobian equals central differences at two step sizes (away from kinks
    the projection is smooth, so both agree to ~h^2)."""
    D = cone.dproject(v)
    for h in (1e-5, 1e-6):
        assert torch.allclose(D, fd_jacobian(cone.project, v, h), atol=1e-8, rtol=0)
    Dd = cone.dproject_dual(v)
    assert torch.allclose(Dd, fd_jacobian(cone.project_dual, v, 1e-6), atol=1e-8, rtol=0)


def test_zero_cone_projections_and_no_kinks():
    c = ZeroCone(3)
    v = torch.tensor([1.0, -2.0, 0.0], dtype=F64)
    assert torch.equal(c.project(v), torch.zeros(3, dtype=F64))
    assert torch.equal(c.project_dual(v), v)
    assert torch.equal(c.dproject_dual(v), torch.eye(3, dtype=F64))
    assert not bool(c.kink(v, 1e-3))
    assert c.dist(v) == pytest.approx(math.sqrt(5.0))
    assert float(c.dist_dual(v)) == 0.0


def test_nonneg_projection_derivative_and_kink_rule():
    c = NonnegCone(4)
    v = torch.tensor([1.5, -0.5, 2.0, -3.0], dtype=F64)
    assert torch.equal(c.project(v), torch.tensor([1.5, 0.0, 2.0, 0.0], dtype=F64))
    check_derivative(c, v)
    # one-sided slopes at the kink v_1 = 0: right 1, left 0; the rule takes the left (0)
    w = torch.tensor([1.0, 0.0, 2.0, -1.0], dtype=F64)
    for h in (1e-3, 1e-5):
        right = (c.project(w + h * torch.eye(4, dtype=F64)[1]) - c.project(w))[1] / h
        left = (c.project(w) - c.project(w - h * torch.eye(4, dtype=F64)[1]))[1] / h
        assert float(right) == pytest.approx(1.0) and float(left) == pytest.approx(0.0)
    assert bool(c.kink(w, 1e-9)) and not bool(c.kink(v, 1e-3))
    snapped = c.dproject_dual_snapped(
        w + torch.tensor([0, 1e-12, 0, 0], dtype=F64), torch.tensor(1e-9, dtype=F64)
    )
    assert float(snapped[1, 1]) == 0.0 and float(snapped[0, 0]) == 1.0


@pytest.mark.parametrize("region", ["inside", "polar", "middle"])
def test_soc_projection_closed_form_and_derivative(region):
    c = SecondOrderCone(4)
    x = torch.tensor([0.3, -1.2, 0.4], dtype=F64)
    r = float(torch.linalg.vector_norm(x))
    t = {"inside": 2.0 * r, "polar": -2.0 * r, "middle": 0.3 * r}[region]
    v = torch.cat([torch.tensor([t], dtype=F64), x])
    p = c.project(v)
    if region == "inside":
        assert torch.equal(p, v)
    elif region == "polar":
        assert torch.equal(p, torch.zeros(4, dtype=F64))
    else:  # (1/2)(1 + t/r)(r, x), on the cone's surface
        expected = 0.5 * (1 + t / r) * torch.cat([torch.tensor([r], dtype=F64), x])
        assert torch.allclose(p, expected, atol=1e-15)
        assert float(p[0]) == pytest.approx(float(torch.linalg.vector_norm(p[1:])))
    check_derivative(c, v)
    # Moreau: v = P_K(v) - P_K(-v), the two parts orthogonal
    assert torch.allclose(v, c.project(v) - c.project(-v), atol=1e-15)
    assert abs(float(c.project(v) @ c.project(-v))) < 1e-14


def test_soc_kinks_and_one_sided_rule():
    c = SecondOrderCone(3)
    x = torch.tensor([0.6, 0.8], dtype=F64)
    on_k = torch.cat([torch.tensor([1.0], dtype=F64), x])  # r = t: boundary of K
    on_polar = torch.cat([torch.tensor([-1.0], dtype=F64), x])  # r = -t
    apex = torch.zeros(3, dtype=F64)
    for v in (on_k, on_polar, apex):
        assert bool(c.kink(v, 1e-9))
    assert not bool(c.kink(torch.tensor([0.5, 0.6, 0.8], dtype=F64), 1e-3))
    atol = torch.tensor(1e-9, dtype=F64)
    # at r = t the rule takes the middle piece: its derivative from outside the cone
    d = torch.tensor([-1.0, 0.3, 0.2], dtype=F64)  # a direction leaving K
    for h in (1e-4, 1e-6):
        one_sided = (c.project(on_k + h * d) - c.project(on_k)) / h
        assert torch.allclose(c.dproject_dual_snapped(on_k, atol) @ d, one_sided, atol=10 * h)
    assert torch.equal(c.dproject_dual_snapped(on_polar, atol), torch.zeros(3, 3, dtype=F64))
    assert torch.equal(c.dproject_dual_snapped(apex, atol), torch.zeros(3, 3, dtype=F64))


def test_svec_is_an_isometry_in_clarabel_order_and_scs_perm_is_the_lower_triangle():
    X = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 5.0], [3.0, 5.0, 6.0]], dtype=F64)
    r2 = math.sqrt(2.0)
    # upper triangle, column by column: X00, X01, X11, X02, X12, X22
    assert torch.allclose(svec(X), torch.tensor([1, 2 * r2, 4, 3 * r2, 5 * r2, 6], dtype=F64))
    Y = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    Y = Y + Y.T
    assert float(svec(X) @ svec(Y)) == pytest.approx(float(torch.trace(X @ Y)))
    assert torch.equal(smat(svec(Y), 3), Y)
    # SCS: lower triangle column by column: X00, X10, X20, X11, X21, X22
    perm = PSDCone(3).scs_perm()
    assert torch.allclose(svec(X)[perm], torch.tensor([1, 2 * r2, 3 * r2, 4, 5 * r2, 6], dtype=F64))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_psd_projection_and_derivative(k):
    g = torch.Generator().manual_seed(k)
    for _ in range(3):
        M = torch.randn(k, k, dtype=F64, generator=g)
        v = svec(M + M.T)
        c = PSDCone(k)
        lam, U = torch.linalg.eigh(M + M.T)
        expected = svec(U @ torch.diag(lam.clamp(min=0)) @ U.T)
        assert torch.allclose(c.project(v), expected, atol=1e-13)
        check_derivative(c, v)


def test_psd_kink_rule_is_continuous_against_positive_eigenvalues():
    c = PSDCone(2)
    X = torch.diag(torch.tensor([2.0, 0.0], dtype=F64))  # a zero eigenvalue: a kink
    v = svec(X)
    assert bool(c.kink(v, 1e-9))
    D = c.dproject_dual_snapped(v, torch.tensor(1e-9, dtype=F64))
    # zero eigenvalue counted negative: directions in the zero eigenspace project to 0, the
    # mixed entry keeps B = 2 / (2 + 0) = 1, the positive eigenspace is the identity
    expected = torch.diag(torch.tensor([1.0, 1.0, 0.0], dtype=F64))
    assert torch.allclose(D, expected, atol=1e-15)
    # and it is the one-sided derivative for a direction that makes the eigenvalue negative
    d = torch.tensor([0.1, 0.2, -1.0], dtype=F64)
    for h in (1e-4, 1e-6):
        one_sided = (c.project(v + h * d) - c.project(v)) / h
        assert torch.allclose(D @ d, one_sided, atol=10 * h)


def test_batched_cones_match_one_by_one():
    g = torch.Generator().manual_seed(3)
    for c in (NonnegCone(3), SecondOrderCone(4), PSDCone(3)):
        V = torch.randn(5, c.dim, dtype=F64, generator=g)
        P, D = c.project(V), c.dproject(V)
        for i in range(5):
            assert torch.allclose(P[i], c.project(V[i]), atol=1e-14)
            assert torch.allclose(D[i], c.dproject(V[i]), atol=1e-14)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_cone_dimensions_are_checked(bad):
    with pytest.raises((TypeError, ValueError), match="must be"):
        SecondOrderCone(bad)
