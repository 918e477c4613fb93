"""The degenerate-gradient rule as a function of the polished active set alone.

With dependent active rows :math:`C = [G_J; A]` the multipliers are not unique: the optimal
ones form the polyhedron :math:`\\Lambda = \\{\\lambda: C^\\top\\lambda = -(Px + q),\\
\\lambda_J \\ge 0\\}`, and which point of it a backend returns depends on the backend (daqp: a
vertex; an interior-point method: a point near the analytic centre). Every choice the backward
makes is therefore a function of the point :math:`x` and the rows :math:`J` only
(:class:`DegenerateRule`, built by :meth:`dxopt.qp.BackwardBase.degenerate_rule`):

- **the rows**: ``degenerate="auto"``/``"vertex"`` reduce :math:`J` to the support of the
  vertex of :math:`\\Lambda` that minimises a fixed linear cost
  (:func:`dxopt.qp.backward.vertex.vertex_rows`), completed in row order to a basis of the row
  space; ``"min_norm"`` keeps :math:`J`;
- **the multipliers** in the gradient formulas :math:`\\bar G_J = -(\\nu_J u^\\top +
  w_J x^\\top)`, :math:`\\bar A = -(\\mu u^\\top + w_E x^\\top)` and in the tangent system: the
  minimum-norm solution of :math:`C_B^\\top\\lambda = -(Px + q)` on the final rows :math:`B`
  (:func:`rule_multipliers`): at a vertex the vertex's own multipliers, on duplicated rows the
  equal split (the backend's, e.g. daqp's all-on-one-copy, would make the ``G``/``A``
  gradients backend-dependent);
- **the right-hand side**: where the final rows are still dependent (the minimum-norm samples),
  the multiplier part of the adjoint/tangent right-hand side is projected onto
  :math:`\\operatorname{range} C_B` (:func:`project_multiplier_rhs`), so the solve returns
  :math:`K^+ r` (:math:`K^+` symmetric): the jvp is exactly the transpose of the vjp.

When no gradient of ``A, b, G, h`` is wanted and the multiplier outputs have zero cotangents,
the choice of rows does not matter (every reduction above keeps the row space, so the primal
adjoint :math:`u` is the same); the dependent rows are then simply dropped in row order
(:func:`independent_rows_dense`, one batched Cholesky), which is what makes the degenerate
backward of decision-focused QPs (QPTL) cost about one regular backward.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from dxopt.qp.backward.rows import active_rows_sparse
from dxopt.qp.certify.tolerances import RULE_GRAM_SHIFT, RULE_LSMR_TOL, RULE_RANK_CUT
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput
from dxopt.qp.problem.types import QPDegenerateWarning

__all__ = [
    "DegenerateRule",
    "dependent_flags_dense",
    "dependent_flags_factor",
    "dependent_weak_rows_dense",
    "independent_rows_dense",
    "project_multiplier_rhs",
    "returned_vertex",
    "rule_multipliers",
    "stacked_rows",
    "warn_degenerate",
    "weak_rows_with_factor",
]

_TOL = (
    1e-10  # = dxopt.qp.certify.dependence.DEPENDENT_TOL (squared distance of a unit row to a span)
)
_GRAM_PIVOT = (
    1e-8  # _min_norm_lstsq: squared Cholesky pivot of the unit Gram matrix for the fast path
)


@dataclass(frozen=True)
class DegenerateRule:
    """The rows and multipliers the backward uses (module docstring).

    Attributes:
        active: the active set with ``used`` the final rows :math:`B`.
        full: the rows before the vertex reduction (``(S, m)``).
        counts: per sample, the number of dependent rows of ``full`` (0: LICQ holds).
        dropped: per sample, the inequality rows the vertex reduction dropped.
        left: per sample, the dependent rows left in :math:`B` (minimum-norm samples).
        ineq_duals, eq_duals: the multipliers of the rule (the backend's where ``counts`` is 0,
            and everywhere when no gradient of ``A`` or ``G`` is wanted: ``needs_matrices``).
        q_only: only dL/dq, dL/dP wanted: the rows are any basis of the row space.
    """

    active: ActiveSet
    full: Tensor
    counts: Tensor
    dropped: Tensor
    left: Tensor
    ineq_duals: Tensor
    eq_duals: Tensor
    q_only: bool = False


def _unit_gram_factor(C: Tensor, *, keep_gram: bool = False) -> Any:
    """``(Cn, L, nonzero, info)``: the rows of ``C`` (S, k, n) normalised and the Cholesky
    factor of their Gram matrix shifted by 1e-14 (zero rows: a unit pivot); ``keep_gram``:
    the shifted Gram matrix as a fifth element."""
    norms = torch.linalg.vector_norm(C, dim=-1)
    nonzero = norms > 0
    Cn = C / norms.clamp_min(torch.finfo(C.dtype).tiny)[..., None]
    gram = torch.bmm(Cn, Cn.mT)
    gram.diagonal(dim1=-2, dim2=-1).add_((~nonzero).to(C.dtype) + RULE_GRAM_SHIFT)
    L, info = torch.linalg.cholesky_ex(gram)
    return (Cn, L, nonzero, info, gram) if keep_gram else (Cn, L, nonzero, info)


def _flags(Cn: Tensor, L: Tensor, nonzero: Tensor, info: Tensor) -> Tensor:
    flags = (L.diagonal(dim1=-2, dim2=-1).pow(2) < _TOL) & nonzero
    for i in torch.nonzero(info != 0).flatten().tolist():  # round-off: Gram-Schmidt
        flags[i] = _flags_qr(Cn[i].numpy(), nonzero[i].numpy())
    return flags


def dependent_flags_dense(C: Tensor) -> Tensor:
    """Per row of ``C`` (S, k, n), True where the row is (to ``DEPENDENT_TOL``) in the span of
    the rows before it: the squared Cholesky pivots of the row-normalised Gram matrix (zero
    rows, used as padding, are never flagged)."""
    S, k, _ = C.shape
    if k == 0:
        return torch.zeros(S, 0, dtype=torch.bool)
    return _flags(*_unit_gram_factor(C))


def dependent_flags_factor(C: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(flags, L, info, gram)``: :func:`dependent_flags_dense` of ``C`` (S, k, n) with the
    Gram matrix of its normalised rows (off the diagonal; the diagonal carries the shift) and
    its Cholesky factor ``L`` (S, k, k) that gave them, and LAPACK's ``info`` (S,) (nonzero:
    ``L`` is not usable for that sample and its flags came from Gram-Schmidt). Row ``i`` of
    ``L`` holds the coordinates of unit row ``i`` on the orthonormalised rows before it
    (Gram-Schmidt in row order); its unflagged columns are an orthonormal basis's."""
    S, k, _ = C.shape
    if k == 0:
        empty = torch.zeros(S, 0, dtype=torch.bool)
        zero = torch.zeros(S, 0, 0, dtype=C.dtype)
        return empty, zero, torch.zeros(S, dtype=torch.int32), zero
    Cn, L, nonzero, info, gram = _unit_gram_factor(C, keep_gram=True)
    return _flags(Cn, L, nonzero, info), L, info, gram


def _flags_qr(Cn: np.ndarray, nonzero: np.ndarray) -> Tensor:
    """:func:`dependent_flags_dense` of one sample by twice-orthogonalised Gram-Schmidt."""
    basis: list[np.ndarray] = []
    out = np.zeros(Cn.shape[0], dtype=bool)
    for j in range(Cn.shape[0]):
        if not nonzero[j]:
            continue
        v = Cn[j].copy()
        for _ in range(2):
            for b in basis:
                v -= (b @ v) * b
        d = float(v @ v)
        if d < _TOL:
            out[j] = True
        else:
            basis.append(v / np.sqrt(d))
    return torch.from_numpy(out)


def _stack(problem: QPProblem, used: Tensor, *, eq_first: bool) -> tuple[Tensor, Tensor]:
    """``([A; G_used] or [G_used; A] (S, p + k, n), index (S, k))`` of a dense problem, the
    used rows of ``G`` compressed in row order (padding rows zero)."""
    from dxopt.qp.backward.rows import compress_rows, gather_rows

    S, n = used.shape[0], problem.n
    parts = []
    index = torch.zeros(S, 0, dtype=torch.int64)
    if problem.G is not None and problem.m:
        index, valid = compress_rows(used)
        G = problem.G.to_dense() if problem.G.layout != torch.strided else problem.G
        rows = gather_rows(G.to(torch.float64), index) * valid[..., None]
        parts.append(rows)
    if problem.A is not None and problem.p:
        A = problem.A.to_dense() if problem.A.layout != torch.strided else problem.A
        A = A.to(torch.float64)
        parts.insert(0 if eq_first else len(parts), A.expand(S, -1, -1) if A.ndim == 2 else A)
    if not parts:
        return torch.zeros(S, 0, n, dtype=torch.float64), index
    return torch.cat(parts, 1), index


def stacked_rows(problem: QPProblem, used: Tensor) -> Tensor:
    """``[A; G_used]`` (S, p + k, n) of a dense problem, the used rows of ``G`` compressed in
    row order (padding rows zero): the rows :func:`dependent_flags_factor` factors for the
    vertex rule (:func:`dxopt.qp.backward.vertex_batch.vertex_rows_batched`)."""
    return _stack(problem, used, eq_first=True)[0]


def independent_rows_dense(
    problem: QPProblem, used: Tensor, ok: Tensor, weak: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(counts, rows, left, adopt)`` from one batched factorization of ``[A; G_used]``:
    the per-sample number of its dependent rows plus the ``weak`` rows in its span (``adopt``,
    as :func:`dependent_weak_rows_dense`), ``used`` without the inequality rows that depend on
    the equality rows and the used rows before them (row order; the same row space,
    ``used`` itself where nothing is dropped), and the dependent rows ``left`` among the
    equality rows (0 for samples not ``ok``)."""
    C, index = _stack(problem, used, eq_first=True)
    S = used.shape[0]
    adopt = torch.zeros_like(used)
    if C.shape[1] == 0:
        zero = torch.zeros(S, dtype=torch.int64)
        return zero, used, zero, adopt
    factor = _unit_gram_factor(C)
    flags = _flags(*factor) & ok[:, None]
    p = problem.p if problem.A is not None else 0
    left = flags[:, :p].sum(-1)
    if weak is not None and bool(weak.any()):
        adopt = _in_span(problem, factor, weak) & ok[:, None]
    counts = flags.sum(-1) + adopt.sum(-1)
    ineq = flags[:, p:]
    if not bool(ineq.any()):
        return counts, used, left, adopt
    drop = torch.zeros_like(used)
    drop.scatter_(1, index, ineq)
    return counts, used & ~drop, left, adopt


def dependent_weak_rows_dense(problem: QPProblem, used: Tensor, weak: Tensor) -> Tensor:
    """The weak rows (``weak`` (S, m)) in the span of the used rows and the equality rows,
    batched (:func:`dxopt.qp.certify.dependence.dependent_weak_rows` for dense problems: squared
    distance of the normalised row to that span below ``DEPENDENT_TOL``)."""
    C, _ = _stack(problem, used, eq_first=True)
    if C.shape[1] == 0 or not bool(weak.any()):
        return torch.zeros_like(weak)
    return _in_span(problem, _unit_gram_factor(C), weak)


class RuleFactor(NamedTuple):
    """A Gram factor of the rows :math:`[\\hat A; \\hat G_{\\text{used}}]` for the vertex
    rule: the dependent-row ``flags`` (S, k), the Cholesky factor ``L`` (S, k, k) of the
    shifted unit Gram matrix, LAPACK's ``info`` (S,) and the ``gram`` matrix (S, k, k) (as
    :func:`dependent_flags_factor`), in the row order of :func:`stacked_rows` where ``order``
    is ``None``; else the ``G`` rows in another order (the equality rows first either way)
    and ``order`` (S, K): for each used row in row order, its position in the ``G`` block
    (padding rows in neither)."""

    flags: Tensor
    L: Tensor
    info: Tensor
    gram: Tensor
    order: Tensor | None = None


def _weak_gram(problem: QPProblem, used: Tensor, weak: Tensor) -> tuple[Tensor, ...] | None:
    """The pieces of :func:`weak_rows_with_factor`: ``(index, widx, wvalid, wn, nonzero, gram,
    L, info, cross, wgram)``: the used rows' and the weak rows' compressed indices (with the
    latter's validity and norms), the nonzero rows of :math:`C = [\\hat A; \\hat
    G_{\\text{used}}]`, its shifted unit Gram matrix and Cholesky factor (``info``), the
    products of its unit rows with the weak ones (``cross`` (S, k1, kw), zero on padding) and
    the weak rows' Gram matrix ``wgram`` (S, kw, kw). ``None`` where the factorization failed.
    Where ``A`` and ``G`` are shared by the batch the blocks are gathered (compiled) from one
    unit Gram matrix of all their rows (:func:`_weak_gram_shared`; torch's advanced indexing
    was slower than these batched products at QPTL's sizes, the compiled gather is not)."""
    from dxopt.qp.backward.rows import compress_rows, gather_rows

    assert problem.G is not None
    A = problem.A if problem.A is not None and problem.p else None
    if _shared_dense(problem.G) and (A is None or _shared_dense(A)):
        return _weak_gram_shared(A, problem.G, used, weak)
    G = problem.G.to_dense() if problem.G.layout != torch.strided else problem.G
    G = G.to(torch.float64)
    widx, wvalid = compress_rows(weak)
    C, index = _stack(problem, used, eq_first=True)
    cn = torch.linalg.vector_norm(C, dim=-1)
    nonzero = cn > 0
    Cn = C / cn.clamp_min(torch.finfo(C.dtype).tiny)[..., None]
    gram = torch.bmm(Cn, Cn.mT)
    W = gather_rows(G, widx)  # (S, kw, n): the weak rows only
    wn = torch.linalg.vector_norm(W, dim=-1)
    Wn = W / wn.clamp_min(1e-300)[..., None] * wvalid[..., None]  # padding slots: zero
    cross, wgram = torch.bmm(Cn, Wn.mT), torch.bmm(Wn, Wn.mT)
    gram.diagonal(dim1=-2, dim2=-1).add_((~nonzero).to(gram.dtype) + 1e-14)
    L, info = torch.linalg.cholesky_ex(gram)
    if bool((info != 0).any()):
        return None
    return index, widx, wvalid, wn, nonzero, gram, L, info, cross, wgram


def _shared_dense(M: Tensor) -> bool:
    return M.layout == torch.strided and M.ndim == 2


def _weak_gram_shared(
    A: Tensor | None, G: Tensor, used: Tensor, weak: Tensor
) -> tuple[Tensor, ...] | None:
    """:func:`_weak_gram` where ``A`` and ``G`` are shared by the batch (2-D, dense): the
    blocks gathered from one unit Gram matrix of ``[A; G]``
    (:mod:`dxopt.qp.backward.gram_blocks`)."""
    from dxopt.qp.backward.gram_blocks import gather_gram_blocks, shared_unit_gram
    from dxopt.qp.backward.rows import compress_rows

    full, norms = shared_unit_gram(A, G)
    p = 0 if A is None else A.shape[0]
    index, valid = compress_rows(used)
    widx, wvalid = compress_rows(weak)
    gram_np, cross_np, wgram_np, nonzero_np = gather_gram_blocks(
        full, norms, p, index.numpy(), valid.numpy(), widx.numpy(), wvalid.numpy()
    )
    gram = torch.from_numpy(gram_np)
    L, info = torch.linalg.cholesky_ex(gram)
    if bool((info != 0).any()):
        return None
    wn = torch.from_numpy(norms[p:])[widx]
    cross, wgram = torch.from_numpy(cross_np), torch.from_numpy(wgram_np)
    return index, widx, wvalid, wn, torch.from_numpy(nonzero_np), gram, L, info, cross, wgram


def weak_rows_with_factor(
    problem: QPProblem, used: Tensor, weak: Tensor
) -> tuple[Tensor, RuleFactor | None]:
    """``(adopt, factor)``: :func:`dependent_weak_rows_dense` and, from the same factorization,
    a factor of the rows ``used | adopt`` for the vertex rule (the ``factor`` argument of
    :func:`dxopt.qp.backward.vertex.vertex_rows`), ``None`` where the factorization failed
    (round-off; the rule then factors its rows itself).

    With :math:`L` the Cholesky factor of the unit Gram matrix of :math:`[\\hat A; \\hat
    G_{\\text{used}}]` and :math:`P = L^{-1}[\\hat A; \\hat G_{\\text{used}}]\\hat
    W^\\top` for the adopted rows :math:`\\hat W` (their coordinates on the orthonormalised
    rows; squared distance to the span :math:`d = 1 - \\|p\\|^2 \\le` ``DEPENDENT_TOL``),
    :math:`\\begin{bmatrix} L & 0 \\\\ P^\\top & D \\end{bmatrix}` with :math:`D =
    \\operatorname{diag}(\\sqrt{d + 10^{-14}})` is the factor of the rows with the adopted
    ones appended (their Schur complement, of entries at most ``DEPENDENT_TOL``, kept on the
    diagonal only: those rows are flagged dependent and the rule reads only the columns of
    the independent rows), with the Gram matrix of the unit rows in the same order and
    ``order`` mapping the row order of :func:`stacked_rows` of ``used | adopt`` to it
    (:class:`RuleFactor`; the flags are those of the appended order, the same count as in
    row order, and the columns of the independent rows span the same space)."""
    from dxopt.qp.backward.rows import compress_rows

    S = used.shape[0]
    if problem.G is None or not bool(weak.any()):
        return torch.zeros_like(weak), None
    pieces = _weak_gram(problem, used, weak)
    if pieces is None:  # the factorization failed (round-off): the adopted rows only
        C, _ = _stack(problem, used, eq_first=True)
        return _in_span(problem, _unit_gram_factor(C), weak), None
    index, widx, wvalid, wn, nonzero, gram, L, info, cross, wgram = pieces
    proj = torch.linalg.solve_triangular(L, cross, upper=False)
    dist = 1.0 - proj.pow(2).sum(1)  # (S, kw): squared distance of each unit row to the span
    taken = wvalid & (wn > 0) & (dist <= _TOL)
    adopt = torch.zeros_like(weak)
    adopt.scatter_(1, widx, taken)
    adopt &= weak
    if not bool(adopt.any()):
        return adopt, None
    # the factor with the adopted rows appended, [L 0; P^T D] (numpy: fancy indexing)
    s_ = np.arange(S)[:, None]
    if torch.equal(taken, wvalid):  # every weak row adopted (QPTL): no selection
        ai, av = np.broadcast_to(np.arange(widx.shape[1]), widx.shape), wvalid.numpy()
        proj_a = np.swapaxes(proj.numpy(), 1, 2) * av[..., None]  # (S, ka, k1)
        cross_a, d_a, wgram_a = cross.numpy(), dist.numpy(), wgram.numpy()
    else:
        aidx, avalid = compress_rows(taken)
        ai, av = aidx.numpy(), avalid.numpy()
        proj_a = np.swapaxes(proj.numpy(), 1, 2)[s_, ai] * av[..., None]
        cross_a = np.swapaxes(np.swapaxes(cross.numpy(), 1, 2)[s_, ai] * av[..., None], 1, 2)
        d_a = dist.numpy()[s_, ai]
        wgram_a = wgram.numpy()[s_[..., None], ai[:, :, None], ai[:, None, :]]
        wgram_a = wgram_a * (av[:, :, None] & av[:, None, :])
    d_a = np.sqrt(np.where(av, np.maximum(d_a, 0.0) + 1e-14, 1.0))
    k1, ka = L.shape[1], ai.shape[1]
    L2 = np.zeros((S, k1 + ka, k1 + ka))
    L2[:, :k1, :k1] = L.numpy()
    L2[:, k1:, :k1] = proj_a
    L2[:, k1 + np.arange(ka), k1 + np.arange(ka)] = d_a
    gram2 = np.empty_like(L2)
    gram2[:, :k1, :k1] = gram.numpy()
    gram2[:, :k1, k1:] = cross_a
    gram2[:, k1:, :k1] = np.swapaxes(cross_a, 1, 2)
    gram2[:, k1:, k1:] = wgram_a
    flags = ((L.diagonal(dim1=-2, dim2=-1).pow(2) < _TOL) & nonzero).numpy()
    flags2 = np.concatenate([flags, av], 1)
    # row order: the G rows of both blocks sorted by their row index (padding last)
    idx = index.numpy()
    big = used.shape[1]
    ids = np.concatenate(
        [np.where(used.numpy()[s_, idx], idx, big), np.where(av, widx.numpy()[s_, ai], big)], 1
    )
    k2 = int((used | adopt).sum(-1).max())
    order = torch.from_numpy(np.argsort(ids, axis=1, kind="stable")[:, :k2])
    return adopt, RuleFactor(
        torch.from_numpy(flags2), torch.from_numpy(L2), info, torch.from_numpy(gram2), order
    )


def _in_span(
    problem: QPProblem, factor: tuple[Tensor, Tensor, Tensor, Tensor], weak: Tensor
) -> Tensor:
    """The rows ``weak`` of ``G`` whose squared distance (normalised) to the span of the
    factored rows is below ``DEPENDENT_TOL``: :math:`1 - \\|L^{-1}\\hat C\\hat w\\|^2`."""
    from dxopt.qp.backward.rows import compress_rows, gather_rows

    Cn, L, _, info = factor
    if bool((info != 0).any()):  # pragma: no cover - the shift keeps the Gram matrix PD
        gram = torch.bmm(Cn, Cn.mT)
        gram.diagonal(dim1=-2, dim2=-1).add_(1e-12)
        L = torch.linalg.cholesky(gram)
    assert problem.G is not None
    G = problem.G.to_dense() if problem.G.layout != torch.strided else problem.G
    index, valid = compress_rows(weak)
    W = gather_rows(G.to(torch.float64), index)  # (S, kw, n): the weak rows only
    wn = torch.linalg.vector_norm(W, dim=-1)
    Wn = W / wn.clamp_min(1e-300)[..., None]
    proj = torch.linalg.solve_triangular(L, torch.bmm(Cn, Wn.mT), upper=False)
    dist = 1.0 - proj.pow(2).sum(1)  # (S, kw): squared distance of each unit row to the span
    out = torch.zeros_like(weak)
    out.scatter_(1, index, valid & (wn > 0) & (dist <= _TOL))
    return out & weak


def _sample_rows(problem: QPProblem, used: Tensor, i: int) -> tuple[Any, np.ndarray]:
    """``([G_used; A] of sample i (dense or scipy sparse), used row indices)``."""
    rows = torch.nonzero(used[i]).flatten().numpy() if problem.m else np.zeros(0, np.int64)
    C = active_rows_sparse(problem, used, i)
    if C is None:
        C = sp.csr_matrix((0, problem.n))
    return (C if problem.any_sparse else C.toarray()), rows


def rule_multipliers(
    problem: QPProblem, x: Tensor, used: Tensor, samples: Tensor,
    ineq_duals: Tensor, eq_duals: Tensor,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The multipliers of the rule: for the ``samples`` (S,) the minimum-norm solution of
    :math:`[G_B; A]^\\top\\lambda = -(Px + q)` (zero off ``used``); the given ones elsewhere."""
    nu, mu = ineq_duals.clone(), eq_duals.clone()
    chosen = torch.nonzero(samples).flatten()
    if chosen.numel() == 0:
        return nu, mu
    r = -(problem.mv("P", x) + problem.dense_vec("q").expand_as(x))
    m, p = problem.m if problem.G is not None else 0, problem.p if problem.A is not None else 0
    if not problem.any_sparse:
        C, index = _stack(problem, used, eq_first=False)
        Cc, rc = C[chosen], r[chosen]
        lam = _min_norm_lstsq(Cc.mT, rc)
        k = index.shape[1]
        if m:
            idx = index[chosen]
            nu_c = torch.zeros(idx.shape[0], nu.shape[1], dtype=nu.dtype)
            nu_c.scatter_(1, idx, lam[:, :k] * used[chosen].gather(1, idx))
            nu[chosen] = nu_c
        if p:
            mu[chosen] = lam[:, k:]
        return nu, mu
    for i in chosen.tolist():
        Ci, rows = _sample_rows(problem, used, i)
        lam = spla.lsmr(sp.csr_matrix(Ci).T, r[i].numpy(), atol=RULE_LSMR_TOL, btol=RULE_LSMR_TOL,
                        maxiter=10 * max(Ci.shape))[0]  # fmt: skip
        if m:
            nu[i] = 0.0
            nu[i, torch.from_numpy(rows)] = torch.from_numpy(lam[: rows.size])
        if p:
            mu[i] = torch.from_numpy(lam[rows.size :])
    return nu, mu


def returned_vertex(data: AdjointInput, used: Tensor, samples: Tensor) -> Tensor:
    """Per sample (S,), True where ``samples`` holds and the multipliers the forward returned
    are the vertex's of the rows ``used`` (:func:`rule_multipliers`, the forward's selection,
    :func:`dxopt.qp.backward.vertex_select.vertex_selection`) to round-off of the dual scale
    :math:`\\max(\\|Px + q\\|_\\infty, \\|\\lambda\\|_\\infty)`: their derivative is then
    the derivative of the returned numbers."""
    problem = data.problem
    nu, mu = rule_multipliers(problem, data.x, used, samples, data.ineq_duals, data.eq_duals)
    r = problem.mv("P", data.x) + problem.dense_vec("q").expand_as(data.x)
    scale = torch.cat([r.abs(), data.ineq_duals.abs(), data.eq_duals.abs()], -1).amax(-1)
    gap = torch.cat([(nu - data.ineq_duals).abs(), (mu - data.eq_duals).abs()], -1)
    gap = gap.amax(-1) if gap.shape[-1] else torch.zeros_like(scale)
    return samples & (gap <= 1e-9 * torch.clamp(scale, min=1e-300))


def _min_norm_lstsq(M: Tensor, r: Tensor) -> Tensor:
    """:func:`_min_norm_lstsq_svd`, with the samples whose columns are independent and well
    conditioned (the vertex rule's rows) solved by one batched Cholesky of the normalised Gram
    matrix and one refinement step: their solution is unique, so it is the minimum-norm one
    (squared pivots above ``_GRAM_PIVOT``: the normal equations lose at most 8 digits, and the
    refinement step recovers them)."""
    norms = torch.linalg.vector_norm(M, dim=-2)
    nonzero = norms > 0
    Mn = M / torch.where(nonzero, norms, torch.ones_like(norms))[:, None, :]
    gram = torch.bmm(Mn.mT, Mn)
    gram.diagonal(dim1=-2, dim2=-1).add_((~nonzero).to(M.dtype))  # zero (padding) columns
    L, info = torch.linalg.cholesky_ex(gram)
    pivots = L.diagonal(dim1=-2, dim2=-1).pow(2)
    fast = (info == 0) & ((pivots >= _GRAM_PIVOT) | ~nonzero).all(-1)
    y = torch.zeros(M.shape[0], M.shape[-1], dtype=M.dtype)
    if bool(fast.any()):
        Lf, Mf, rf = L[fast], Mn[fast], r[fast]
        yf = torch.cholesky_solve(torch.bmm(Mf.mT, rf.unsqueeze(-1)), Lf)
        res = rf.unsqueeze(-1) - torch.bmm(Mf, yf)
        yf = yf + torch.cholesky_solve(torch.bmm(Mf.mT, res), Lf)
        y[fast] = yf.squeeze(-1) / torch.where(nonzero[fast], norms[fast], 1.0)
    if not bool(fast.all()):
        y[~fast] = _min_norm_lstsq_svd(M[~fast], r[~fast])
    return y


def _min_norm_lstsq_svd(M: Tensor, r: Tensor) -> Tensor:
    """Minimum-norm solutions of ``M (s, a, b) y = r (s, a)`` for consistent systems whose
    columns (the rows of ``C``) may have very different norms: the rank is decided on the
    normalised columns (a relative cut on the unnormalised ones would drop every direction of
    a row 1e8 times shorter than another), a particular solution comes from them, and its part
    in :math:`\\ker M` (spanned by ``D^{-1}`` times the normalised null vectors) is removed."""
    norms = torch.linalg.vector_norm(M, dim=-2)
    norms = torch.where(norms > 0, norms, torch.ones_like(norms))
    Mn = M / norms[:, None, :]
    U, sigma, Vh = torch.linalg.svd(Mn, full_matrices=True)
    b = M.shape[-1]
    big = torch.zeros(M.shape[0], b, dtype=torch.bool)
    big[:, : sigma.shape[-1]] = sigma > RULE_RANK_CUT * sigma.amax(-1, keepdim=True).clamp_min(
        1e-300
    )
    inv = torch.zeros(M.shape[0], b, dtype=M.dtype)
    k = sigma.shape[-1]
    inv[:, :k] = torch.where(big[:, :k], 1.0 / sigma.clamp_min(1e-300), torch.zeros_like(sigma))
    coef = inv[:, :k] * torch.bmm(U.mT[:, :k], r.unsqueeze(-1)).squeeze(-1)
    y = torch.bmm(Vh.mT[:, :, :k], coef.unsqueeze(-1)).squeeze(-1) / norms
    V = Vh.mT  # (s, b, b): its columns off ``big`` span the null space of Mn
    N = torch.where(big[:, None, :], torch.zeros_like(V), V) / norms[:, :, None]
    if bool((~big).any()):
        c = torch.linalg.lstsq(N, y.unsqueeze(-1), driver="gelsd").solution
        y = y - torch.bmm(N, c).squeeze(-1)
    return y


def project_multiplier_rhs(
    problem: QPProblem, used: Tensor, grad_ineq: Tensor, grad_eq: Tensor, samples: Tensor
) -> tuple[Tensor, Tensor]:
    """``(grad_ineq, grad_eq)`` with, for the ``samples``, the part on the rows
    ``[G_used; A]`` projected onto :math:`\\operatorname{range}[G_used; A]` (the part in
    :math:`\\ker C^\\top` makes the adjoint system inconsistent; :math:`K^+` drops it)."""
    gi, ge = grad_ineq.clone(), grad_eq.clone()
    chosen = torch.nonzero(samples).flatten()
    if chosen.numel() == 0:
        return gi, ge
    m, p = problem.m if problem.G is not None else 0, problem.p if problem.A is not None else 0
    for i in chosen.tolist():
        C, rows = _sample_rows(problem, used, i)
        k = rows.size
        g = np.concatenate([gi[i, torch.from_numpy(rows)].numpy() if m else np.zeros(0),
                            ge[i].numpy() if p else np.zeros(0)])  # fmt: skip
        if sp.issparse(C):
            v = spla.lsmr(C, g, atol=RULE_LSMR_TOL, btol=RULE_LSMR_TOL, maxiter=10 * max(C.shape))[
                0
            ]
            proj = C @ v
        else:  # g minus its part in ker C^T = D^{-1} ker Cn^T (rank on the normalised rows)
            Cd = np.asarray(C)
            norms = np.linalg.norm(Cd, axis=1)
            norms = np.where(norms > 0, norms, 1.0)
            U, sigma, _ = np.linalg.svd(Cd / norms[:, None], full_matrices=True)
            rank = int((sigma > RULE_RANK_CUT * max(float(sigma.max(initial=0.0)), 1e-300)).sum())
            N = U[:, rank:] / norms[:, None]
            proj = g - N @ np.linalg.lstsq(N, g, rcond=None)[0] if N.shape[1] else g
        if m:
            gi[i, torch.from_numpy(rows)] = torch.from_numpy(np.ascontiguousarray(proj[:k]))
        if p:
            ge[i] = torch.from_numpy(np.ascontiguousarray(proj[k:]))
    return gi, ge


_INTERNAL = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (torch.__file__, os.path.dirname(os.path.abspath(__file__)))
)


def warn_degenerate(message: str) -> None:
    """Issue :class:`~dxopt.qp.QPDegenerateWarning` attributed to the first frame outside
    dxopt and torch (the user's ``backward()``/``solve`` line): with the stable ``message``,
    Python's default filter shows it once per call site, however many batches or epochs run
    through it. Silence it with ``warnings.filterwarnings("ignore",
    category=dxopt.qp.QPDegenerateWarning)``; the per-sample facts are in
    ``sol.info.backward`` (``dependent_rows``, ``vertex_dropped``)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, QPDegenerateWarning, stacklevel=level + 1)
