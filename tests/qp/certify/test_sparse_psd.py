"""Issue 28 item 4: a sparse ``P`` is checked for convexity as a dense one is.

Before, an indefinite sparse ``P`` got a symmetry and diagonal check only: ``[[1, 2], [2, 1]]``
with a box came back SOLVED at the saddle point (0, 0). The check is a Gershgorin pass, then
the inertia of a sparse LDLᵀ of ``P + delta I`` (Sylvester), judged here against dense
eigenvalues."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import dxopt.qp as dqp
from dxopt.qp.problem import canonical as _problem
from dxopt.qp.problem.canonical import NotPSDError, check_psd_sparse, ldl_inertia, psd_shift

F64 = torch.float64
EPS = float(np.finfo(np.float64).eps)


def _sparse(M: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(M).to_sparse()


def test_indefinite_sparse_p_with_a_box_is_refused() -> None:
    """The issue's case: the saddle point (0, 0) used to be reported SOLVED."""
    P = _sparse(np.array([[1.0, 2.0], [2.0, 1.0]]))
    q = torch.zeros(2, dtype=F64)
    one = torch.ones(2, dtype=F64)
    with pytest.raises(NotPSDError, match="P: expected a positive semidefinite matrix"):
        dqp.solve(P, q, lb=-one, ub=one)
    with pytest.raises(ValueError, match="1 eigenvalue"):  # NotPSDError is a ValueError
        dqp.solve(P, q, lb=-one, ub=one, solver="clarabel")
    # the dense path refuses the same matrix
    with pytest.raises(NotPSDError):
        dqp.solve(P.to_dense(), q, lb=-one, ub=one)


def test_semidefinite_and_zero_sparse_p_are_accepted_and_solved() -> None:
    """Singular PSD P (rank 1, not diagonally dominant) and P = 0 (an LP) pass; the solution
    is the dense path's."""
    rng = np.random.default_rng(0)
    v = rng.standard_normal(4)
    P = np.outer(v, v)  # rank 1: Gershgorin fails, the shifted LDL^T decides
    q = rng.standard_normal(4)
    box = torch.ones(4, dtype=F64)
    sparse = dqp.solve(_sparse(P), torch.from_numpy(q), lb=-box, ub=box)
    dense = dqp.solve(torch.from_numpy(P), torch.from_numpy(q), lb=-box, ub=box)
    assert sparse.status == dense.status == (dqp.QPStatus.SOLVED,)
    obj = lambda x: 0.5 * x @ P @ x + q @ x  # noqa: E731
    assert abs(obj(sparse.x.numpy()) - obj(dense.x.numpy())) <= 1e-8
    lp = dqp.solve(_sparse(np.zeros((4, 4))), torch.from_numpy(q), lb=-box, ub=box)
    torch.testing.assert_close(lp.x, -torch.sign(torch.from_numpy(q)))


@pytest.mark.parametrize("seed", range(12))
def test_sparse_verdict_is_the_dense_verdict(seed: int) -> None:
    """Random sparse symmetric P = B + c I with the smallest eigenvalue placed at -1e-3,
    -1e-6, 0 (semidefinite) or +1e-3 relative: refused exactly when the dense check refuses,
    and never inside the shift's band."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    B = sp.random(n, n, density=0.15, random_state=seed, format="csr")
    B = (B + B.T).toarray()
    lam = np.linalg.eigvalsh(B)
    target = [-1e-3, -1e-6, 0.0, 1e-3][seed % 4] * max(1.0, np.abs(B).max())
    P = B + (target - lam[0]) * np.eye(n)
    P[np.abs(P) < 1e-300] = 0.0
    dense_refused = sparse_refused = False
    try:
        _problem._check_psd_dense(torch.from_numpy(P), EPS)
    except NotPSDError:
        dense_refused = True
    try:
        check_psd_sparse(sp.csr_matrix(P), EPS)
    except NotPSDError:
        sparse_refused = True
    assert sparse_refused == dense_refused == (target < 0), (target, n)


@pytest.mark.parametrize("seed", range(8))
def test_ldl_inertia_counts_the_negative_eigenvalues(seed: int) -> None:
    """Sylvester's law: the pivots' signs of the symmetric LDL^T are the eigenvalues' signs
    (an LU with partial pivoting would not give this)."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(4, 40))
    B = sp.random(n, n, density=0.3, random_state=seed, format="csr")
    M = (B + B.T).toarray() + np.diag(rng.standard_normal(n))
    lam = np.linalg.eigvalsh(M)
    if np.abs(lam).min() < 1e-6:  # a near-zero eigenvalue: not a clean count
        pytest.skip("nearly singular draw")
    inertia = ldl_inertia(sp.csc_matrix(M))
    if inertia is None:  # SuperLU had to pivot: the helper says undecided, never a guess
        return
    assert inertia == (int((lam < 0).sum()), 0)


def test_undecided_inertia_falls_back_to_eigenvalues(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the LDL^T needs pivoting (here forced), the dense eigenvalues decide."""
    monkeypatch.setattr(_problem, "ldl_inertia", lambda P: None)
    bad = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # eigenvalue -1
    with pytest.raises(NotPSDError, match="smallest eigenvalue -1"):
        check_psd_sparse(sp.csr_matrix(bad), EPS)
    good = np.array([[2.0, 1.5, 0.0], [1.5, 2.0, 0.0], [0.0, 0.0, 1.0]])  # not dominant, PD
    check_psd_sparse(sp.csr_matrix(good), EPS)


def test_badly_scaled_semidefinite_p_is_accepted() -> None:
    """Entries of 1e8 and a zero eigenvalue: the shift scales with max |P|."""
    v = np.array([1e4, -1e4, 3.0])
    P = np.outer(v, v) + np.diag([0.0, 0.0, 0.0])
    assert psd_shift(3, EPS, float(np.abs(P).max())) >= 1e-10 * 1e8
    check_psd_sparse(sp.csr_matrix(P), EPS)
    with pytest.raises(NotPSDError):
        check_psd_sparse(sp.csr_matrix(P - 1e-1 * np.eye(3)), EPS)
