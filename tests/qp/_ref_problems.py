"""Independent references for the ``dxopt.qp`` verification tests (no ``dxopt`` import).

- :func:`kkt_gradients`: the reduced-KKT vector-Jacobian product written out from the
  implicit function theorem at a *known* KKT point (problems from ``qp_zoo.complementary_qp``,
  built backwards from their KKT conditions, so the active set is exact).
- :func:`feasible_qp`: a random problem that is feasible by construction
  (:math:`h = Gx_0 + s`, :math:`s \\ge 0`, :math:`b = Ax_0`) whose solution is *not* known.
- :func:`relative_error`.
"""

from __future__ import annotations

from typing import Any

import torch
from qp_zoo import QPData, sparse_complementary_qp
from torch import Tensor


def kkt_gradients(problem: QPData, grad_x: Tensor) -> dict[str, Tensor]:
    r"""Closed-form reduced-KKT vector-Jacobian product at the known solution (unbatched).

    Solves :math:`K [u; w_J; w_A] = [\bar g; 0; 0]` with
    :math:`K = [[P, G_J^\top, A^\top], [G_J, 0, 0], [A, 0, 0]]` and returns

    .. math::

        \partial_q L = -u,\quad \partial_P L = -\tfrac12(u x^\top + x u^\top),\quad
        \partial_{h_J} L = w_J,\quad \partial_{G_J} L = -(\nu_J u^\top + w_J x^\top),

        \partial_b L = w_A,\quad \partial_A L = -(\mu u^\top + w_A x^\top)

    (Amos & Kolter, OptNet, arXiv 1703.00443); rows off :math:`J` get zero.
    """
    assert problem.x is not None, "kkt_gradients needs a problem with a known solution"
    P, x = problem.P.double(), problem.x.double()
    n = x.shape[0]
    rows: list[Tensor] = []
    G_J = None
    if problem.G is not None:
        assert problem.active is not None
        G_J = problem.G.double()[problem.active]
        rows.append(G_J)
    if problem.A is not None:
        rows.append(problem.A.double())
    C = torch.cat(rows) if rows else torch.zeros(0, n, dtype=torch.float64)
    k = C.shape[0]
    K = torch.zeros(n + k, n + k, dtype=torch.float64)
    K[:n, :n] = P
    K[:n, n:] = C.T
    K[n:, :n] = C
    rhs = torch.zeros(n + k, dtype=torch.float64)
    rhs[:n] = grad_x.double()
    solution = torch.linalg.solve(K, rhs)
    u, w = solution[:n], solution[n:]
    grads = {"q": -u, "P": -0.5 * (torch.outer(u, x) + torch.outer(x, u))}
    offset = 0
    if G_J is not None:
        assert problem.G is not None and problem.ineq_duals is not None
        assert problem.active is not None
        n_j = G_J.shape[0]
        w_J = w[:n_j]
        offset = n_j
        grad_h = torch.zeros(problem.G.shape[0], dtype=torch.float64)
        grad_h[problem.active] = w_J
        grad_G = torch.zeros(problem.G.shape, dtype=torch.float64)
        nu_J = problem.ineq_duals.double()[problem.active]
        grad_G[problem.active] = -(torch.outer(nu_J, u) + torch.outer(w_J, x))
        grads["h"], grads["G"] = grad_h, grad_G
    if problem.A is not None:
        assert problem.eq_duals is not None
        w_A = w[offset:]
        grads["b"] = w_A
        grads["A"] = -(torch.outer(problem.eq_duals.double(), u) + torch.outer(w_A, x))
    return grads


def feasible_qp(
    seed: int, n: int, *, m: int = 0, p: int = 0, ridge: float = 0.1, rank: int | None = None
) -> QPData:
    """A random QP that is feasible by construction; its solution is unknown.

    :math:`P = MM^\\top + \\text{ridge}\\,I` with :math:`M \\in \\mathbb R^{n\\times r}`
    (``rank`` r, default n), :math:`q, G, A, x_0 \\sim N(0, 1)`, :math:`h = Gx_0 + s` with
    slacks :math:`s \\sim U[0, 1]` of which about a third are exactly zero (rows active at
    :math:`x_0`), :math:`b = Ax_0`. ``m`` or ``p`` equal to 0 drops that block.
    """
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    M = torch.randn(n, n if rank is None else rank, generator=gen, dtype=f64) / n**0.5
    P = M @ M.T + ridge * torch.eye(n, dtype=f64)
    P = 0.5 * (P + P.T)
    q = torch.randn(n, generator=gen, dtype=f64)
    x0 = torch.randn(n, generator=gen, dtype=f64)
    A = b = G = h = None
    if p:
        A = torch.randn(p, n, generator=gen, dtype=f64)
        b = A @ x0
    if m:
        G = torch.randn(m, n, generator=gen, dtype=f64)
        slack = torch.rand(m, generator=gen, dtype=f64)
        slack = torch.where(torch.rand(m, generator=gen) < 1 / 3, torch.zeros_like(slack), slack)
        h = G @ x0 + slack
    return QPData(P, q, A, b, G, h)


def data_scale(problem: QPData) -> float:
    """1 + the largest absolute entry of the data (a scale for residual tolerances)."""
    return 1.0 + max(float(t.abs().max()) for t in problem.args() if t is not None and t.numel())


def grad_leaves(problem: QPData) -> dict[str, Tensor]:
    """Fresh leaf copies (requires_grad) of the present P, q, A, b, G, h."""
    return {
        k: getattr(problem, k).clone().requires_grad_()
        for k in ("P", "q", "A", "b", "G", "h")
        if getattr(problem, k) is not None
    }


def dependent_rows_qp() -> tuple[QPData, Tensor]:
    """qp_zoo's sparse problem (n=6, m=8, p=2, seed=29), densified: an active row of G is a
    multiple of a row of A, so LICQ fails although x is unique. Returns it with the exact
    :math:`\\partial L/\\partial q = -Z(Z^\\top PZ)^{-1}Z^\\top\\bar x` (Z: null space of the
    active rows) for the cotangent ``grad_x`` = 1."""
    sparse = sparse_complementary_qp(6, m=8, p=2, density=0.3, seed=29)
    problem = QPData(
        *(t.to_dense() if isinstance(t, Tensor) and t.is_sparse else t for t in sparse)
    )
    assert problem.G is not None and problem.A is not None and problem.active is not None
    rows = torch.cat([problem.G[problem.active], problem.A])
    _, singular_values, vh = torch.linalg.svd(rows)
    rank = int((singular_values > 1e-10).sum())
    assert rank < rows.shape[0], "the construction must violate LICQ"
    null = vh[rank:].T
    grad_x = torch.ones(6, dtype=torch.float64)
    reduced = null.T @ problem.P @ null
    return problem, -(null @ torch.linalg.solve(reduced, null.T @ grad_x))


def random_functional(sol: Any, seed: int) -> Tensor:
    """A random linear functional of ``sol.x`` and of both multiplier vectors (if present)."""
    gen = torch.Generator().manual_seed(seed)
    loss = (torch.randn(sol.x.shape, generator=gen, dtype=sol.x.dtype) * sol.x).sum()
    for duals in (sol.eq_duals, sol.ineq_duals):
        if duals is not None:
            loss = loss + (torch.randn(duals.shape, generator=gen, dtype=duals.dtype) * duals).sum()
    return loss


def relative_error(actual: Tensor, expected: Tensor, *, floor: float = 1e-12) -> float:
    """:math:`\\|a - e\\| / \\max(\\|e\\|, \\text{floor})` in float64.

    ``floor`` is the scale below which an error counts as absolute (e.g. the norm of the
    cotangent for a gradient that is exactly zero, such as :math:`\\partial L/\\partial q`
    when the active constraints pin :math:`x` down).
    """
    diff = (actual.detach().double() - expected.detach().double()).norm()
    return float(diff / expected.detach().double().norm().clamp_min(floor))
