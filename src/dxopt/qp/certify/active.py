"""Active-set identification for the backward.

**From the forward (the default).** The forward polishes and certifies every sample
(:mod:`dxopt.qp.certify.polish`) and hands over its active set :math:`J`. A row of :math:`J` is
*strongly active* when its multiplier is above round-off, :math:`\\nu_i\\|g_i\\|_\\infty >
10^{-10}\\sigma^d` (:math:`\\sigma^d = \\max(\\||P||x| + |q|\\|_\\infty,
\\max_i \\nu_i\\|g_i\\|_\\infty)`, a dual scale with no absolute "1 +", so data at any scale is
treated alike); rows of :math:`J` with a round-off multiplier, and rows outside :math:`J` with a
relative slack below :math:`\\tau = \\max(10^3\\varepsilon, 10^{-9})` and a multiplier below
:math:`\\tau\\sigma^d`, are *weakly active* (zero slack and zero multiplier). The relative slack
is :math:`(h_i - g_i^\\top x)/(|h_i| + (|G||x|)_i + \\|g_i\\|_\\infty(1 + \\|x\\|_\\infty))`
(componentwise; no row normalisation). All-zero rows of ``G`` are never active.

**From the point** (``forward_active=None``, or a user ``active_tol``): candidates are the rows
with relative slack at most :math:`\\tau` (or normalised slack :math:`(h_i - g_i^\\top x)/
\\|g_i\\|_2 \\le` ``active_tol``), strongly active when their multiplier exceeds
:math:`\\tau\\sigma^d`. :math:`\\varepsilon` is the achieved accuracy (relative primal violation,
equality residual and complementarity).

The map :math:`\\theta \\mapsto x^\\star` is not differentiable at weakly active rows and
``weak_policy`` decides: ``"inactive"`` (default: the one-sided derivative in which the row may
leave), ``"active"`` (the row is kept as an equality: the derivative on the face) or ``"raise"``.
The backward methods add two rules on top (:mod:`dxopt.qp.backward.base`): weak rows in the span
of the active rows join them, and weak rows are kept when :math:`x` is otherwise undetermined.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.certify.tolerances import STRONG_MULTIPLIER, WEAK_FACTOR, WEAK_FLOOR
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import ActiveSet
from dxopt.qp.problem.types import QPBackwardError

__all__ = ["WEAK_POLICIES", "identify_active", "row_inf_np"]

WEAK_POLICIES = ("inactive", "active", "raise")
_TINY = float(np.finfo(np.float64).tiny)


def row_inf(M: Tensor) -> Tensor:
    """Row max-norms, (k,) or (S, k) (zero for zero rows)."""
    if M.layout == torch.sparse_coo:
        out = torch.zeros(M.shape[0], dtype=M.dtype)
        out.index_reduce_(0, M.indices()[0], M.values().abs(), "amax")
        return out
    return M.abs().amax(-1) if M.shape[-1] else torch.zeros(M.shape[:-1], dtype=M.dtype)


def _row_norms_np(problem: QPProblem, name: str) -> np.ndarray:
    """Euclidean row norms of parameter ``name`` in numpy, clamped away from zero."""
    if problem.is_sparse(name):
        csr = problem.csr[name][0]
        norm = np.sqrt(np.asarray(csr.multiply(csr).sum(axis=1)).ravel())
    else:
        M = problem.array(name)
        norm = np.sqrt(np.einsum("...ij,...ij->...i", M, M))
    return np.maximum(norm, _TINY)


def row_inf_np(M: np.ndarray) -> np.ndarray:
    """Row max-norms ``(..., k)`` of a dense ``M`` as :math:`\\max(\\max_j m_{ij},
    -\\min_j m_{ij})`: two reductions and no ``|M|`` temporary, whose fresh pages (2.5 MB at
    128 x 50 x 50) can cost more than the reduction itself."""
    if not M.shape[-1]:
        return np.zeros(M.shape[:-1])
    t = torch.from_numpy(M)
    # + 0.0: an all-zero row gets +0, as the maximum of |m_ij| would
    return (torch.maximum(t.amax(-1), t.amin(-1).neg_()) + 0.0).numpy()


_CHUNK = 1 << 16  # elements of a block of |M| (512 KB: a cache-sized block)


class _RowStats(NamedTuple):
    """Of the rows of one parameter ``M``, for ``|v|`` (S, n): :math:`|M||v|` (S, k), the row
    max-norms (k,) and the Euclidean row norms (k,), clamped away from zero."""

    abs_mv: np.ndarray
    inf: np.ndarray
    norm: np.ndarray


def _row_stats(problem: QPProblem, name: str, av: np.ndarray) -> _RowStats:
    """:class:`_RowStats` of parameter ``name`` without a temporary :math:`|M|` of its size:
    scipy's :math:`|M|` of a sparse ``M``; for a dense one :math:`|M|` formed a cache-sized block
    at a time (of samples when batched, whose row max-norms then come from
    :meth:`QPProblem.derived`, shared with the forward's certificate; of rows otherwise, in one
    pass over ``M`` with its row norms and maxima; so too a batch of one large sample)."""
    if problem.is_sparse(name):
        absM = abs(problem.csr[name][0])
        inf = np.asarray(absM.max(axis=1).todense()).ravel() if absM.shape[0] else np.zeros(0)
        abs_mv = np.ascontiguousarray((absM @ av.T).T)
        return _RowStats(abs_mv, inf, _row_norms_np(problem, name))
    M = problem.array(name)
    if M.ndim == 3 and M.shape[0] == 1 and M.shape[1] * M.shape[2] > _CHUNK:
        # one large sample: one pass over its rows, as unbatched
        abs_mv, inf, norm2 = _dense_rows_pass(M[0], av, stats=True)
        return _RowStats(abs_mv, inf[None], np.maximum(np.sqrt(norm2), _TINY)[None])
    if M.ndim == 3:
        inf = problem.derived(f"{name}_inf", name, lambda: row_inf_np(M))
        return _RowStats(_abs_mv(problem, name, av), inf, _row_norms_np(problem, name))
    abs_mv, inf, norm2 = _dense_rows_pass(M, av, stats=True)
    return _RowStats(abs_mv, inf, np.maximum(np.sqrt(norm2), _TINY))


def _abs_mv(problem: QPProblem, name: str, av: np.ndarray) -> np.ndarray:
    """:math:`|M||v|` per sample (S, k) of parameter ``name`` for ``av`` :math:`= |v|` (S, n),
    :math:`|M|` formed as in :func:`_row_stats`."""
    if problem.is_sparse(name):
        return np.ascontiguousarray((abs(problem.csr[name][0]) @ av.T).T)
    M = problem.array(name)
    if M.ndim == 2:
        return _dense_rows_pass(M, av, stats=False)[0]
    S, k, n = M.shape
    if k * n > _CHUNK:  # a sample larger than a block: a block of its rows at a time
        return np.stack([_dense_rows_pass(M[s], av[s : s + 1], stats=False)[0][0]
                         for s in range(S)]) if S else np.zeros((0, k))  # fmt: skip
    out = np.empty((S, k, 1))
    step = max(1, _CHUNK // max(k * n, 1))
    buf = np.empty((min(step, S), k, n))
    for s in range(0, S, step):
        e = min(s + step, S)
        block = np.abs(M[s:e], out=buf[: e - s])
        np.matmul(block, av[s:e, :, None], out=out[s:e])
    return out[:, :, 0]


def _dense_rows_pass(
    M: np.ndarray, av: np.ndarray, *, stats: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(|M||v|, row maxima, squared row norms)`` of a dense ``(k, n)`` ``M`` (the last two
    only with ``stats``, else empty), a cache-sized block of rows at a time: ``M`` is read
    once from memory (the row norms are the same sums as over all of ``M`` at once)."""
    k, n = M.shape
    prod = np.zeros((av.shape[0], k))
    inf, norm2 = (np.zeros(k), np.zeros(k)) if stats else (np.zeros(0), np.zeros(0))
    rows = max(1, _CHUNK // max(n, 1))
    buf = np.empty((min(rows, k), n))
    for r0 in range(0, k if n else 0, rows):
        r1 = min(r0 + rows, k)
        if stats:
            np.einsum("ij,ij->i", M[r0:r1], M[r0:r1], out=norm2[r0:r1])
        block = np.abs(M[r0:r1], out=buf[: r1 - r0])
        prod[:, r0:r1] = av @ block.T
        if stats:
            np.max(block, axis=1, out=inf[r0:r1])
    return prod, inf, norm2


def _amax(a: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Row maxima of ``a`` (S, k), ``fallback`` when ``k == 0``."""
    return a.max(-1) if a.shape[-1] else fallback


def identify_active(
    problem: QPProblem,
    x: Tensor,
    eq_duals: Tensor,
    ineq_duals: Tensor,
    *,
    active_tol: float | None,
    weak_policy: str,
    forward_active: Tensor | None = None,
) -> ActiveSet:
    """Classify the inequality rows of every sample (see the module docstring).

    The arithmetic runs in numpy on the float64 CPU data (a few dozen elementwise operations,
    each far cheaper than a torch dispatch on the small arrays of a single QP); the masks and
    scales come back as tensors sharing the arrays' memory."""
    if weak_policy not in WEAK_POLICIES:
        raise ValueError(
            f"weak_policy: expected one of {WEAK_POLICIES}, got {weak_policy!r}. "
            "Use 'inactive' (default), 'active' or 'raise'."
        )
    S, m = x.shape[0], problem.m
    xn = x.numpy()
    a_norm = g_norm = eq_residual = None
    eps = np.zeros(S)
    if problem.A is not None:
        a_norm = _row_norms_np(problem, "A")
        eq_residual = (problem.np_mv("A", xn) - problem.np_vec("b")) / a_norm
        eps = np.maximum(eps, _amax(np.abs(eq_residual), eps))
    if problem.G is None:
        empty = torch.zeros(S, 0, dtype=torch.bool)
        return ActiveSet(
            empty, empty, empty, torch.from_numpy(eps), None, _tensor(a_norm), None,
            _tensor(eq_residual),
        )  # fmt: skip
    ax = np.abs(xn)
    abs_gx, g_inf, g_norm = _row_stats(problem, "G", ax)
    nonzero = g_norm > _TINY  # zero rows are never active
    h = problem.np_vec("h")
    raw_slack = h - problem.np_mv("G", xn)
    # componentwise scale (no row normalisation), kept away from zero on nonzero rows
    x_inf = ax.max(-1, keepdims=True) if xn.shape[-1] else np.zeros((S, 1))
    sigma_p = np.abs(h) + abs_gx + g_inf * (1.0 + x_inf)
    rel_slack = raw_slack / np.maximum(sigma_p, _TINY)
    slack = np.where(nonzero, raw_slack / g_norm, 0.0)
    # dual scale (componentwise, no absolute "1 +"): multipliers are compared with it
    nu_inf = np.maximum(ineq_duals.numpy(), 0.0) * g_inf * nonzero
    P_abs = _abs_mv(problem, "P", ax)
    dual_scale = (P_abs + np.abs(problem.np_vec("q"))).max(-1)
    dual_scale = np.maximum(np.maximum(dual_scale, _amax(nu_inf, dual_scale)), _TINY)
    if m:
        comp = (np.maximum(rel_slack, 0.0) * nu_inf).max(-1) / dual_scale
        viol = np.where(nonzero, np.maximum(-rel_slack, 0.0), 0.0).max(-1)
        eps = np.maximum(eps, np.maximum(viol, comp))
    base = np.maximum(WEAK_FACTOR * eps, WEAK_FLOOR)
    tau_nu = base * dual_scale
    if active_tol is not None:
        candidate = (slack <= active_tol) & nonzero
    else:
        candidate = (rel_slack <= base[:, None]) & nonzero
    if forward_active is not None and active_tol is None:
        # the forward's certified (polished) active set decides; rows outside it are only
        # candidates for the weak class (zero slack, zero multiplier)
        fwd = forward_active.numpy() & nonzero
        active = fwd & (nu_inf > STRONG_MULTIPLIER * dual_scale[:, None])
        weak = (fwd | candidate) & ~active & (nu_inf <= tau_nu[:, None])
    else:
        active = candidate & (nu_inf > tau_nu[:, None])
        weak = candidate & ~active
    if forward_active is not None:
        used_slack = np.where(active | weak, np.abs(slack), 0.0)
        eq_eps = _amax(np.abs(eq_residual), np.zeros(S)) if eq_residual is not None else 0.0
        eps = np.maximum(_amax(used_slack, eps), eq_eps)
    if weak_policy == "raise" and weak.any():
        bad = {i: tuple(int(j) for j in np.flatnonzero(w)) for i, w in enumerate(weak) if w.any()}
        raise QPBackwardError(
            f"weakly active rows (zero slack and zero multiplier) at (sample: rows) {bad}; the "
            "solution map is not differentiable there. Use weak_policy='inactive' or 'active'."
        )
    used = active | weak if weak_policy == "active" else active
    return ActiveSet(
        torch.from_numpy(active), torch.from_numpy(weak), torch.from_numpy(used),
        torch.from_numpy(eps), _tensor(g_norm), _tensor(a_norm), torch.from_numpy(slack),
        _tensor(eq_residual),
    )  # fmt: skip


def _tensor(a: np.ndarray | None) -> Tensor | None:
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))
