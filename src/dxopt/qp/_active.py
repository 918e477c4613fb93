"""Active-set identification for the backward.

**From the forward (the default).** The forward polishes and certifies every sample
(:mod:`dxopt.qp._polish`) and hands over its active set :math:`J`. A row of :math:`J` is
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
The backward methods add two rules on top (:mod:`dxopt.qp._backward_base`): weak rows in the span
of the active rows join them, and weak rows are kept when :math:`x` is otherwise undetermined.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dxopt.qp._problem import QPProblem
from dxopt.qp._types import QPBackwardError

__all__ = ["WEAK_POLICIES", "ActiveSet", "compress_rows", "identify_active", "row_norms"]

WEAK_POLICIES = ("inactive", "active", "raise")


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


@dataclass(frozen=True)
class ActiveSet:
    """Per-sample row classification (masks are (S, m)), accuracy (S,), and the normalised
    slack :math:`\\hat s` (S, m) and signed equality residual :math:`(Ax - b)/\\|a_j\\|` (S, p)."""

    active: Tensor
    weak: Tensor
    used: Tensor
    accuracy: Tensor
    g_norm: Tensor | None
    a_norm: Tensor | None
    slack: Tensor | None = None
    eq_residual: Tensor | None = None

    @property
    def n_active(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.used.sum(-1))

    @property
    def n_weak(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.weak.sum(-1))


def row_inf(M: Tensor) -> Tensor:
    """Row max-norms, (k,) or (S, k) (zero for zero rows)."""
    if M.layout == torch.sparse_coo:
        out = torch.zeros(M.shape[0], dtype=M.dtype)
        out.index_reduce_(0, M.indices()[0], M.values().abs(), "amax")
        return out
    return M.abs().amax(-1) if M.shape[-1] else torch.zeros(M.shape[:-1], dtype=M.dtype)


def _abs_mv(problem: QPProblem, name: str, v: Tensor) -> Tensor:
    """:math:`|M||v|` per sample (componentwise scale)."""
    M = getattr(problem, name)
    if M.layout == torch.sparse_coo:
        out = abs(problem.csr[name][0]) @ v.abs().numpy().T
        return torch.from_numpy(np.ascontiguousarray(out.T))
    if M.ndim == 2:
        return v.abs() @ M.abs().T
    return torch.bmm(M.abs(), v.abs().unsqueeze(-1)).squeeze(-1)


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
    """Classify the inequality rows of every sample (see the module docstring)."""
    if weak_policy not in WEAK_POLICIES:
        raise ValueError(
            f"weak_policy: expected one of {WEAK_POLICIES}, got {weak_policy!r}. "
            "Use 'inactive' (default), 'active' or 'raise'."
        )
    S, m = x.shape[0], problem.m
    a_norm = g_norm = eq_residual = None
    eps = torch.zeros(S, dtype=torch.float64)
    if problem.A is not None:
        a_norm = row_norms(problem.A)
        eq_residual = (problem.mv("A", x) - problem.dense_vec("b")) / a_norm
        r = eq_residual.abs()
        eps = torch.maximum(eps, r.amax(-1) if r.shape[-1] else eps)
    if problem.G is None:
        empty = torch.zeros(S, 0, dtype=torch.bool)
        return ActiveSet(empty, empty, empty, eps, None, a_norm, None, eq_residual)
    g_norm = row_norms(problem.G)
    nonzero = g_norm > torch.finfo(torch.float64).tiny  # zero rows are never active
    gx = problem.mv("G", x)
    h = problem.dense_vec("h")
    raw_slack = h - gx
    # componentwise scale (no row normalisation), kept away from zero on nonzero rows
    g_inf = row_inf(problem.G)
    x_inf = x.abs().amax(-1, keepdim=True) if x.shape[-1] else torch.zeros(S, 1)
    sigma_p = h.abs() + _abs_mv(problem, "G", x) + g_inf * (1.0 + x_inf)
    rel_slack = raw_slack / sigma_p.clamp_min(torch.finfo(torch.float64).tiny)
    slack = torch.where(nonzero, raw_slack / g_norm, torch.zeros_like(raw_slack))
    # dual scale (componentwise, no absolute "1 +"): multipliers are compared with it
    nu_inf = ineq_duals.clamp_min(0.0) * g_inf * nonzero
    dual_scale = (_abs_mv(problem, "P", x) + problem.dense_vec("q").abs()).amax(-1)
    dual_scale = torch.maximum(dual_scale, nu_inf.amax(-1) if m else dual_scale)
    dual_scale = dual_scale.clamp_min(torch.finfo(torch.float64).tiny)
    comp = (rel_slack.clamp_min(0.0) * nu_inf).amax(-1) / dual_scale if m else eps
    viol = torch.where(nonzero, (-rel_slack).clamp_min(0.0), 0.0).amax(-1) if m else eps
    eps = torch.maximum(eps, torch.maximum(viol, comp))
    base = torch.clamp(1e3 * eps, min=1e-9)
    tau_nu = base * dual_scale
    if active_tol is not None:
        candidate = (slack <= active_tol) & nonzero
    else:
        candidate = (rel_slack <= base[:, None]) & nonzero
    if forward_active is not None and active_tol is None:
        # the forward's certified (polished) active set decides; rows outside it are only
        # candidates for the weak class (zero slack, zero multiplier)
        active = forward_active & nonzero & (nu_inf > 1e-10 * dual_scale[:, None])
        weak = ((forward_active & nonzero) | candidate) & ~active
        weak = weak & (nu_inf <= tau_nu[:, None])
    else:
        active = candidate & (nu_inf > tau_nu[:, None])
        weak = candidate & ~active
    if forward_active is not None:
        used_slack = torch.where(active | weak, slack.abs(), torch.zeros_like(slack))
        eps = torch.maximum(
            used_slack.amax(-1) if m else eps,
            eq_residual.abs().amax(-1)
            if eq_residual is not None and eq_residual.shape[-1]
            else torch.zeros_like(eps),
        )
    if weak_policy == "raise" and bool(weak.any()):
        rows = [tuple(int(j) for j in torch.nonzero(w).flatten()) for w in weak]
        bad = {i: r for i, r in enumerate(rows) if r}
        raise QPBackwardError(
            f"weakly active rows (zero slack and zero multiplier) at (sample: rows) {bad}; the "
            "solution map is not differentiable there. Use weak_policy='inactive' or 'active'."
        )
    used = active | weak if weak_policy == "active" else active
    return ActiveSet(active, weak, used, eps, g_norm, a_norm, slack, eq_residual)
