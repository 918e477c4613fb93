"""daqp's first pass over a whole batch in one loop (``DaqpBatch.solve_all``) against the
per-sample path it replaces (``max_workers=2`` keeps the per-sample path): the same points,
multipliers and statuses bit for bit, also when a sample's Cholesky fails (PSD but singular
``P``: solved again with daqp's proximal regularisation), when a sample is infeasible (no
point: every sample takes the per-sample path), and the same errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp._daqp import DaqpBatch

F64 = torch.float64


def _batch(rng: np.random.Generator, S: int, n: int, m: int, p: int) -> list[np.ndarray]:
    """Random dense batch, every matrix batched; ``x = 0`` is feasible."""
    M = rng.standard_normal((S, n, n))
    P = M @ M.transpose(0, 2, 1) + 0.1 * np.eye(n)
    q = rng.standard_normal((S, n))
    A = rng.standard_normal((S, p, n))
    b = np.zeros((S, p))
    G = rng.standard_normal((S, m, n))
    h = rng.random((S, m))
    return [P, q, A, b, G, h]


def _solve(arrays: list[np.ndarray], **kw) -> dqp.QPSolution:
    return dqp.solve(*(torch.from_numpy(a) for a in arrays), solver="daqp", on_failure="nan", **kw)


def _same(a: dqp.QPSolution, b: dqp.QPSolution) -> None:
    assert a.status == b.status
    assert a.info.sample_solvers == b.info.sample_solvers
    assert a.info.polished == b.info.polished
    for name in ("x", "eq_duals", "ineq_duals"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert torch.equal(torch.isnan(ta), torch.isnan(tb)), name
        assert torch.equal(torch.nan_to_num(ta), torch.nan_to_num(tb)), name


@pytest.mark.parametrize("case", ["regular", "singular_P", "infeasible", "both"])
def test_batch_pass_equals_the_per_sample_path(case: str) -> None:
    rng = np.random.default_rng(3)
    arrays = _batch(rng, 6, 8, 6, 2)
    if case in ("singular_P", "both"):  # PSD, rank 4: daqp's eps_prox=0 Cholesky fails (-5)
        M = rng.standard_normal((8, 4))
        arrays[0][2] = M @ M.T
        flag = DaqpBatch(*arrays).solve(2, {"primal_tol": 1e-9, "eps_prox": 0.0}).flag
        assert flag == -5  # the batch pass must hand this sample to the per-sample path
    if case in ("infeasible", "both"):  # x_0 <= -1 and -x_0 <= -1
        arrays[4][4, :2] = 0.0
        arrays[4][4, 0, 0], arrays[4][4, 1, 0] = 1.0, -1.0
        arrays[5][4, :2] = -1.0
    batch = _solve(arrays)
    per_sample = _solve(arrays, max_workers=2)
    _same(batch, per_sample)
    status = batch.status
    assert status[4] == (
        dqp.QPStatus.INFEASIBLE if case in ("infeasible", "both") else dqp.QPStatus.SOLVED
    )
    assert status[2] == dqp.QPStatus.SOLVED
    if case == "regular":
        assert all(s == dqp.QPStatus.SOLVED for s in status)


def test_solve_all_equals_solve_per_sample() -> None:
    """``solve_all`` writes each sample's ``solve`` output into its rows (NaN where the flag
    is not positive), with shared and batched arrays and a per-sample warm start."""
    rng = np.random.default_rng(5)
    P, q, A, b, G, h = _batch(rng, 4, 6, 5, 2)
    G[1, :2] = 0.0
    G[1, 0, 0], G[1, 1, 0] = 1.0, -1.0
    h[1, :2] = -1.0  # sample 1 infeasible
    for shared in (False, True):
        args = (P, q, A[0], b[0], G[0], h[0]) if shared else (P, q, A, b, G, h)
        batch = DaqpBatch(*args)
        start = rng.standard_normal((4, 6))
        X, LAM, flags = batch.solve_all(4, {"primal_tol": 1e-9}, start)
        for i in range(4):
            one = batch.solve(i, {"primal_tol": 1e-9}, start[i])
            assert flags[i] == one.flag
            if one.x is None:
                assert np.isnan(X[i]).all() and np.isnan(LAM[i]).all()
                continue
            np.testing.assert_array_equal(X[i], one.x)
            np.testing.assert_array_equal(LAM[i, :5], one.ineq_duals)
            np.testing.assert_array_equal(LAM[i, 5:], one.eq_duals)
        assert (flags[[0, 2, 3]] == 1).all()
        if not shared:
            assert flags[1] == -1


def test_batch_pass_reports_bad_options_and_indefinite_P() -> None:
    rng = np.random.default_rng(11)
    arrays = _batch(rng, 3, 6, 4, 1)
    with pytest.raises(ValueError, match=r"solver_options.*daqp"):
        _solve(arrays, solver_options={"no_such_setting": 1})
    arrays[0][1] = np.diag([1.0, 1.0, 1.0, 1.0, 1.0, -1.0])  # indefinite P in sample 1
    with pytest.raises(ValueError, match="P"):
        _solve(arrays)
