"""The refinement of the reduced KKT adjoint stops once its residual is at the round-off of its
own evaluation (componentwise backward error, ``REFINE_ROUNDOFF``), in the compiled kernels
and in :func:`dxopt.qp.backward.regular.schur_refine`.

On the qp_speed benchmark's ill-conditioned problems (``P = Q diag(logspace(-6, 0)) Q' +
1e-8 I``, dense positive ``G``) one step reaches round-off, but the relative residual stays
near 1e-12 (:math:`|P||u| \\gg |\\bar x|`), above the stall test's floor: the refinement ran
to its 25-step limit on a fifth of the samples. References: the reduced KKT system on the
active set of an independent solve (daqp through qpsolvers), solved in float64 with its
residual accumulated in extended precision until the correction vanishes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from benchmarks.qp.reference import exact_solution
from benchmarks.qp_speed.illcond import ill_conditioned

import dxopt.qp as dqp
from dxopt.linalg.schur import schur_factor
from dxopt.qp.backward.regular import schur_refine
from dxopt.qp.backward.rows import DenseRows
from dxopt.qp.certify.tolerances import EVALUATION_ROUNDOFF, REFINE_ROUNDOFF
from dxopt.qp.solvers.kernels.adjoint import _at_roundoff

N, M, P_EQ = 50, 50, 25


def _problems(batch: int) -> list:  # type: ignore[type-arg]
    return [ill_conditioned(N, seed=seed, m=M, p=P_EQ) for seed in range(batch)]


def _accurate_solve(K: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``K^{-1} rhs`` by LU with refinement, the residual in extended precision (x87 long
    double where numpy has it): accurate to far below the float64 solves it judges."""
    import scipy.linalg as sl

    lu = sl.lu_factor(K)
    Kl, bl = K.astype(np.longdouble), rhs.astype(np.longdouble)
    z = sl.lu_solve(lu, rhs).astype(np.longdouble)
    for _ in range(8):
        r = bl - Kl @ z
        dz = sl.lu_solve(lu, r.astype(np.float64))
        z = z + dz
        if np.linalg.norm(dz) <= 1e-17 * np.linalg.norm(z.astype(np.float64)):
            break
    return z.astype(np.float64)


def _reference(pr, w: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """``(dq, dh, db)`` of ``w . x*`` from the reduced KKT system on the reference active set."""
    ex = exact_solution(pr)
    J = ex.active
    C = np.vstack([pr.G[J], pr.A])
    k = C.shape[0]
    K = np.block([[pr.P, C.T], [C, np.zeros((k, k))]])
    z = _accurate_solve(K, np.concatenate([w, np.zeros(k)]))
    dh = np.zeros(pr.m)
    dh[J] = z[N : N + J.size]
    return np.concatenate([-z[:N], dh, z[N + J.size :]])


@pytest.mark.parametrize("solver", ["auto", "daqp"])
def test_ill_conditioned_batch_refines_once_and_matches_the_exact_adjoint(solver: str) -> None:
    probs = _problems(8)
    stack = {k: torch.tensor(np.stack([getattr(p, k) for p in probs])) for k in "PqAbGh"}
    leaves = {k: v.clone().requires_grad_(k in "qhb") for k, v in stack.items()}
    w = np.random.default_rng(1).standard_normal((len(probs), N))
    sol = dqp.solve(**leaves, solver=solver)
    assert sol.info.route == "lean_batch"
    (torch.from_numpy(w) * sol.x).sum().backward()
    diag = sol.info.backward
    # one step reaches round-off (the old stall rule took the 25-step limit on samples 0, 1, 6)
    assert diag.refinement_steps <= 2, diag.refinement_steps
    assert diag.residual <= 1e-8  # the checked residual, unchanged
    for i, pr in enumerate(probs):
        got = np.concatenate([leaves[k].grad[i].numpy() for k in "qhb"])
        ref = _reference(pr, w[i])
        assert np.linalg.norm(got - ref) <= 1e-11 * np.linalg.norm(ref), i


def test_ill_conditioned_single_problem_refines_once() -> None:
    """The lean single path's kernel (its own factors): sample 0 took the 25-step limit."""
    (pr,) = _problems(1)
    leaves = {k: torch.tensor(getattr(pr, k)).requires_grad_(k in "qhb") for k in "PqAbGh"}
    w = np.ones(N)
    sol = dqp.solve(**leaves)
    assert sol.info.route == "lean_single"
    (torch.from_numpy(w) * sol.x).sum().backward()
    assert sol.info.backward.refinement_steps <= 2, sol.info.backward.refinement_steps
    assert sol.info.backward.residual <= 1e-8
    got = np.concatenate([leaves[k].grad.numpy() for k in "qhb"])
    ref = _reference(pr, w)
    assert np.linalg.norm(got - ref) <= 1e-11 * np.linalg.norm(ref)


def test_torch_schur_refine_stops_at_roundoff_with_the_exact_adjoint() -> None:
    """The general path's batched refinement (:func:`schur_refine`) on the same systems (a
    cotangent of ``x`` only, as in the benchmark; with multiplier cotangents the relative
    residual's larger scale let the old stall test stop)."""
    probs = _problems(16)
    B = len(probs)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((B, N))
    actives = [exact_solution(pr).active for pr in probs]
    k = max(J.size for J in actives)
    index = torch.zeros(B, k, dtype=torch.int64)
    mask = torch.zeros(B, k, dtype=torch.bool)
    C = torch.zeros(B, k + P_EQ, N, dtype=torch.float64)
    rhs2 = torch.zeros(B, k + P_EQ, dtype=torch.float64)
    for i, (pr, J) in enumerate(zip(probs, actives)):
        index[i, : J.size], mask[i, : J.size] = torch.from_numpy(J), True
        C[i, : J.size] = torch.from_numpy(pr.G[J])
        C[i, k:] = torch.from_numpy(pr.A)
    P = torch.tensor(np.stack([pr.P for pr in probs]))
    rows = DenseRows(index, mask, C, P, rhs2)
    factor = schur_factor(P, C)
    assert factor is not None
    ok = torch.ones(B, dtype=torch.bool)
    u, wv, residual, steps = schur_refine(rows, factor, torch.from_numpy(w), ok, 25, 1e-13)
    assert steps <= 2, steps  # the old rule: the 25-step limit
    assert float(residual.max()) <= 1e-8
    for i, (pr, J) in enumerate(zip(probs, actives)):
        kk = J.size + P_EQ
        Ci = np.vstack([pr.G[J], pr.A])
        K = np.block([[pr.P, Ci.T], [Ci, np.zeros((kk, kk))]])
        r2 = np.concatenate([rhs2[i, : J.size].numpy(), rhs2[i, k:].numpy()])
        ref = _accurate_solve(K, np.concatenate([w[i], r2]))
        got = np.concatenate([u[i].numpy(), wv[i, : J.size].numpy(), wv[i, k:].numpy()])
        assert np.linalg.norm(got - ref) <= 1e-11 * np.linalg.norm(ref), i


def _system(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n, k = 6, 2
    B = rng.standard_normal((n, n))
    P = B @ B.T + np.eye(n)
    C = rng.standard_normal((k, n))
    return P, C, rng.standard_normal(n), rng.standard_normal(k)


def test_roundoff_rule_is_the_componentwise_backward_error() -> None:
    """:math:`|r_i| \\le c(|b| + |K||z|)_i` for every component, at the bound and past it."""
    P, C, u, w = _system(0)
    r1, r2 = P @ u + C.T @ w, C @ u  # the right-hand side of an exact solution
    t1 = np.abs(r1) + np.abs(P) @ np.abs(u) + np.abs(C).T @ np.abs(w)
    t2 = np.abs(r2) + np.abs(C) @ np.abs(u)
    c = REFINE_ROUNDOFF * EVALUATION_ROUNDOFF
    rows = np.arange(C.shape[0])
    zero1, zero2 = np.zeros_like(r1), np.zeros_like(r2)
    assert _at_roundoff(P, C, C[:0], 2, rows, r1, r2, u, w, zero1, zero2)
    for comp in range(8):  # each component at 0.9 of its bound passes, at 1.1 fails
        res1, res2 = zero1.copy(), zero2.copy()
        if comp < 6:
            res1[comp] = 0.9 * c * t1[comp]
        else:
            res2[comp - 6] = -0.9 * c * t2[comp - 6]
        assert _at_roundoff(P, C, C[:0], 2, rows, r1, r2, u, w, res1, res2), comp
        res1, res2 = res1 / 0.9 * 1.1, res2 / 0.9 * 1.1
        assert not _at_roundoff(P, C, C[:0], 2, rows, r1, r2, u, w, res1, res2), comp


def test_roundoff_rule_a_vanishing_component_passes_only_with_a_zero_residual() -> None:
    """A component whose magnitudes all vanish (a zero row of ``C``, ``r_2 = 0``) is at
    round-off only with a zero residual: no division by its zero scale, no tiny-norm pass."""
    P, C, u, w = _system(1)
    C[1] = 0.0
    r1, r2 = P @ u + C.T @ w, C @ u
    rows = np.arange(2)
    zero1 = np.zeros_like(r1)
    assert _at_roundoff(P, C, C[:0], 2, rows, r1, r2, u, w, zero1, np.zeros(2))
    assert not _at_roundoff(P, C, C[:0], 2, rows, r1, r2, u, w, zero1, np.array([0.0, 1e-300]))
