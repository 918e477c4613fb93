"""The batched torch interior point (:mod:`dxopt.conic.ipm`, ``solver="torch"``): its cone
algebra against exact identities, its solutions against closed forms and Clarabel, and the
hand-over of the samples it does not solve."""

from __future__ import annotations

import pytest
import torch
from tests.conic._problems import ball_rows, box_rows

import dxopt.conic as dc
from dxopt._core import Status
from dxopt.conic.ipm import run_torch
from dxopt.conic.ipm_cones import Scaling, ipm_layout
from dxopt.conic.problem import conic_problem

F64 = torch.float64


def _layout(cones):
    slices, start = [], 0
    for c in cones:
        slices.append(slice(start, start + c.dim))
        start += c.dim
    return ipm_layout(tuple(cones), tuple(slices)), start


def _interior(lay, B, m, gen):
    v = torch.randn(B, m, dtype=F64, generator=gen)
    shift = (-lay.min_eig(v)).clamp_min(0.0) + 0.5
    return v + shift[:, None] * lay.identity(B, F64)


CONES = (dc.NonnegCone(3), dc.SecondOrderCone(4), dc.SecondOrderCone(4), dc.SecondOrderCone(3))


def test_nt_scaling_maps_z_and_s_to_the_same_point():
    gen = torch.Generator().manual_seed(0)
    lay, m = _layout(CONES)
    s, z = _interior(lay, 6, m, gen), _interior(lay, 6, m, gen)
    W = Scaling(lay, s, z)
    torch.testing.assert_close(W.fwd(z), W.lam, rtol=0, atol=1e-12)  # W z = W^{-1} s
    torch.testing.assert_close(W.fwd(W.inv(s)), s, rtol=0, atol=1e-12)
    assert bool((lay.min_eig(W.lam) > 0).all())
    # s'z = lambda'lambda (W symmetric)
    torch.testing.assert_close((s * z).sum(-1), (W.lam**2).sum(-1), rtol=1e-12, atol=0)


def test_max_step_reaches_the_boundary_and_jordan_solve_inverts():
    gen = torch.Generator().manual_seed(1)
    lay, m = _layout(CONES)
    lam = _interior(lay, 8, m, gen)
    d = torch.randn(8, m, dtype=F64, generator=gen)
    a = lay.max_step(lam, d)
    assert bool(torch.isfinite(a).all())
    inside = lay.min_eig(lam + (a * (1 - 1e-9))[:, None] * d)
    outside = lay.min_eig(lam + (a * (1 + 1e-6))[:, None] * d)
    assert bool((inside >= 0).all()) and bool((outside < 0).all())
    # a direction inside the cone never reaches the boundary
    assert bool(torch.isinf(lay.max_step(lam, lam)).all())
    x = torch.randn(8, m, dtype=F64, generator=gen)
    torch.testing.assert_close(lay.jordan_solve(lam, lay.jordan(lam, x)), x, rtol=0, atol=1e-12)


def test_projection_onto_a_ball_matches_the_closed_form():
    # min 1/2 |x - c|^2 s.t. |x| <= r: x = c min(1, r / |c|)
    n, r = 4, 1.5
    gen = torch.Generator().manual_seed(2)
    size = torch.tensor([0.2, 0.5, 1.0, 2.0, 4.0], dtype=F64)[:, None]
    c = torch.randn(5, n, dtype=F64, generator=gen) * size
    A, b = ball_rows(n, r)
    sol = dc.solve(torch.eye(n, dtype=F64), -c, A, b, cones=[dc.SecondOrderCone(n + 1)],
                   solver="torch")  # fmt: skip
    exact = c * (r / c.norm(dim=-1, keepdim=True)).clamp(max=1.0)
    torch.testing.assert_close(sol.x, exact, rtol=0, atol=1e-9)
    assert sol.info.solvers == ("torch",) * 5


def test_lp_on_the_simplex_has_the_known_optimum():
    # min c'x s.t. sum x = 1, x >= 0: x = e_argmin(c), value min(c)
    n = 6
    gen = torch.Generator().manual_seed(3)
    c = torch.rand(4, n, dtype=F64, generator=gen)
    A = torch.cat([torch.ones(1, n, dtype=F64), -torch.eye(n, dtype=F64)])
    b = torch.cat([torch.ones(1, dtype=F64), torch.zeros(n, dtype=F64)])
    sol = dc.solve(None, c, A, b, cones=[dc.ZeroCone(1), dc.NonnegCone(n)], solver="torch")
    exact = torch.nn.functional.one_hot(c.argmin(-1), n).to(F64)
    torch.testing.assert_close(sol.x, exact, rtol=0, atol=1e-9)
    torch.testing.assert_close((c * sol.x).sum(-1), c.amin(-1), rtol=0, atol=1e-10)
    assert sol.info.solvers == ("torch",) * 4


def _random_socp(B: int, n: int, seed: int):
    """Least squares with an equality, a box, a norm ball and two random SOC rows."""
    gen = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, dtype=F64, generator=gen)
    P = M.T @ M / n + 0.1 * torch.eye(n, dtype=F64)
    q = torch.randn(B, n, dtype=F64, generator=gen)
    Ae = torch.randn(2, n, dtype=F64, generator=gen)
    be = 0.1 * torch.randn(B, 2, dtype=F64, generator=gen)
    Ab, bb = box_rows(n, -1.0, 1.0)
    Ac, bc = ball_rows(n, 1.5)
    As = torch.randn(10, n, dtype=F64, generator=gen)
    bs = torch.zeros(B, 10, dtype=F64)
    bs[:, 0] = bs[:, 5] = 3.0
    A = torch.cat([Ae, Ab, Ac, As])
    b = torch.cat([be, bb.expand(B, -1), bc.expand(B, -1), bs], 1)
    cones = [dc.ZeroCone(2), dc.NonnegCone(2 * n), dc.SecondOrderCone(n + 1),
             dc.SecondOrderCone(5), dc.SecondOrderCone(5)]  # fmt: skip
    return P, q, A, b, cones


@pytest.mark.parametrize("batched_A", [False, True])
def test_random_socps_match_clarabel(batched_A):
    P, q, A, b, cones = _random_socp(6, 8, seed=4)
    if batched_A:
        gen = torch.Generator().manual_seed(5)
        A = A + 0.01 * torch.randn(6, *A.shape, dtype=F64, generator=gen)
    mine = dc.solve(P, q, A, b, cones=cones, solver="torch")
    ref = dc.solve(P, q, A, b, cones=cones, solver="clarabel")
    assert mine.info.solvers == ("torch",) * 6 and ref.info.solvers == ("clarabel",) * 6
    assert all(st is Status.SOLVED for st in mine.status)
    torch.testing.assert_close(mine.x, ref.x, rtol=0, atol=1e-7)
    torch.testing.assert_close(mine.y, ref.y, rtol=0, atol=1e-7)
    # the raw interior point claims its own tolerance; its point is near, the polish finishes it
    prob = conic_problem(P, q, A, b, cones, check_psd=True)
    raw = run_torch(prob, list(range(6)), 1e-8, 200)
    assert raw.claims == ["solved"] * 6
    assert float((torch.from_numpy(raw.x) - ref.x).abs().max()) < 1e-4  # before the polish


def test_gradients_are_those_of_the_clarabel_forward():
    P, q, A, b, cones = _random_socp(3, 5, seed=6)
    grads = []
    for solver in ("torch", "clarabel"):
        qq, bb = q.clone().requires_grad_(), b.clone().requires_grad_()
        sol = dc.solve(P, qq, A, bb, cones=cones, solver=solver)
        (sol.x * torch.arange(1.0, 6.0, dtype=F64)).sum().backward()
        grads.append((qq.grad, bb.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=1e-7)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=1e-7)


def test_an_infeasible_sample_in_the_batch_gets_its_certified_status():
    # sample 1 asks for x <= -1 and x >= 1 (box rows with b shifted): primal infeasible
    n = 3
    Ab, bb = box_rows(n, -1.0, 1.0)
    Ac, bc = ball_rows(n, 2.0)
    A = torch.cat([Ab, Ac])
    b = torch.cat([bb, bc]).repeat(3, 1)
    b[1, 0] = -2.0  # x_0 <= -2 and x_0 >= -1
    q = torch.tensor([[2.0, -0.3, 0.5]], dtype=F64).repeat(3, 1)
    cones = [dc.NonnegCone(2 * n), dc.SecondOrderCone(n + 1)]
    sol = dc.solve(torch.eye(n, dtype=F64), q, A, b, cones=cones, solver="torch",
                   on_failure="ignore")  # fmt: skip
    assert sol.status == (Status.SOLVED, Status.INFEASIBLE, Status.SOLVED)
    assert sol.info.solvers[0] == sol.info.solvers[2] == "torch"
    assert sol.info.solvers[1] in ("torch", "clarabel")  # its certificate checked either way
    ref = dc.solve(torch.eye(n, dtype=F64), q[0], A, b[0], cones=cones)
    torch.testing.assert_close(sol.x[0], ref.x, rtol=0, atol=1e-9)
    assert bool(torch.isnan(sol.x[1]).all())


def test_unbounded_sample_goes_on_to_clarabel():
    # min -x_0 s.t. x >= 0 (no upper bound): unbounded; the interior point cannot tell
    n = 2
    A = -torch.eye(n, dtype=F64)
    b = torch.zeros(2, n, dtype=F64)
    q = torch.tensor([[1.0, 1.0], [-1.0, 1.0]], dtype=F64)
    sol = dc.solve(None, q, A, b, cones=[dc.NonnegCone(n)], solver="torch", on_failure="ignore")
    assert sol.status == (Status.SOLVED, Status.UNBOUNDED)
    assert sol.info.solvers == ("torch", "clarabel")
    assert sol.info.failures[1] and sol.info.failures[1][0].startswith("torch")


def test_float32_and_unbatched_inputs():
    n, r = 3, 1.0
    A, b = ball_rows(n, r)
    c = torch.tensor([2.0, -1.0, 2.0], dtype=F64)
    sol = dc.solve(torch.eye(n).float(), -c.float(), A.float(), b.float(),
                   cones=[dc.SecondOrderCone(n + 1)], solver="torch")  # fmt: skip
    assert sol.x.dtype == torch.float32 and sol.x.shape == (n,)
    torch.testing.assert_close(sol.x, (c / 3.0).float(), rtol=0, atol=1e-6)
    assert sol.info.solvers == ("torch",)


def test_unsupported_cones_start_with_clarabel():
    # an exponential cone row: the torch attempt is skipped, not tried
    A = torch.tensor([[0.0], [0.0], [-1.0]], dtype=F64)  # s = (1, 1, x): min x s.t. e <= x
    b = torch.tensor([1.0, 1.0, 0.0], dtype=F64)
    sol = dc.solve(None, torch.tensor([1.0], dtype=F64), A, b, cones=[dc.ExpCone()],
                   solver="torch")  # fmt: skip
    assert sol.info.solvers == ("clarabel",)
    torch.testing.assert_close(sol.x, torch.tensor([torch.e], dtype=F64), rtol=0, atol=1e-7)


def test_solver_option_is_checked():
    A, b = ball_rows(2, 1.0)
    with pytest.raises(ValueError, match="solver"):
        dc.solve(None, torch.zeros(2, dtype=F64), A, b, cones=[dc.SecondOrderCone(3)],
                 solver="cuda")  # fmt: skip


def test_cvxpy_least_squares_socp_reaches_its_own_tolerance():
    # the benchmark's socp (min |Fx - g|^2 s.t. ||x|| <= 0.67, |x| <= 1) as CVXPY
    # canonicalises it for Clarabel: epigraph columns without a diagonal in P; a shift
    # relative to the largest diagonal entry (old code) stalled the dual residual near 1e-4
    cp = pytest.importorskip("cvxpy")
    import numpy as np

    rng = np.random.default_rng(0)
    x = cp.Variable(20)
    F, g = rng.standard_normal((30, 20)), 3 * rng.standard_normal(30)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(F @ x - g)),
                         [cp.norm(x, 2) <= 0.5 * np.sqrt(20) * 0.3, cp.abs(x) <= 1])  # fmt: skip
    data, _, _ = problem.get_problem_data(cp.CLARABEL)
    dims = data["dims"]
    P = torch.tensor(data["P"].toarray(), dtype=F64)
    P = P + torch.triu(P, 1).T if bool((torch.tril(P, -1) == 0).all()) else P
    A = torch.tensor(data["A"].toarray(), dtype=F64)
    q, b = torch.tensor(data["c"], dtype=F64), torch.tensor(data["b"], dtype=F64)
    cones = [dc.ZeroCone(dims.zero), dc.NonnegCone(dims.nonneg)]
    cones += [dc.SecondOrderCone(d) for d in dims.soc]
    prob = conic_problem(P, q, A, b, cones, check_psd=True)
    raw = run_torch(prob, [0], 1e-8, 200)
    assert raw.claims == ["solved"]
    mine = dc.solve(P, q, A, b, cones=cones, solver="torch")
    assert mine.info.solvers == ("torch",)
