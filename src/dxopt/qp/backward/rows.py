"""Row accessors of the adjoint systems: the active rows :math:`C = [G_J; A]` of a batch.

The dense form (:class:`DenseRows`, :func:`dense_rows`) stacks every sample's used
inequality rows and the equality rows into one padded batch; the sparse form
(:class:`SparseRows`, :func:`sparse_rows`) builds one sample's CSR rows, their unit-row split
and dependent-row count, and :func:`sparse_factor` the exact factor of its reduced KKT matrix.
They are read by every backward method (:mod:`dxopt.qp.backward.kkt`,
:mod:`dxopt.qp.backward.penalty`, :mod:`dxopt.qp.backward.penalty_sparse`,
:mod:`dxopt.qp.backward.dense_large`) and by the degenerate rules (:mod:`dxopt.qp.backward.base`,
:mod:`dxopt.qp.backward.degenerate_rule`).

May import: ``dxopt.linalg``, ``_problem``, ``_adjoint``, ``_degenerate``, ``_types``; never
a backward method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from dxopt.linalg.sparse import (
    FactorizationError,
    KKTFactor,
    UnitRows,
    kkt_factor,
    take_rows,
    unit_rows,
)
from dxopt.qp.certify.dependence import count_dependent_sparse
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import AdjointInput
from dxopt.qp.problem.types import QPBackwardError

__all__ = [
    "DenseRows",
    "SparseRows",
    "active_rows_sparse",
    "compress_rows",
    "dense_rows",
    "dependent_rows_sparse",
    "gather_rows",
    "row_norms",
    "scipy_matrix",
    "sparse_factor",
    "sparse_rows",
]


def compress_rows(used: Tensor) -> tuple[Tensor, Tensor]:
    """Row indices ``(S, k)`` with each sample's used rows first (``k`` = the largest count)
    and their validity mask, so dense backward work scales with the active rows, not ``m``."""
    k = int(used.sum(-1).max()) if used.numel() else 0
    order = torch.argsort((~used).to(torch.int8), dim=-1, stable=True)[:, :k]
    return order, used.gather(1, order)


def gather_rows(M: Tensor, index: Tensor) -> Tensor:
    """Rows ``index`` (S, k) of a dense ``(m, n)`` or ``(S, m, n)`` matrix, as ``(S, k, n)``."""
    if M.ndim == 2:
        return M[index]
    return M.gather(1, index.unsqueeze(-1).expand(-1, -1, M.shape[-1]))


def row_norms(M: Tensor) -> Tensor:
    """Euclidean row norms, (k,) or (S, k), clamped away from zero."""
    if M.layout == torch.sparse_coo:
        sq = torch.zeros(M.shape[0], dtype=M.dtype)
        sq.index_add_(0, M.indices()[0], M.values() ** 2)
        out = sq.sqrt()
    else:
        out = torch.linalg.vector_norm(M, dim=-1)
    return out.clamp_min(torch.finfo(M.dtype).tiny)


def scipy_matrix(problem: QPProblem, name: str, i: int) -> sp.csr_matrix:
    """Parameter ``name`` of sample ``i`` as a scipy CSR matrix."""
    t = getattr(problem, name)
    if t.layout == torch.sparse_coo:
        return problem.csr[name][0]
    return sp.csr_matrix((t[i] if t.ndim == 3 else t).numpy())


@dataclass(frozen=True)
class DenseRows:
    """The dense adjoint system of a batch: ``C`` (S, k + p, n) stacks each sample's used
    inequality rows (``index``/``mask`` from :func:`compress_rows`, padding
    rows zero) and the equality rows; ``P`` is (n, n) when shared by the batch and every
    sample is solved, else (S, n, n) with the identity on failed samples; ``rhs2`` (S, k + p)
    the matching multiplier cotangents."""

    index: Tensor
    mask: Tensor
    C: Tensor
    P: Tensor
    rhs2: Tensor

    @property
    def k(self) -> int:
        return self.index.shape[1]

    def scatter(self, w: Tensor, m: int) -> Tensor:
        """The inequality part of ``w`` (S, k + p) back on the ``m`` rows (zero off them)."""
        out = np.zeros((w.shape[0], m))
        if self.k:
            out[np.arange(out.shape[0])[:, None], self.index.numpy()] = w.numpy()[:, : self.k]
        return torch.from_numpy(out)


def dense_rows(data: AdjointInput, used: Tensor, *, samples: np.ndarray | None = None) -> DenseRows:
    """Assemble :class:`DenseRows` for the batch, or for the batch indices ``samples`` only
    (failed samples get zero rows and the identity ``P``); numpy on the float64 data, rows
    gathered by flat row indices and ``np.take`` (numpy's indexing with two index arrays
    measured about 4x slower)."""
    problem = data.problem
    n, m, p = problem.n, problem.m, problem.p
    ok, used_np = data.ok.numpy(), used.numpy()
    grad_ineq, grad_eq = data.grad_ineq.numpy(), data.grad_eq.numpy()
    if samples is not None:
        ok, used_np = ok[samples], used_np[samples]
        grad_ineq, grad_eq = grad_ineq[samples], grad_eq[samples]
    S = ok.shape[0]
    all_ok = bool(ok.all())
    k = int(used_np.sum(-1).max()) if used_np.size else 0
    index = np.argsort(~used_np, axis=-1, kind="stable")[:, :k]
    sample = np.arange(S)[:, None]
    mask = used_np[sample, index]
    if not all_ok:
        mask = mask & ok[:, None]
    k_rows = k if problem.G is not None else 0
    p_rows = p if problem.A is not None else 0
    C = np.empty((S, k_rows + p_rows, n))
    rhs2 = np.empty((S, k_rows + p_rows))
    if problem.G is not None:
        G = _dense_array(problem, "G")
        if G.ndim == 2:
            flat = index.ravel()
        else:
            source = np.arange(S) if samples is None else samples
            flat = (source[:, None] * m + index).ravel()
        C[:, :k] = G.reshape(-1, n)[flat].reshape(S, k, n)
        C[:, :k][~mask] = 0.0  # padding rows (and failed samples)
        rhs2[:, :k] = np.where(mask, grad_ineq[sample, index], 0.0)
    if problem.A is not None:
        A = _dense_array(problem, "A")
        if A.ndim == 3 and samples is not None:
            np.take(A, samples, axis=0, out=C[:, k_rows:])
        else:
            C[:, k_rows:] = A
        if not all_ok:
            C[~ok, k_rows:] = 0.0
        rhs2[:, k_rows:] = grad_eq
    P = _dense_array(problem, "P")
    if P.ndim == 3 and samples is not None:
        P = np.take(P, samples, axis=0)
    if P.ndim == 3 and not all_ok:
        P = np.where(ok[:, None, None], P, np.eye(n))
    return DenseRows(
        torch.from_numpy(index), torch.from_numpy(mask), torch.from_numpy(C),
        torch.from_numpy(P), torch.from_numpy(rhs2),
    )  # fmt: skip


def _dense_array(problem: QPProblem, name: str) -> np.ndarray:
    """Parameter ``name`` as a dense numpy array (a sparse one densified, for
    ``linear_solver="dense"``)."""
    if problem.is_sparse(name):
        return problem.csr[name][0].toarray()
    return problem.array(name)


def active_rows_sparse(problem: QPProblem, used: Tensor, i: int) -> sp.csr_matrix | None:
    """The stacked active rows :math:`C = [G_J; A]` of sample ``i`` (``None`` if empty)."""
    rows = np.flatnonzero(used[i].numpy()) if problem.m else np.zeros(0, dtype=np.int64)
    if not rows.size and not problem.p:
        return None
    A = scipy_matrix(problem, "A", i) if problem.p else None
    if not rows.size:
        return A
    return take_rows(scipy_matrix(problem, "G", i), rows, A)


@dataclass(frozen=True)
class SparseRows:
    """Sample ``i`` of a sparse adjoint system, built once per call: ``P`` (CSR), the used
    inequality rows ``rows`` (ascending), :math:`C = [G_J; A]` (``None`` if empty), its
    unit-row split (:func:`dxopt.linalg.sparse.unit_rows`) and the number of dependent rows
    of ``C`` read off that split (:func:`~dxopt.qp.certify.dependence.count_dependent_sparse`)."""

    P: sp.csr_matrix
    rows: np.ndarray
    C: sp.csr_matrix | None
    split: UnitRows | None
    dependent: int
    # the factor of its reduced KKT matrix (or the error that refused it), once computed by
    # :func:`sparse_factor`: every backward attempt on the same rows reuses it
    factor: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def rhs(self, data: AdjointInput, i: int) -> np.ndarray:
        """:math:`[\\bar x; \\bar\\nu_J; \\bar\\mu]` of sample ``i``."""
        return np.concatenate(
            [data.grad_x[i].numpy(), data.grad_ineq[i].numpy()[self.rows], data.grad_eq[i].numpy()]
        )


def sparse_rows(problem: QPProblem, used: Tensor, i: int) -> SparseRows:
    """:class:`SparseRows` of sample ``i``, built once per problem, sample and set of rows
    (kept with the problem, :meth:`~dxopt.qp.problem.canonical.QPProblem.derived`): the
    backward's attempts (the dependence count, the penalty method's factors, the exact KKT
    solve that arbitrates it, the degenerate rule) then share one unit-row split, one Gram
    factorization and one KKT factorization of the same rows."""
    rows = np.flatnonzero(used[i].numpy()) if problem.m else np.zeros(0, dtype=np.int64)

    def build() -> Any:
        C = active_rows_sparse(problem, used, i)
        split = None if C is None else unit_rows(C)
        dependent = 0 if C is None else count_dependent_sparse(C, split)
        return SparseRows(scipy_matrix(problem, "P", i), rows, C, split, dependent)

    key = f"sparse_rows:{i}:{hash(rows.tobytes())}:{rows.size}"
    return cast(SparseRows, problem.derived(key, "P", build))


def sparse_factor(sample: SparseRows, i: int, what: str) -> KKTFactor | spla.SuperLU:
    """Exact factor of the reduced KKT matrix of an independent sample (unit rows eliminated,
    :class:`~dxopt.linalg.sparse.KKTFactor`), or :class:`QPBackwardError` naming ``what``."""
    cached = sample.factor.get("lu")
    try:
        if cached is not None:
            if isinstance(cached, Exception):
                raise cached
            return cached
        if sample.C is None:  # no active rows: K = P (never SuperLU of a singular matrix)
            lu = kkt_factor(sample.P, sp.csr_matrix((0, sample.P.shape[0])))
        else:
            lu = kkt_factor(sample.P, sample.C, sample.split)
        sample.factor["lu"] = lu
        return lu
    except (FactorizationError, QPBackwardError) as err:
        sample.factor["lu"] = err
        raise QPBackwardError(
            f"{what}: sparse LU of the reduced KKT matrix failed at batch index {i} ({err}); P "
            "is singular on the null space of the active rows, so the solution is not "
            "differentiable."
        ) from err


def dependent_rows_sparse(data: AdjointInput, used: Tensor) -> Tensor:
    """Per-sample number of dependent active rows of a sparse problem (0 for failed ones)."""
    out = torch.zeros(data.x.shape[0], dtype=torch.int64)
    for i in range(data.x.shape[0]):
        if bool(data.ok[i]):
            out[i] = sparse_rows(data.problem, used, i).dependent
    return out
