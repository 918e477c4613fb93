"""Closed-form cone programs: every cone, both backends, batches, dtypes, the certificate."""

from __future__ import annotations

import math

import pytest
import torch

import dxopt.conic as dc
from dxopt import Status

from ._problems import F64, ball_rows, box_rows


def test_projection_onto_a_ball_as_an_socp():
    # min 1/2|x - c|^2 s.t. |x| <= r  ->  x = r c / |c| when |c| > r, else c
    g = torch.Generator().manual_seed(0)
    C = 2.0 * torch.randn(6, 4, dtype=F64, generator=g)
    C[0] *= 0.1  # inside the ball
    A, b = ball_rows(4, radius=1.5)
    sol = dc.solve(torch.eye(4, dtype=F64), -C, A, b, cones=[dc.SecondOrderCone(5)])
    norms = C.norm(dim=1, keepdim=True)
    expected = torch.where(norms > 1.5, 1.5 * C / norms, C)
    assert torch.allclose(sol.x, expected, atol=1e-12)
    # the multiplier: y = (lambda, -lambda x/|x|)-type, lambda = |c| - r when outside
    lam = (norms[:, 0] - 1.5).clamp(min=0)
    assert torch.allclose(sol.y[:, 0], lam, atol=1e-10)
    assert all(st is Status.SOLVED for st in sol.status[1:])
    assert max(sol.info.primal_residual) < 1e-12


def test_min_norm_distance_as_a_linear_objective():
    # min t s.t. |x - c| <= t, a'x = 1  ->  distance from c to the hyperplane
    a = torch.tensor([1.0, 2.0, 2.0], dtype=F64)
    c = torch.tensor([0.5, -1.0, 0.3], dtype=F64)
    # variables (x, t): zero row a'x = 1; SOC (t, x - c): s = b - A z = (t, x - c)
    A = torch.zeros(1 + 4, 4, dtype=F64)
    A[0, :3] = a
    A[1, 3] = -1.0
    A[2:, :3] = -torch.eye(3, dtype=F64)
    b = torch.cat([torch.tensor([1.0, 0.0], dtype=F64), -c])
    q = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=F64)
    sol = dc.solve(None, q, A, b, cones=[dc.ZeroCone(1), dc.SecondOrderCone(4)])
    dist = abs(float(a @ c) - 1.0) / float(a.norm())
    assert float(sol.x[3]) == pytest.approx(dist, abs=1e-10)
    foot = c - (float(a @ c) - 1.0) / float(a @ a) * a
    assert torch.allclose(sol.x[:3], foot, atol=1e-9)


@pytest.mark.parametrize("solver", ["clarabel", "scs"])
def test_smallest_eigenvalue_as_a_2x2_sdp(solver):
    # min <C, X> s.t. tr X = 1, X PSD  ->  lambda_min(C), X = u u'
    Cm = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=F64)
    c = dc.svec(Cm)  # <C, X> = svec(C)'svec(X)
    # variable z = svec(X); zero row tr X = z0 + z2 = 1; PSD: s = -(-z) = z
    A = torch.cat([torch.tensor([[1.0, 0.0, 1.0]], dtype=F64), -torch.eye(3, dtype=F64)])
    b = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    sol = dc.solve(None, c, A, b, cones=[dc.ZeroCone(1), dc.PSDCone(2)], solver=solver)
    lam, U = torch.linalg.eigh(Cm)
    assert float(c @ sol.x) == pytest.approx(float(lam[0]), abs=1e-9)
    X = dc.smat(sol.x, 2)
    assert torch.allclose(X, torch.outer(U[:, 0], U[:, 0]), atol=1e-7)
    assert sol.info.solvers[0] == solver


def test_scs_alone_and_clarabel_agree_on_a_mixed_batch():
    g = torch.Generator().manual_seed(1)
    n = 5
    Ab, bb = box_rows(n, -0.4, 0.4)
    As, bs = ball_rows(n, radius=0.8)
    A, b = torch.cat([Ab, As]), torch.cat([bb, bs])
    M = torch.randn(n, n, dtype=F64, generator=g)
    P = M @ M.T + 0.1 * torch.eye(n, dtype=F64)
    q = torch.randn(3, n, dtype=F64, generator=g)
    cones = [dc.NonnegCone(2 * n), dc.SecondOrderCone(n + 1)]
    a = dc.solve(P, q, A, b, cones=cones)
    s = dc.solve(P, q, A, b, cones=cones, solver="scs", fallback=False)
    assert set(s.info.solvers) == {"scs"}
    assert torch.allclose(a.x, s.x, atol=1e-8)
    assert torch.allclose(a.y, s.y, atol=1e-7)


def test_float32_in_float32_out_and_batched_P_A():
    g = torch.Generator().manual_seed(2)
    n = 3
    A, b = ball_rows(n)
    Pb = torch.stack([torch.eye(n, dtype=F64) * (1 + i) for i in range(4)])
    q = torch.randn(4, n, dtype=F64, generator=g) * 3
    Ab = A.expand(4, -1, -1).clone()
    sol64 = dc.solve(Pb, q, Ab, b, cones=[dc.SecondOrderCone(n + 1)])
    sol32 = dc.solve(
        Pb.float(), q.float(), Ab.float(), b.float(), cones=[dc.SecondOrderCone(n + 1)]
    )
    assert sol32.x.dtype == torch.float32 and sol64.x.dtype == F64
    assert torch.allclose(sol32.x.double(), sol64.x, atol=1e-6)
    for i in range(4):  # min (1+i)/2|x|^2 + q'x on the unit ball: x = -q/(1+i) projected
        c = -q[i] / (1 + i)
        expected = c / max(1.0, float(c.norm()))
        assert torch.allclose(sol64.x[i], expected, atol=1e-10)


def test_clean_point_is_exactly_in_the_cones_and_complementary():
    A, b = ball_rows(3)
    q = torch.tensor([3.0, -1.0, 2.0], dtype=F64)
    sol = dc.solve(torch.eye(3, dtype=F64), q, A, b, cones=[dc.SecondOrderCone(4)])
    cone = dc.SecondOrderCone(4)
    assert float(cone.dist(sol.s)) < 1e-15 and float(cone.dist(sol.y)) < 1e-15
    assert abs(float(sol.s @ sol.y)) < 1e-14
    assert math.isfinite(sol.info.gap[0]) and sol.info.gap[0] < 1e-12
