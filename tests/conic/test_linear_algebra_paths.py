"""The shortcuts of the conic engine's linear algebra against their plain versions: the
blockwise ``A'D``, the backward's reuse of the polish's LU (and its refusal of a bad one),
Hager's early stop, and the minimum-norm adjoint of a structurally singular Jacobian."""

from __future__ import annotations

import warnings

import torch
from tests.conic._problems import F64, ball_rows, box_rows

import dxopt.conic as dc
from dxopt.conic import backward as bw
from dxopt.conic.certify import PolishFactor
from dxopt.conic.forward import solve_forward
from dxopt.conic.kkt import condition_1, cone_jacobian, jacobian, lu_factor_finite
from dxopt.conic.problem import conic_problem
from dxopt.conic.types import ConicOptions

MIXED = [
    dc.ZeroCone(2),
    dc.NonnegCone(3),
    dc.SecondOrderCone(4),
    dc.SecondOrderCone(4),
    dc.ExpCone(),
    dc.ExpCone(),
    dc.PowerCone(0.3),
    dc.PSDCone(3),
]


def test_blockwise_jacobian_equals_the_dense_product() -> None:
    g = torch.Generator().manual_seed(0)
    m = sum(c.dim for c in MIXED)
    n, k = 5, 4
    q = torch.randn(k, n, generator=g, dtype=F64)
    A = torch.randn(k, m, n, generator=g, dtype=F64)
    b = torch.randn(k, m, generator=g, dtype=F64)
    prob = conic_problem(None, q, A, b, MIXED, check_psd=True)
    w = torch.randn(k, m, generator=g, dtype=F64)
    D = cone_jacobian(prob.cones, prob.slices, w)
    dense = jacobian(prob.P, prob.A, D)
    blocks = jacobian(prob.P, prob.A, D, cones=prob.cones, slices=prob.slices)
    torch.testing.assert_close(blocks, dense, atol=1e-14, rtol=0)
    # the block is A'D: check it against the definition entry by entry for one sample
    torch.testing.assert_close(blocks[1, :n, n:], A[1].T @ D[1], atol=1e-14, rtol=0)


def _hager_five_rounds(J: torch.Tensor) -> torch.Tensor:
    """The estimate with its five rounds always run (the reference of the early stop)."""
    LU, piv, _ = lu_factor_finite(J)
    k, N = J.shape[0], J.shape[-1]
    v = J.new_full((k, N), 1.0 / N)
    est = J.new_zeros(k)
    for _ in range(5):
        y = torch.linalg.lu_solve(LU, piv, v[..., None])[..., 0]
        est = torch.maximum(est, y.abs().sum(-1))
        xi = torch.where(y >= 0, 1.0, -1.0).to(J.dtype)
        z = torch.linalg.lu_solve(LU, piv, xi[..., None], adjoint=True)[..., 0]
        v = torch.nn.functional.one_hot(z.abs().argmax(-1), N).to(J.dtype)
    return torch.linalg.vector_norm(J, 1, dim=-2).amax(-1) * est


def test_condition_estimate_early_stop_is_the_five_round_estimate() -> None:
    g = torch.Generator().manual_seed(1)
    J = torch.randn(6, 12, 12, generator=g, dtype=F64)
    J[2] = J[2] @ torch.diag(torch.logspace(0, -8, 12, dtype=F64))  # ill-conditioned
    est = condition_1(J, lu_factor_finite(J)[:2])
    torch.testing.assert_close(est, _hager_five_rounds(J), rtol=0, atol=0)
    exact = torch.linalg.cond(J, p=1)
    assert bool((est <= exact * (1 + 1e-12)).all()) and bool((est >= exact / 10).all())


def _ball_box(batch: int) -> tuple[torch.Tensor, ...]:
    """``min 1/2 |x|^2 - c'x`` s.t. ``|x| <= 1``, ``-0.9 <= x <= 0.9`` (n = 3)."""
    g = torch.Generator().manual_seed(2)
    c = 1.5 * torch.randn(batch, 3, generator=g, dtype=F64)
    A1, b1 = ball_rows(3)
    A2, b2 = box_rows(3, -0.9, 0.9)
    return torch.eye(3, dtype=F64), -c, torch.cat([A2, A1]), torch.cat([b2, b1])


CONES = [dc.NonnegCone(6), dc.SecondOrderCone(4)]


def _state(batch: int = 5):
    P, q, A, b = _ball_box(batch)
    prob = conic_problem(P, q, A, b, CONES, check_psd=True)
    return solve_forward(prob, ConicOptions())


def _grads(state) -> tuple[torch.Tensor, ...]:
    B, n, m = state.prob.batch, state.prob.n, state.prob.m
    gx = torch.linspace(-1, 1, B * n, dtype=F64).reshape(B, n)
    zeros = torch.zeros(B, m, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        return bw.adjoint_gradients(state, gx, zeros, zeros)


def test_backward_reuses_the_polish_lu_and_matches_a_fresh_one() -> None:
    reused = _state()
    assert "polish_factor" in reused.cache
    g_reused = _grads(reused)
    assert bool(reused.cache["system"].reused.all())
    fresh = _state()
    del fresh.cache["polish_factor"]
    g_fresh = _grads(fresh)
    assert not bool(fresh.cache["system"].reused.any())
    for a, f in zip(g_reused, g_fresh):
        torch.testing.assert_close(a, f, atol=1e-13, rtol=1e-12)
    assert max(reused.info.backward.residual) <= 1e3 * torch.finfo(F64).eps


def test_a_wrong_polish_lu_is_refused_not_used() -> None:
    """An LU of another matrix with the same ``D`` passes the rho test (its estimate is of
    the wrong inverse) but cannot refine to round-off: the backward must refactor, and the
    gradient must be the fresh one, not a least-squares fallback."""
    bad = _state()
    f: PolishFactor = bad.cache["polish_factor"]
    N = f.LU.shape[-1]
    eye = torch.eye(N, dtype=F64).expand_as(f.LU)
    LU, piv, _ = lu_factor_finite(eye + 0.5 * torch.ones_like(f.LU) / N)
    bad.cache["polish_factor"] = PolishFactor(has=f.has, LU=LU, piv=piv, D=f.D)
    g_bad = _grads(bad)
    fresh = _state()
    del fresh.cache["polish_factor"]
    g_fresh = _grads(fresh)
    assert not any(bad.info.backward.singular)
    assert not bool(bad.cache["system"].reused.any())  # refactored
    for a, g in zip(g_bad, g_fresh):
        torch.testing.assert_close(a, g, atol=1e-13, rtol=1e-12)


def test_structurally_singular_jacobian_gets_the_minimum_norm_adjoint() -> None:
    """``t`` is free in ``[-1, 1]`` and absent from the objective: ``J`` has a zero row. The
    adjoint must be ``pinv(J') g`` (SVD cut at PINV_RTOL), the sample flagged singular, and
    ``dx/dc = 1`` for the unique part ``x = c``."""
    c = torch.tensor([0.3], dtype=F64, requires_grad=True)
    P = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    q = torch.cat([-c, torch.zeros(1, dtype=F64)])
    A = torch.tensor([[0.0, 1.0], [0.0, -1.0], [1.0, 0.0]], dtype=F64)
    b = torch.tensor([1.0, 1.0, 10.0], dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        sol = dc.solve(P, q, A, b, cones=[dc.NonnegCone(3)])
        (sol.x[0] + 0.5 * sol.x[1]).backward()
    assert sol.info.backward.singular == (True,)
    assert sol.info.backward.condition[0] == float("inf")
    torch.testing.assert_close(c.grad, torch.tensor([1.0], dtype=F64), atol=1e-9, rtol=0)
    prob = conic_problem(P, q.detach(), A, b, [dc.NonnegCone(3)], check_psd=True)
    state = solve_forward(prob, ConicOptions())
    gx = torch.tensor([[1.0, 0.5]], dtype=F64)
    zeros = torch.zeros(1, 3, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        _, gq, _, _ = bw.adjoint_gradients(state, gx, zeros, zeros)
    J = state.cache["system"].J[0]
    D = state.cache["system"].D[0]
    gw = D.T @ zeros[0] - zeros[0]
    u = torch.linalg.pinv(J.T, rtol=bw.PINV_RTOL) @ torch.cat([gx[0], gw])
    torch.testing.assert_close(gq[0], -u[:2], atol=1e-12, rtol=1e-10)


def _logistic_like(batch: int) -> tuple[torch.Tensor, ...]:
    """``min 1/2 |x|^2 + sum_i log(1 + exp(a_i'x))`` in exponential cones (n = 2, 4 terms):
    ``t_i >= log(e^0 + e^{a_i'x})`` as ``u + v <= 1``, ``(a_i'x - t_i, 1, u) in K_exp``,
    ``(-t_i, 1, v) in K_exp``; variables ``(x, t, u, v)``."""
    g = torch.Generator().manual_seed(3)
    n, k = 2, 4
    N = n + 3 * k
    qs, As, bs = [], [], []
    for _ in range(batch):
        a = torch.randn(k, n, generator=g, dtype=F64)
        q = torch.zeros(N, dtype=F64)
        q[n : n + k] = 1.0
        A = torch.zeros(k + 6 * k, N, dtype=F64)
        b = torch.zeros(k + 6 * k, dtype=F64)
        for i in range(k):
            A[i, n + k + i] = A[i, n + 2 * k + i] = 1.0  # u + v + s = 1
            b[i] = 1.0
            r = k + 6 * i  # s = b - Ax = (a'x - t, 1, u), then (-t, 1, v)
            A[r, :n], A[r, n + i] = -a[i], 1.0
            b[r + 1] = 1.0
            A[r + 2, n + k + i] = -1.0
            A[r + 3, n + i] = 1.0
            b[r + 4] = 1.0
            A[r + 5, n + 2 * k + i] = -1.0
        qs.append(q)
        As.append(A)
        bs.append(b)
    P = torch.zeros(N, N, dtype=F64)
    P[:n, :n] = torch.eye(n, dtype=F64)
    return P, torch.stack(qs), torch.stack(As), torch.stack(bs)


def test_chord_steps_polish_as_far_as_newton_with_fewer_lus(monkeypatch) -> None:
    import dxopt.conic.polish as cert

    P, q, A, b = _logistic_like(4)
    cones = [dc.NonnegCone(4)] + [dc.ExpCone() for _ in range(8)]
    prob = conic_problem(P, q, A, b, cones, check_psd=True)
    calls = {"n": 0}
    real = cert.lu_factor_finite

    def counting(J):
        calls["n"] += 1
        return real(J)

    monkeypatch.setattr(cert, "lu_factor_finite", counting)
    with_chord = solve_forward(prob, ConicOptions())
    lus_chord = calls["n"]
    monkeypatch.setattr(cert, "CHORD_STEPS", 0)
    calls["n"] = 0
    newton = solve_forward(prob, ConicOptions())
    lus_newton = calls["n"]
    assert all(st.ok for st in with_chord.status) and all(st.ok for st in newton.status)
    assert lus_chord < lus_newton
    eps = torch.finfo(F64).eps
    for name in ("primal_residual", "dual_residual"):
        chord_r = torch.tensor(getattr(with_chord.info, name))
        newton_r = torch.tensor(getattr(newton.info, name))
        assert bool((chord_r <= 4 * newton_r + 64 * eps).all()), (name, chord_r, newton_r)
    torch.testing.assert_close(with_chord.x, newton.x, atol=1e-12, rtol=1e-10)
