"""The vertex rule of :func:`dxopt.qp.backward.vertex.vertex_rows` for a batch of small dense
samples at once (decision-focused QPs such as QPTL, where every sample is degenerate).

The rule picks the vertex of the multiplier set :math:`\\Lambda = \\{(z, y): \\hat G_J^\\top z
+ \\hat A^\\top y = r,\\ z \\ge 0\\}` (rows normalised) that minimises the cost
:math:`c^\\top z` of :func:`~dxopt.qp.backward.vertex.vertex_cost`, then completes its support
in row order to a basis of the active rows. Both steps are functions of :math:`\\Lambda` alone,
so any exact method gives the per-sample loop's answer; here every step is one batched array
operation over the samples:

1. the equality multipliers are eliminated with the projector :math:`\\Pi` onto the orthogonal
   complement of :math:`\\operatorname{range}\\hat A^\\top`: with :math:`U_\\rho` an
   orthonormal basis of the range of :math:`\\hat G_J\\Pi` (rank :math:`\\rho`),
   :math:`(z, y) \\in \\Lambda` for some :math:`y` iff :math:`U_\\rho^\\top z = U_\\rho^\\top
   z_0` and :math:`z \\ge 0` (:math:`z_0` the backend's multipliers, which define :math:`r`),
   a standard-form linear program with orthonormal constraint rows. :math:`U_\\rho` comes
   from the Cholesky factor of the Gram matrix of :math:`[\\hat A; \\hat G_J]` that also
   flags the dependent rows (its ``G`` block on the independent ``G`` columns spans that
   range; one thin QR orthonormalises it, :func:`_projected_range`), the thin SVD of
   :math:`\\hat G_J\\Pi` only where that factorization failed;
2. that program is solved by the two-phase tableau simplex (Dantzig, *Linear Programming and
   Extensions*, 1963), Dantzig's pivot rule switching to Bland's (Bland, Math. Oper. Res.
   2(2), 1977: no cycling) after a run of degenerate pivots, compiled and run one sample at
   a time (:func:`dxopt.qp.backward.vertex_simplex.simplex_batch`; the minimiser is unique,
   so the pivot rule does not change it);
3. the support of the optimal vertex is completed in row order by the squared Cholesky pivots
   of the Gram matrix of :math:`[\\hat A; \\hat G_{\\text{support}}; \\hat G_{\\text{rest}}]`
   (a pivot is the squared distance of a row to the span of the rows before it; below
   ``DEPENDENT_TOL`` the row is dependent), the criterion of the per-sample completion.

Each sample's result is checked (the vertex is feasible to round-off, its support independent
and the kept rows of full rank); a sample that fails a check, or whose simplex does not finish
within its pivot budget, is left to the per-sample loop (``done`` False).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.backward.degenerate_rule import dependent_flags_dense, dependent_flags_factor
from dxopt.qp.backward.vertex_simplex import parallel_groups, simplex_batch
from dxopt.qp.certify.active import compress_rows, gather_rows
from dxopt.qp.problem.canonical import QPProblem

__all__ = ["vertex_cost", "vertex_rows_batched"]

_RANK_CUT = 1e-8  # relative singular value below which a direction counts as dependent
_SQRT2 = 2.0**0.5
_FEASIBLE_TOL = 1e-9  # relative: vertex residual and negative entries accepted as round-off


def vertex_cost(k: int) -> np.ndarray:
    """The linear cost whose minimising vertex of the multiplier set the vertex rule picks:
    the l1 norm of the normalised inequality multipliers, :math:`c_i = 1 + 10^{-6}(i +
    \\tfrac12\\{\\sqrt2\\, i^2\\})/k` (:math:`\\{\\cdot\\}` the fractional part). The
    tie-break increases with the row index (of two copies the earlier row is kept), and its
    irrational part makes the minimiser unique also where an exchange of several rows balances
    in the index alone: QPTL's two pairs of bound rows ``(7, 8)`` and ``(31, 32)`` on a path
    tied under :math:`1 + 10^{-6} i/k` (``7 - 8 - 31 + 32 = 0``), leaving the choice to the
    simplex path, but not here (``7^2 - 8^2 - 31^2 + 32^2 \\ne 0``)."""
    i = np.arange(k, dtype=np.float64)
    return 1.0 + 1e-6 * (i + 0.5 * np.modf(i * i * _SQRT2)[0]) / max(k, 1)


def vertex_rows_batched(
    problem: QPProblem,
    used: Tensor,
    ineq_duals: Tensor,
    eq_duals: Tensor,
    samples: Tensor,
    *,
    keep_parallel: bool,
    factor: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The vertex rule (:func:`~dxopt.qp.backward.vertex.vertex_rows`) of the dense
    ``samples`` (S,) in one batch (module docstring). Returns ``(used, dropped, done,
    left)``: the new mask (S, m) (unchanged off ``done``), the per-sample number of dropped
    rows, ``done`` (S,), the samples settled here (the others go to the per-sample loop), and
    for the samples whose rows changed the number of dependent rows left among the new rows
    (the dependencies among the equality rows alone; -1 elsewhere). ``factor``:
    :func:`~dxopt.qp.backward.degenerate_rule.dependent_flags_factor` of
    :func:`~dxopt.qp.backward.degenerate_rule.stacked_rows` of ``used`` (all S samples) when
    the caller has it (the same rows, normalised the same way)."""
    S = used.shape[0]
    out, dropped = used.clone(), torch.zeros(S, dtype=torch.int64)
    done = torch.zeros(S, dtype=torch.bool)
    left = torch.full((S,), -1, dtype=torch.int64)
    chosen = torch.nonzero(samples & used.any(-1)).flatten()
    if chosen.numel() == 0 or problem.G is None:
        return out, dropped, done, left
    sub = used[chosen]
    index, valid = compress_rows(sub)
    G = problem.G.to_dense() if problem.G.layout != torch.strided else problem.G
    G = G.to(torch.float64)
    G = G[chosen] if G.ndim == 3 else G
    Gk = gather_rows(G, index).numpy() * valid.numpy()[..., None]  # (s, K, n), zero padding
    z0 = ineq_duals[chosen].gather(1, index).numpy() * valid.numpy()
    _, K, n = Gk.shape
    norms = np.linalg.norm(Gk, axis=-1)
    Gn = Gk / np.where(norms > 0, norms, 1.0)[..., None]
    z0 = np.maximum(z0 * norms, 0.0)  # multipliers of the normalised rows
    An, Ua = _equality_rows(problem, chosen, n)
    C = torch.from_numpy(np.concatenate([An, Gn], 1))  # equality rows first
    if factor is None:
        flags_t, L_t, info_t, gram_t = dependent_flags_factor(C)
    else:  # the caller's factor of all samples: these samples, padding rows cut
        k = C.shape[1]
        flags_t, L_t, info_t, gram_t = (
            factor[0][chosen, :k], factor[1][chosen, :k, :k], factor[2][chosen],
            factor[3][chosen, :k, :k],
        )  # fmt: skip
    flags = flags_t.numpy()
    nonzero = np.concatenate([np.linalg.norm(An, axis=-1) > 0, norms > 0], 1)
    rank = (nonzero & ~flags).sum(-1)
    work = np.asarray(flags.any(-1))  # only dependent samples change
    if keep_parallel:
        work &= rank != parallel_groups(np.ascontiguousarray(gram_t.numpy()), nonzero)
    # 1. eliminate y: an orthonormal basis of the range of the rows projected onto the
    # complement of range A^T, read off the Cholesky factor (SVD where it failed)
    p = An.shape[1]
    M = _projected_range(L_t.numpy()[:, p:, p:], nonzero[:, p:] & ~flags[:, p:])
    failed = info_t.numpy() != 0
    if failed.any():
        M_svd = _projected_range_svd(Gn[failed], Ua[failed] if Ua.ndim == 3 else Ua)
        M = _pad_rows(M, M_svd.shape[1])
        M[failed] = _pad_rows(M_svd, M.shape[1])
    cost = np.where(valid.numpy(), vertex_cost(K)[None, :], 1.0)
    z, solved = simplex_batch(np.ascontiguousarray(M), (M @ z0[..., None])[..., 0], cost, work)
    # 2. checks: a feasible vertex (nonnegative, same constraints as z0)
    scale = np.maximum(np.abs(z0).max(-1), 1e-300)
    resid = np.linalg.norm((M @ (z - z0)[..., None])[..., 0], axis=-1)
    ok = solved & (z.min(-1) >= -_FEASIBLE_TOL * scale) & (resid <= _FEASIBLE_TOL * scale)
    # 3. the support, completed in row order: [A; support rows; other rows] in row order
    support = (z > 1e-9 * np.maximum(z.max(-1, keepdims=True), 1e-300)) & valid.numpy()
    order = np.argsort(~support, axis=1, kind="stable")  # support first, each in row order
    Go = np.take_along_axis(Gn, order[..., None], 1)
    flags_o = dependent_flags_dense(torch.from_numpy(np.concatenate([An, Go], 1))).numpy()
    dep = np.zeros_like(support)
    np.put_along_axis(dep, order, flags_o[:, An.shape[1] :], 1)
    keep = valid.numpy() & ~dep
    ok &= ~(dep & support).any(-1)  # the support of a vertex is independent
    eq_left = flags_o[:, : An.shape[1]].sum(-1)  # the kept G rows are independent
    eq_rank = (np.linalg.norm(An, axis=-1) > 0).sum(-1) - eq_left
    ok &= keep.sum(-1) + eq_rank == rank  # the kept rows span the row space
    settled = ok | ~work
    gone = torch.from_numpy(valid.numpy() & ~keep & (ok & work)[:, None])
    rows_gone = torch.zeros_like(sub)
    rows_gone.scatter_(1, index, gone)
    out[chosen] = sub & ~rows_gone
    dropped[chosen] = gone.sum(-1)
    done[chosen] = torch.from_numpy(settled)
    left[chosen] = torch.from_numpy(np.where(ok & work, eq_left, -1).astype(np.int64))
    return out, dropped, done, left


def _projected_range(W: np.ndarray, independent: np.ndarray) -> np.ndarray:
    r"""``M`` (s, r, K): orthonormal rows spanning the range of :math:`\hat G_J\Pi` (zero
    rows beyond each sample's rank ``r_s``), from the Cholesky factor of the Gram matrix of
    :math:`[\hat A; \hat G_J]`: with :math:`Q` its rows orthonormalised in order,
    :math:`\hat G_J\Pi = W Q_G` where :math:`W` is the factor's ``G`` block restricted to
    the columns of the independent ``G`` rows (``W`` (s, K, K) that block, ``independent``
    (s, K) those columns) and :math:`Q_G` has orthonormal rows, so the range is that of
    :math:`W`'s independent columns; one thin QR of them (Householder, batched) gives the
    basis. The same space as the SVD's left singular vectors, at a fraction of the cost."""
    order = np.argsort(~independent, axis=1, kind="stable")  # independent columns first
    kept = np.take_along_axis(independent, order, 1)
    Wc = np.take_along_axis(W, order[:, None, :], 2) * kept[:, None, :]
    rho = independent.sum(-1)
    r = int(rho.max(initial=0))
    if r == 0:
        return np.zeros((W.shape[0], 0, W.shape[1]))
    Q, _ = np.linalg.qr(Wc[:, :, :r])  # Q (s, K, r): its first rho_s columns span range W
    return np.swapaxes(Q, 1, 2) * (np.arange(r)[None, :] < rho[:, None])[..., None]


def _projected_range_svd(Gn: np.ndarray, Ua: np.ndarray) -> np.ndarray:
    r""":func:`_projected_range` by the thin SVD of :math:`\hat G_J\Pi` (``Ua``: an
    orthonormal basis of range :math:`\hat A^\top`), the rank cut relative at
    ``_RANK_CUT``: for the samples whose Gram factor failed (round-off)."""
    B = Gn - (Gn @ Ua) @ np.swapaxes(Ua, -1, -2) if Ua.shape[-1] else Gn
    U, sigma, _ = np.linalg.svd(B, full_matrices=False)  # U (s, K, min(K, n))
    rho = (sigma > _RANK_CUT * np.maximum(sigma.max(-1, keepdims=True), 1e-300)).sum(-1)
    return np.swapaxes(U, 1, 2) * (np.arange(U.shape[2])[None, :] < rho[:, None])[..., None]


def _pad_rows(M: np.ndarray, rows: int) -> np.ndarray:
    """``M`` (s, r, K) with zero rows appended up to ``rows``."""
    if M.shape[1] >= rows:
        return M
    return np.concatenate([M, np.zeros((M.shape[0], rows - M.shape[1], M.shape[2]))], 1)


def _equality_rows(problem: QPProblem, chosen: Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(An, Ua)``: the normalised equality rows of the ``chosen`` samples (s, p, n) and an
    orthonormal basis of their span, (n, r) for a shared ``A`` (one SVD), else (s, n, r)
    (padded with zero columns)."""
    s = int(chosen.numel())
    if problem.A is None or not problem.p:
        return np.zeros((s, 0, n)), np.zeros((n, 0))
    A_t = problem.A.to_dense() if problem.A.layout != torch.strided else problem.A
    A = A_t.to(torch.float64).numpy()
    A = A[chosen.numpy()] if A.ndim == 3 else A
    norms = np.linalg.norm(A, axis=-1)
    An = A / np.where(norms > 0, norms, 1.0)[..., None]
    U, sigma, _ = np.linalg.svd(np.swapaxes(An, -1, -2), full_matrices=False)
    big = sigma > _RANK_CUT * np.maximum(sigma.max(-1, keepdims=True), 1e-300)
    if An.ndim == 2:
        return np.broadcast_to(An, (s, *An.shape)), U[:, big]
    return An, U * big[:, None, :]
