"""Issue 35 item 6: the sparse backward's attempts share one factorization per set of rows,
and the weak-row dependence test never densifies a big active set.

Before, every attempt (the penalty method's factors, the exact KKT solve that arbitrates it,
the dependence counts of the degenerate rule) rebuilt the rows and refactored the same reduced
KKT matrix (13 sparse LUs on Maros-Meszaros CVXQP3_L), and ``dependent_weak_rows`` made the
active rows dense before checking their size (a 9927 x 10002 array, 0.8 GB and 2 of the 2.4 s
of the backward on LISWET8).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

import dxopt.qp.backward.rows as rows_module
from dxopt.qp.certify.dependence import dependent_weak_rows
from dxopt.qp.problem.canonical import canonical_problem

F64 = torch.float64


def _coo(M: sp.spmatrix) -> torch.Tensor:
    M = sp.coo_matrix(M)
    idx = torch.from_numpy(np.vstack([M.row, M.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(M.data), M.shape).coalesce()


def _problem(n: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    G = sp.random(m, n, density=3.0 / n, random_state=seed, format="csr") + sp.eye(m, n)
    P = sp.eye(n, format="csr")
    return canonical_problem(
        _coo(P), torch.from_numpy(rng.standard_normal(n)), None, None, _coo(G),
        torch.ones(m, dtype=F64),
    )  # fmt: skip


def test_the_reduced_kkt_matrix_of_one_row_set_is_factored_once(monkeypatch) -> None:
    problem = _problem(60, 40)
    used = torch.zeros(1, 40, dtype=torch.bool)
    used[0, ::2] = True
    calls = []
    real = rows_module.kkt_factor

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rows_module, "kkt_factor", counted)
    first = rows_module.sparse_rows(problem, used, 0)
    again = rows_module.sparse_rows(problem, used, 0)
    assert again is first  # one split and one dependence count per row set
    f1 = rows_module.sparse_factor(first, 0, "test")
    f2 = rows_module.sparse_factor(again, 0, "test")
    assert f1 is f2 and len(calls) == 1
    rhs = np.random.default_rng(1).standard_normal(60 + int(used.sum()))
    np.testing.assert_array_equal(f1.solve(rhs), f2.solve(rhs))
    other = used.clone()
    other[0, 1] = True  # another row set: its own rows and factor
    assert rows_module.sparse_rows(problem, other, 0) is not first
    rows_module.sparse_factor(rows_module.sparse_rows(problem, other, 0), 0, "test")
    assert len(calls) == 2


def test_the_weak_row_test_does_not_densify_a_big_active_set(monkeypatch) -> None:
    n, m = 2100, 2000  # 2000 active rows x 2100 columns: above the dense test's 4e6 entries
    problem = _problem(n, m + 1)
    active = torch.zeros(1, m + 1, dtype=torch.bool)
    active[0, :m] = True
    weak = ~active
    sizes = []
    real = sp.csr_matrix.toarray

    def watched(self, *args, **kwargs):
        sizes.append(self.shape[0] * self.shape[1])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sp.csr_matrix, "toarray", watched)
    out = dependent_weak_rows(problem, active, weak)
    assert not bool(out.any())  # not tested: the weak policy stays
    assert max(sizes, default=0) <= 4e6


def test_a_singular_reduced_kkt_matrix_is_factored_once_and_no_penalty_matrix(
    monkeypatch,
) -> None:
    """``P = diag(1, 0)`` with ``x1`` free in [-1, 1]: the reduced KKT matrix is singular (``x``
    is not unique), the loss ``x0`` is constant on the face, and the pseudo-inverse adjoint
    gives the exact gradient (-1, 0). Before, the penalty backward factored the reduced KKT
    matrix, then a penalty matrix for a refinement that could not converge, and its exact
    fallback factored the same reduced KKT matrix again; now the one refusal is reused."""
    import warnings

    import dxopt.qp as dqp
    import dxopt.qp.backward.penalty_sparse as penalty_sparse

    penalty_solves, factors = [], []
    real_init = penalty_sparse.SparsePenaltySolve.__init__
    real_factor = rows_module.kkt_factor

    def init(self, *args, **kwargs):
        penalty_solves.append(1)
        real_init(self, *args, **kwargs)

    def factor(*args, **kwargs):
        factors.append(1)
        return real_factor(*args, **kwargs)

    monkeypatch.setattr(penalty_sparse.SparsePenaltySolve, "__init__", init)
    monkeypatch.setattr(rows_module, "kkt_factor", factor)
    P = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F64).to_sparse()
    G = torch.tensor([[0.0, 1.0], [0.0, -1.0], [1.0, 0.0]], dtype=F64).to_sparse()
    h = torch.tensor([1.0, 1.0, 5.0], dtype=F64)
    q = torch.tensor([-2.0, 0.0], dtype=F64, requires_grad=True)
    sol = dqp.solve(P, q, G=G, h=h)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        sol.x[0].backward()
    assert q.grad is not None
    torch.testing.assert_close(q.grad, torch.tensor([-1.0, 0.0], dtype=F64), rtol=0, atol=1e-12)
    assert sol.info.backward.pseudo_inverse == (True,)
    assert penalty_solves == [] and len(factors) == 1
