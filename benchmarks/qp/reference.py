"""Exact reference gradients for the benchmark QPs, independent of dxopt.

The reference solves the QP with an active-set solver (daqp, dense) or an interior-point
solver at tight tolerance (piqp, sparse), takes the strongly active set
:math:`J = \\{i: \\nu^\\star_i > 0\\}`, polishes :math:`(x^\\star, \\nu_J, \\mu)` by solving the
equality-constrained KKT system on :math:`J` exactly, and differentiates the KKT conditions
(Amos & Kolter, OptNet, arXiv 1703.00443; qp.md §4):

.. math::

    K = \\begin{bmatrix} P & G_J^\\top & A^\\top \\\\ G_J & 0 & 0 \\\\ A & 0 & 0 \\end{bmatrix},
    \\quad K \\begin{bmatrix} u \\\\ w_J \\\\ w_A \\end{bmatrix}
    = \\begin{bmatrix} \\bar g \\\\ 0 \\\\ 0 \\end{bmatrix},

    \\partial_q L = -u,\\; \\partial_{h_J} L = w_J,\\; \\partial_b L = w_A,\\;
    \\partial_{G_J} L = -(\\nu_J u^\\top + w_J x^\\top),\\;
    \\partial_A L = -(\\mu u^\\top + w_A x^\\top).

For the simplex family the closed form of :mod:`benchmarks.qp.generators` is used instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from benchmarks.qp.generators import QPProblem, simplex_closed_form_grad


@dataclass(frozen=True)
class ExactSolution:
    """Polished primal/dual solution and the strongly active inequality rows."""

    x: np.ndarray
    ineq_duals: np.ndarray  # (m,), zero off the active set
    eq_duals: np.ndarray  # (p,)
    active: np.ndarray  # indices J
    kkt_residual: float
    degenerate: bool  # K singular (LICQ fails): only the primal block is unique


def _kkt_matrix(prob: QPProblem, active: np.ndarray) -> sp.csc_matrix | np.ndarray:
    blocks = [prob.G[active]] if prob.G is not None and active.size else []
    if prob.A is not None:
        blocks.append(prob.A)
    if prob.sparse:
        C = sp.vstack([sp.csc_matrix(b) for b in blocks], format="csc") if blocks else None
        if C is None:
            return sp.csc_matrix(prob.P)
        zero = sp.csc_matrix((C.shape[0], C.shape[0]))
        return sp.bmat([[prob.P, C.T], [C, zero]], format="csc")
    C = np.vstack(blocks) if blocks else np.zeros((0, prob.n))
    top = np.hstack([prob.P, C.T])
    bottom = np.hstack([C, np.zeros((C.shape[0], C.shape[0]))])
    return np.vstack([top, bottom])


def _solve(K: sp.csc_matrix | np.ndarray, rhs: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
    r"""Solve ``K z = rhs``; returns ``(z, degenerate)``.

    A singular K (active rows that violate LICQ) is handled by factoring the quasi-definite
    :math:`K_\delta = K - \delta\,\mathrm{diag}(0, I)` and iteratively refining against K,
    which converges to a solution of the consistent singular system; its primal block is
    still unique when the reduced Hessian is positive definite, its multipliers are not.
    """
    try:
        if sp.issparse(K):
            return spla.splu(sp.csc_matrix(K)).solve(rhs), False
        lu = sla.lu_factor(K, check_finite=False)
        piv = np.abs(np.diag(lu[0]))
        if piv.min() > 1e-13 * piv.max():
            return sla.lu_solve(lu, rhs), False
    except RuntimeError:
        pass
    delta = 1e-9
    shift = np.concatenate([np.zeros(n), np.ones(K.shape[0] - n)])
    if sp.issparse(K):
        solve = spla.splu(sp.csc_matrix(K - delta * sp.diags(shift))).solve
    else:
        lu_d = sla.lu_factor(K - delta * np.diag(shift), check_finite=False)
        solve = lambda r: sla.lu_solve(lu_d, r)  # noqa: E731
    z = solve(rhs)
    for _ in range(100):
        r = rhs - K @ z
        if np.linalg.norm(r) <= 1e-13 * max(1.0, np.linalg.norm(rhs)):
            break
        z = z + solve(r)
    return z, True


def exact_solution(prob: QPProblem) -> ExactSolution:
    """Solve ``prob`` and polish on its strongly active set (see module docstring)."""
    import qpsolvers

    P, G, A = prob.P, prob.G, prob.A
    problem = qpsolvers.Problem(P, prob.q, G, prob.h, A, prob.b)
    if prob.sparse:
        sol = qpsolvers.solve_problem(problem, solver="piqp", eps_abs=1e-10, eps_rel=0.0)
    else:
        sol = qpsolvers.solve_problem(problem, solver="daqp")
    if not sol.found:
        raise RuntimeError(f"reference solve failed for the {prob.family} problem n={prob.n}")
    z = np.zeros(prob.m) if sol.z is None else np.asarray(sol.z, dtype=float)
    scale = max(1.0, float(np.abs(z).max(initial=0.0)))
    slack = prob.h - G @ sol.x if G is not None else np.zeros(0)
    active = np.nonzero((z > 1e-8 * scale) & (slack < 1e-6 * (1 + np.abs(prob.h))))[0]
    K = _kkt_matrix(prob, active)
    parts = [-prob.q]
    if active.size:
        parts.append(prob.h[active])
    if A is not None:
        parts.append(prob.b)
    sol_k, degenerate = _solve(K, np.concatenate(parts), prob.n)
    n, na = prob.n, active.size
    x = sol_k[:n]
    nu = np.zeros(prob.m)
    nu[active] = sol_k[n : n + na]
    mu = sol_k[n + na :]
    res = P @ x + prob.q + (G.T @ nu if G is not None else 0) + (A.T @ mu if A is not None else 0)
    return ExactSolution(x, nu, mu, active, float(np.linalg.norm(res)), degenerate)


def reference_grads(
    prob: QPProblem, grad_x: np.ndarray, *, matrices: bool
) -> tuple[dict[str, np.ndarray], ExactSolution | None]:
    """Exact gradients of ``L = grad_x . x*`` w.r.t. q, h, b (and G, A if ``matrices``)."""
    if prob.family == "simplex":
        return simplex_closed_form_grad(prob.q, grad_x), None
    ex = exact_solution(prob)
    K = _kkt_matrix(prob, ex.active)
    rhs = np.zeros(K.shape[0])
    rhs[: prob.n] = grad_x
    sol, _ = _solve(K, rhs, prob.n)
    n, na = prob.n, ex.active.size
    u, w_j, w_a = sol[:n], sol[n : n + na], sol[n + na :]
    grads: dict[str, np.ndarray] = {"x": ex.x, "q": -u}
    if prob.G is not None:
        dh = np.zeros(prob.m)
        dh[ex.active] = w_j
        grads["h"] = dh
        if matrices:
            w_full = np.zeros(prob.m)
            w_full[ex.active] = w_j
            grads["G"] = -(np.outer(ex.ineq_duals, u) + np.outer(w_full, ex.x))
    if prob.A is not None:
        grads["b"] = w_a
        if matrices:
            grads["A"] = -(np.outer(ex.eq_duals, u) + np.outer(w_a, ex.x))
    return grads, ex
