"""Warm working sets (issue 38, item 2): a previous :class:`dxopt.qp.QPSolution`'s multipliers
start the compiled dual active-set solver and daqp on the lean routes. The warm answer is the
cold one to the certificate's tolerance, a wrong working set still gives the cold answer, a
warm solve that fails is solved again cold, and on a slowly changing sequence the working-set
changes (``info.iterations``) drop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
import dxopt.qp.lean.small as small_module
from dxopt.linalg.small import lapack_kernels
from dxopt.qp.solvers.dual_active_set import solve_batch

F64 = torch.float64


def _problem(batch: int | None, n: int = 12, m: int = 30, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    L = torch.randn(*lead, n, n, dtype=F64, generator=g)
    P = L @ L.transpose(-1, -2) + 0.5 * torch.eye(n, dtype=F64)
    q = 3.0 * torch.randn(*lead, n, dtype=F64, generator=g)
    G = torch.randn(m, n, dtype=F64, generator=g)
    h = 0.2 * torch.rand(m, dtype=F64, generator=g)
    return P, q, G, h


def _assert_cold_answer(warm: dqp.QPSolution, cold: dqp.QPSolution) -> None:
    """Same status and point; both certified (the certificate's residuals within eps_abs)."""
    assert warm.status == cold.status and all(s is dqp.QPStatus.SOLVED for s in cold.status)
    assert max(warm.info.primal_residual) <= 1e-9 and max(warm.info.dual_residual) <= 1e-9
    scale = 1.0 + float(cold.x.abs().max())
    torch.testing.assert_close(warm.x, cold.x, rtol=0, atol=1e-9 * scale)
    assert warm.ineq_duals is not None and cold.ineq_duals is not None
    torch.testing.assert_close(warm.ineq_duals, cold.ineq_duals, rtol=0, atol=1e-8 * scale)


@pytest.mark.parametrize(
    ("batch", "n", "route", "solver"),
    [(6, 12, "lean_batch", "dual_active_set"), (None, 80, "lean_batch", "dual_active_set"),
     (None, 12, "lean_single", "daqp"), (6, 12, "lean_batch", "daqp")],
)  # fmt: skip
def test_a_slowly_changing_sequence_needs_fewer_changes(batch, n, route, solver):
    """A sequence of QPs whose ``q`` drifts slowly: each solve warm from the previous one is
    the cold answer, on the same route and solver, and needs fewer working-set changes."""
    P, q, G, h = _problem(batch, n=n, m=2 * n)
    prev = dqp.solve(P, q, G=G, h=h, solver="auto" if solver != "daqp" else "daqp")
    cold_total = warm_total = 0
    for k in range(1, 6):
        qk = q + 1e-3 * k * torch.cos(torch.arange(q.numel(), dtype=F64)).reshape(q.shape)
        kw = {"solver": "auto" if solver != "daqp" else "daqp"}
        cold = dqp.solve(P, qk, G=G, h=h, **kw)
        warm = dqp.solve(P, qk, G=G, h=h, warm_start=prev, **kw)
        assert warm.info.route == cold.info.route == route
        assert set(warm.info.sample_solvers) == set(cold.info.sample_solvers) == {solver}
        _assert_cold_answer(warm, cold)
        assert all(warm.info.warm_started) and not any(cold.info.warm_started)
        cold_total += sum(cold.info.iterations)
        warm_total += sum(warm.info.iterations)
        prev = warm
    assert cold_total >= 5 * (batch or 1) * 4  # the cold solves build their sets row by row
    assert warm_total <= cold_total / 4, (warm_total, cold_total)


def test_a_wrong_working_set_gives_the_cold_answer():
    """Every row in the warm set (most dependent, most wrong), NaN multipliers, another
    problem's solution and multipliers of another length: the cold answer each time."""
    P, q, G, h = _problem(6, seed=1)
    cold = dqp.solve(P, q, G=G, h=h)
    assert cold.ineq_duals is not None
    every = dqp.QPSolution(cold.x, None, torch.ones_like(cold.ineq_duals), cold.status, cold.info)
    warm = dqp.solve(P, q, G=G, h=h, warm_start=every)
    _assert_cold_answer(warm, cold)
    assert all(warm.info.warm_started)
    assert min(warm.info.iterations) > 0  # the wrong rows left the set
    nan = dqp.QPSolution(cold.x, None, torch.full_like(cold.ineq_duals, float("nan")),
                         cold.status, cold.info)  # fmt: skip
    _assert_cold_answer(dqp.solve(P, q, G=G, h=h, warm_start=nan), cold)
    far = dqp.solve(P, -q, G=G, h=h)  # another active set
    _assert_cold_answer(dqp.solve(P, q, G=G, h=h, warm_start=far), cold)
    short = dqp.QPSolution(cold.x, None, cold.ineq_duals[:, :5], cold.status, cold.info)
    _assert_cold_answer(dqp.solve(P, q, G=G, h=h, warm_start=short), cold)
    # one problem through daqp, every row in its dual_start
    one = dqp.QPSolution(cold.x[0], None, torch.ones_like(cold.ineq_duals[0]), cold.status[:1],
                         cold.info)  # fmt: skip
    cold_one = dqp.solve(P[0], q[0], G=G, h=h)
    _assert_cold_answer(dqp.solve(P[0], q[0], G=G, h=h, warm_start=one), cold_one)


def test_the_kernel_from_any_working_set_finds_the_cold_point():
    """The compiled solver itself, from random working sets (with duplicates and equality
    rows listed): the cold point and multipliers, status 0."""
    rng = np.random.default_rng(5)
    B, n, m, p = 8, 10, 25, 3
    M = rng.standard_normal((B, n, n))
    P = M @ M.transpose(0, 2, 1) + np.eye(n)
    q = 3.0 * rng.standard_normal((B, n))
    C = rng.standard_normal((B, m + p, n))
    x0 = rng.standard_normal((B, n))  # feasible: C x0 + slack on the inequalities, A x0
    upper = np.einsum("brn,bn->br", C, x0)
    upper[:, :m] += 0.2 * rng.random((B, m))

    def run(warm):
        w = min(n, m + p) + 1
        out = [np.zeros((B, n)), np.zeros((B, m + p)), np.zeros((B, n, n)),
               np.zeros((B, m + p, n)), np.zeros((B, w), np.int64),
               np.zeros((B, w, w))]  # fmt: skip
        status, iterations = solve_batch(P, q, C, upper, m, 1e-9, 1000, lapack_kernels(), *out,
                                         warm)  # fmt: skip
        assert (status == 0).all()
        return out[0], out[1], iterations

    X, duals, cold_iterations = run(np.zeros((B, 0), np.int64))
    for trial in range(3):
        warm = rng.integers(0, m + p, size=(B, m)).astype(np.int64)
        warm[:, rng.integers(1, m) :] = -1 if trial else warm[:, 0:1]
        Xw, dw, _ = run(warm)
        np.testing.assert_allclose(Xw, X, rtol=0, atol=1e-10 * (1 + np.abs(X).max()))
        np.testing.assert_allclose(dw, duals, rtol=0, atol=1e-8 * (1 + np.abs(duals).max()))
    exact = np.full((B, m + 1), -1, np.int64)  # the cold working sets: nothing left to change
    for i in range(B):
        rows = np.flatnonzero(duals[i, :m] > 0)
        exact[i, : rows.size] = rows
    Xe, _, exact_iterations = run(exact)
    np.testing.assert_allclose(Xe, X, rtol=0, atol=1e-10 * (1 + np.abs(X).max()))
    assert (exact_iterations == 0).all() and (cold_iterations > 0).all()


def test_a_failed_warm_daqp_solve_is_solved_again_cold(monkeypatch):
    """daqp failing from the warm working set alone: the lean route solves it again cold
    (the cold answer, ``warm_started`` False), not the general route."""
    real = small_module.daqp_module()

    class WarmFails:
        @staticmethod
        def solve(*args, **kwargs):
            if kwargs.get("dual_start") is not None:
                return None, None, -4, {"iterations": 7}
            return real.solve(*args, **kwargs)

    P, q, G, h = _problem(None, seed=3)
    cold = dqp.solve(P, q, G=G, h=h)
    monkeypatch.setattr(small_module, "daqp_module", lambda: WarmFails)
    warm = dqp.solve(P, q, G=G, h=h, warm_start=cold)
    assert warm.info.route == "lean_single" and warm.info.warm_started == (False,)
    assert warm.info.iterations[0] == 7 + cold.info.iterations[0]
    _assert_cold_answer(warm, cold)
