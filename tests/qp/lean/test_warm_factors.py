"""Warm starts that reuse the compiled solver's factors (issue 38, item 2): a warm sample whose
``P`` and rows ``C = [G; A]`` have the bits of the last warm start's takes that one's Cholesky
factor ``L`` and rows ``L^{-1}c_r`` instead of computing them (:mod:`dxopt.qp.lean.warm`,
*Reused factors* in :mod:`dxopt.qp.solvers.dual_active_set`). The answers are the cold ones to
the certificate's tolerance and the bits of a warm start that computes its factors; a ``P`` or
``G`` changed between calls (in place, by a little) is never given the old factors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
import dxopt.qp.lean.small_batch as small_batch
from dxopt.linalg.small import lapack_kernels
from dxopt.qp.lean.warm import clear_factors, dual_start, warm_rows
from dxopt.qp.solvers.dual_active_set import solve_one

F64 = torch.float64


@pytest.fixture(autouse=True)
def _no_kept_factors():
    clear_factors()
    yield
    clear_factors()


@pytest.fixture
def reused(monkeypatch):
    """Each compiled forward's ``reused`` flags (B,), as the kernel wrote them."""
    seen: list[np.ndarray] = []
    real = small_batch.forward_batch

    def spy(*args):
        out = real(*args)
        seen.append(args[-1].copy())
        return out

    monkeypatch.setattr(small_batch, "forward_batch", spy)
    return seen


def _mpc(horizon: int, dtype=F64):
    """A condensed MPC of a double integrator (``n = horizon`` inputs, ``|u| <= 1``,
    ``|position| <= 6``: ``m = 4 horizon`` rows) and its ``q, h`` from a state ``x0``."""
    dt = 0.1
    Ad = np.array([[1.0, dt], [0.0, 1.0]])
    Bd = np.array([0.5 * dt * dt, dt])
    Sx = np.zeros((2 * horizon, 2))
    Su = np.zeros((2 * horizon, horizon))
    for k in range(horizon):
        Sx[2 * k : 2 * k + 2] = np.linalg.matrix_power(Ad, k + 1)
        for j in range(k + 1):
            Su[2 * k : 2 * k + 2, j] = np.linalg.matrix_power(Ad, k - j) @ Bd
    Qbar = np.kron(np.eye(horizon), np.diag([1.0, 0.1]))
    P = Su.T @ Qbar @ Su + 0.05 * np.eye(horizon)
    pos = Su[0::2]
    G = np.vstack([np.eye(horizon), -np.eye(horizon), pos, -pos])

    def qh(x0):
        px = Sx[0::2] @ x0
        h = np.concatenate([np.ones(2 * horizon), 6.0 - px, 6.0 + px])
        return torch.tensor(Su.T @ Qbar @ Sx @ x0, dtype=dtype), torch.tensor(h, dtype=dtype)

    step = lambda x0, u: Ad @ x0 + Bd * u  # noqa: E731
    return torch.tensor(P, dtype=dtype), torch.tensor(G, dtype=dtype), qh, step


def _same_answer(warm: dqp.QPSolution, cold: dqp.QPSolution, tol: float = 1e-9) -> None:
    """Both solved and certified, the same point and multipliers to the tolerance."""
    assert warm.status == cold.status and all(s is dqp.QPStatus.SOLVED for s in cold.status)
    assert max(warm.info.primal_residual) <= tol and max(warm.info.dual_residual) <= tol
    scale = 1.0 + float(cold.x.detach().abs().max())
    torch.testing.assert_close(warm.x, cold.x, rtol=0, atol=tol * scale)
    assert warm.ineq_duals is not None and cold.ineq_duals is not None
    torch.testing.assert_close(warm.ineq_duals, cold.ineq_duals, rtol=0, atol=10 * tol * scale)


def test_an_mpc_loop_reuses_the_factors_and_keeps_the_cold_answers(reused):
    """A trajectory of an MPC with ``n = 66 > 64`` (the compiled solver, one problem as a batch
    of one): from the third step on, each warm solve reuses the factors (the second computes and
    keeps them), gives the cold answer and the very bits of a warm solve that factors again."""
    P, G, qh, step = _mpc(66)
    x0 = np.array([5.0, 0.0])
    prev = None
    for k in range(6):
        q, h = qh(x0)
        cold = dqp.solve(P, q, G=G, h=h)
        reused.clear()
        warm = dqp.solve(P, q, G=G, h=h, warm_start=prev)
        assert warm.info.route == "lean_batch"
        assert warm.info.sample_solvers == ("dual_active_set",)
        assert reused[-1].tolist() == [k >= 2], k
        _same_answer(warm, cold)
        if k:
            assert warm.info.warm_started == (True,)
            assert warm.info.iterations[0] < cold.info.iterations[0]
            kept = small_batch.cached_factors()
            clear_factors()  # the same warm start, its factors computed
            again = dqp.solve(P, q, G=G, h=h, warm_start=prev)
            assert reused[-1].tolist() == [False]
            assert torch.equal(again.x, warm.x) and torch.equal(again.ineq_duals, warm.ineq_duals)
            small_batch.keep_factors(*kept.arrays())
        prev = warm
        x0 = step(x0, float(warm.x[0]))


@pytest.mark.parametrize("change", ["P", "G", "A"])
def test_a_P_or_G_changed_in_place_is_not_given_the_old_factors(change, reused):
    """The same tensors, changed in place between two warm solves (by one part in 10^6, which
    a certificate at the default tolerance would still accept from stale factors): the second
    computes its own factors, and its answer is the cold one of the changed problem."""
    g = torch.Generator().manual_seed(3)
    n, m = 70, 140
    M = torch.randn(n, n, dtype=F64, generator=g)
    P = M @ M.T / n + torch.eye(n, dtype=F64)
    G = torch.randn(m, n, dtype=F64, generator=g)
    h = 0.3 * torch.rand(m, dtype=F64, generator=g)
    A = torch.randn(2, n, dtype=F64, generator=g)
    b = torch.zeros(2, dtype=F64)
    q = 2.0 * torch.randn(n, dtype=F64, generator=g)
    first = dqp.solve(P, q, A=A, b=b, G=G, h=h)
    second = dqp.solve(P, 1.01 * q, A=A, b=b, G=G, h=h, warm_start=first)  # keeps its factors
    third = dqp.solve(P, q, A=A, b=b, G=G, h=h, warm_start=second)
    assert [r.tolist() for r in reused] == [[False], [False], [True]]
    with torch.no_grad():
        if change == "P":
            P[3, 5] += 1e-6
            P[5, 3] += 1e-6
        elif change == "G":
            G[7] *= 1 + 1e-6
        else:
            A[1, 0] += 1e-6
    warm = dqp.solve(P, q, A=A, b=b, G=G, h=h, warm_start=third)
    assert reused[-1].tolist() == [False]
    assert warm.info.sample_solvers == ("dual_active_set",) and warm.info.warm_started == (True,)
    _same_answer(warm, dqp.solve(P, q, A=A, b=b, G=G, h=h))
    clear_factors()
    again = dqp.solve(P, q, A=A, b=b, G=G, h=h, warm_start=third)
    assert torch.equal(again.x, warm.x)


def test_a_stale_working_set_with_reused_factors_gives_the_cold_answer(reused):
    """The factors reused (the same ``P`` and ``G``) with the working set of another problem's
    solution (``-q``: other rows active), and of every row: the cold answer."""
    P, G, qh, _ = _mpc(66)
    q, h = qh(np.array([5.0, 0.0]))
    other = dqp.solve(P, -q, G=G, h=h)
    dqp.solve(P, -q, G=G, h=h, warm_start=other)  # keeps the factors
    cold = dqp.solve(P, q, G=G, h=h)
    warm = dqp.solve(P, q, G=G, h=h, warm_start=other)
    assert reused[-1].tolist() == [True]
    _same_answer(warm, cold)
    assert cold.ineq_duals is not None
    every = dqp.QPSolution(cold.x, None, torch.ones_like(cold.ineq_duals), cold.status, cold.info)
    warm = dqp.solve(P, q, G=G, h=h, warm_start=every)
    assert reused[-1].tolist() == [True]
    _same_answer(warm, cold)
    # no row of positive multiplier (an empty warm set: a cold start), the factors still reused
    none = dqp.QPSolution(cold.x, None, torch.zeros_like(cold.ineq_duals), cold.status, cold.info)
    warm = dqp.solve(P, q, G=G, h=h, warm_start=none)
    assert reused[-1].tolist() == [True] and warm.info.warm_started == (False,)
    _same_answer(warm, cold)


def test_a_batch_reuses_the_factors_of_the_samples_with_the_same_bits(reused):
    """A batch whose samples share ``G`` and where samples 0, 2 and 4 share ``P`` (1 and 3 have
    their own): only the samples with sample 0's bits reuse its kept factors; answers and
    gradients are the cold ones, and the bits of a warm solve that factors again."""
    g = torch.Generator().manual_seed(7)
    B, n, m = 5, 12, 30
    M = torch.randn(n, n, dtype=F64, generator=g)
    P0 = M @ M.T + 0.5 * torch.eye(n, dtype=F64)
    P = P0.repeat(B, 1, 1)
    P[1] += 0.1 * torch.eye(n, dtype=F64)
    P[3] += 0.2 * torch.eye(n, dtype=F64)
    G = torch.randn(m, n, dtype=F64, generator=g)
    h = 0.2 * torch.rand(m, dtype=F64, generator=g)
    q0 = 3.0 * torch.randn(B, n, dtype=F64, generator=g)
    first = dqp.solve(P, q0, G=G, h=h)
    dqp.solve(P, 1.01 * q0, G=G, h=h, warm_start=first)  # keeps sample 0's factors
    q = (0.99 * q0).requires_grad_()
    warm = dqp.solve(P, q, G=G, h=h, warm_start=first)
    assert reused[-1].tolist() == [True, False, True, False, True]
    assert warm.info.warm_started == (True,) * B
    cold = dqp.solve(P, q, G=G, h=h)
    _same_answer(warm, cold)
    weights = torch.linspace(-1.0, 2.0, n, dtype=F64)
    (g_warm,) = torch.autograd.grad((warm.x * weights).sum(), q)
    (g_cold,) = torch.autograd.grad((cold.x * weights).sum(), q)
    torch.testing.assert_close(g_warm, g_cold, rtol=0, atol=1e-8)
    kept = small_batch.cached_factors()
    clear_factors()
    again = dqp.solve(P, q, G=G, h=h, warm_start=first)
    (g_again,) = torch.autograd.grad((again.x * weights).sum(), q)
    assert torch.equal(again.x, warm.x) and torch.equal(g_again, g_warm)
    assert kept.P.shape == (n, n)


def test_float32_inputs(reused):
    """A float32 MPC (n = 66): the factors of the float64 copies are reused, and the answers
    are the cold ones."""
    P, G, qh, step = _mpc(66, torch.float32)
    x0 = np.array([4.0, 0.0])
    prev = None
    for k in range(4):
        q, h = qh(x0)
        cold = dqp.solve(P, q, G=G, h=h)
        warm = dqp.solve(P, q, G=G, h=h, warm_start=prev)
        assert warm.x.dtype is torch.float32
        assert reused[-1].tolist() == [k >= 2]
        torch.testing.assert_close(warm.x, cold.x, rtol=0, atol=1e-5)
        prev = warm
        x0 = step(x0, float(warm.x[0]))


def test_the_kernel_with_given_factors_matches_its_own_bits():
    """:func:`solve_one` with ``factored`` and the factors it computed itself: the same bits
    (point, multipliers, working set), cold and warm."""
    rng = np.random.default_rng(11)
    n, m = 20, 50
    M = rng.standard_normal((n, n))
    P = M @ M.T + np.eye(n)
    C = rng.standard_normal((m, n))
    upper = 0.3 * rng.random(m)
    q = 3.0 * rng.standard_normal(n)
    w = min(n, m) + 1

    def run(warm, factors=None):
        L = np.zeros((n, n)) if factors is None else factors[0].copy()
        Yt = np.zeros((m, n)) if factors is None else factors[1].copy()
        out = [np.zeros(n), np.zeros(m), L, Yt, np.zeros(w, np.int64), np.zeros((w, w))]
        status, _ = solve_one(P, q, C, upper, m, 1e-9, 1000, lapack_kernels(), *out, warm,
                              factors is not None)  # fmt: skip
        assert status == 0
        return out

    cold = run(np.zeros(0, np.int64))
    assert (cold[1] > 0).sum() >= 3
    for warm in (np.zeros(0, np.int64), np.append(np.flatnonzero(cold[1] > 0)[:-1], -1)):
        mine = run(warm)
        given = run(warm, (mine[2], mine[3]))
        for a, b in zip(mine, given):
            assert np.array_equal(a, b)


def test_warm_rows_reads_the_positive_multipliers():
    """The rows of positive multiplier per sample (shared or per sample), -1 after them; NaN
    or another shape: none; daqp's start: the clipped multipliers, zeros on the equalities."""
    lam = torch.tensor([[0.0, 2.0, -1.0, 3.0], [1.0, 0.0, 0.0, 0.0]], dtype=F64)
    got = warm_rows(lam, 2, 4)
    assert got is not None
    assert got[1].tolist() == [[1, 3, -1, -1, -1], [0, -1, -1, -1, -1]]
    shared = warm_rows(lam[0].float(), 3, 4)
    assert shared is not None and shared[1].tolist() == [[1, 3, -1, -1, -1]] * 3
    assert dual_start(got[0], 0, 2).tolist() == [0.0, 2.0, 0.0, 3.0, 0.0, 0.0]
    assert dual_start(shared[0], 2, 0).tolist() == [0.0, 2.0, 0.0, 3.0]
    bad = lam.clone()
    bad[1, 2] = float("nan")
    assert warm_rows(bad, 2, 4) is None
    assert warm_rows(lam, 3, 4) is None and warm_rows(lam, 2, 5) is None
    assert warm_rows(None, 2, 4) is None
