"""Implicit differentiation on the sparse route (:mod:`dxopt.conic.sparse_route`): the
reverse mode (:func:`adjoint_gradients`) and the forward mode (:func:`tangents`), one sample
at a time, never a dense ``(n + m)``-square matrix.

Both solve with the Jacobian :math:`J = [[P, A^\\top D], [A, D - I]]` of
:mod:`dxopt.conic.kkt` at the certified point, :math:`D` built by each cone's one-sided rule
at kinks (:func:`dxopt.conic.sparse_kkt.cone_jacobian_sparse` with the forward's kink
tolerance, as :mod:`dxopt.conic.backward` does), through one helper, :func:`sample_system`:
a sparse LU of the lifted matrix (:mod:`dxopt.conic.sparse_kkt`) shifted by
:data:`BACKWARD_SHIFT` :math:`\\Vert J\\Vert_1` (only to keep SuperLU off an exactly singular
matrix) and Hager's estimate of :math:`\\kappa_1(J)` (:func:`dxopt.linalg.inverse_norm_1`).
Each solve is refined against the exact :math:`J` or :math:`J^\\top`
(:func:`dxopt.linalg.refine`, with the exact :math:`\\Vert J\\Vert_\\infty` or
:math:`\\Vert J\\Vert_1` in the relative residual of :mod:`dxopt.linalg.sparse_lu`) and
accepted when that residual is at most :data:`~dxopt.conic.kkt.ROUNDOFF` and the condition
estimate at most :data:`~dxopt.conic.backward.COND_MAX`.

**A singular Jacobian** (non-unique solutions, a kink the rule could not resolve) gets, as on
the dense route, the minimum-norm least-squares solution :math:`z = M^+ r` of
:math:`Mz = r` (:math:`M = J^\\top` or :math:`J`), here by LSMR (Fong and Saunders, "LSMR:
An iterative algorithm for sparse least-squares problems", SIAM J. Sci. Comput. 33, 2011)
from :math:`z_0 = 0`: its iterates lie in the Krylov space of :math:`M^\\top M` and
:math:`M^\\top r`, inside :math:`\\mathrm{range}(M^\\top)`, so the least-squares solution
it converges to is the minimum-norm one. It runs to round-off (:data:`MIN_NORM_TOL`) with
LSMR's condition limit at :math:`1/`:data:`~dxopt.conic.backward.PINV_RTOL` (the dense
route's SVD drops singular values below that fraction of the largest; a smaller nonzero
one LSMR sees means the two would differ: refused), and is then checked with exact
products: the normal equations' residual :math:`e = M^\\top(r - Mz)` must be at most
:data:`~dxopt.conic.kkt.ROUNDOFF` relative to
:math:`\\Vert M^\\top\\Vert_\\infty(\\Vert M\\Vert_\\infty \\Vert z\\Vert_\\infty +
\\Vert r\\Vert_\\infty)`, and its error bound :math:`\\Vert e\\Vert_2 / \\sigma^2` at
most :data:`MIN_NORM_ERROR` of its scale. An accepted sample is flagged ``singular`` in
``info.backward`` (its ``residual`` then that of :math:`Mz = r`, as on the dense route) with
a :class:`~dxopt.conic.types.ConicDegenerateWarning`; a sample that fails a check is flagged
the same way and the call raises :class:`~dxopt.conic.types.ConicBackwardError` naming the
samples: no derivative rather than a wrong one.

**Reverse mode** (the formulas of :mod:`dxopt.conic.backward`): with
:math:`g = (\\bar x, D^\\top(\\bar y + \\bar s) - \\bar s)`, solve :math:`J^\\top u = g`; then
:math:`\\bar q = -u_x`, :math:`\\bar b = u_w` and, at each stored :math:`(i, j)` of the
inputs, :math:`\\bar A_{ij} = -(y_i u_{x,j} + u_{w,i} x_j)`,
:math:`\\bar P_{ij} = -\\tfrac12(u_{x,i} x_j + x_i u_{x,j})`, summed over the batch.

**Forward mode**: for tangents :math:`(dP, dq, dA, db)` (``dP``, ``dA`` one matrix shared by
the batch, sparse or dense; ``dq``, ``db`` batched or shared) solve
:math:`J\\, (dx, dw) = -\\partial F` with

.. math:: \\partial F = \\begin{pmatrix} \\tfrac12(dP + dP^\\top) x + dA^\\top y + dq \\\\
    dA\\, x - db \\end{pmatrix}

(``P`` enters symmetrised), and return :math:`dx`, :math:`dy = D\\, dw`,
:math:`ds = (D - I)\\, dw`; failed samples get zero tangents (their outputs are NaN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from dxopt.conic.backward import COND_MAX, PINV_RTOL, warn_flagged
from dxopt.conic.kkt import EPS, ROUNDOFF
from dxopt.conic.sparse_kkt import (
    ConeJacobian,
    SparseJacobian,
    cone_jacobian_sparse,
    lifted_solvers,
)
from dxopt.conic.types import ConicBackwardError, ConicBackwardInfo
from dxopt.linalg import FactorizationError, inverse_norm_1, refine

if TYPE_CHECKING:
    from dxopt.conic.sparse_route import SparseCall

__all__ = [
    "BACKWARD_SHIFT",
    "MIN_NORM_ERROR",
    "MIN_NORM_ITER",
    "MIN_NORM_TOL",
    "SampleSystem",
    "adjoint_gradients",
    "sample_system",
    "tangent_matrix",
    "tangents",
]

BACKWARD_SHIFT = 1e2 * EPS
"""The LU is of :math:`J + \\delta I`, :math:`\\delta` = this times :math:`\\Vert J\\Vert_1`:
refinement removes it in a round or two wherever :math:`\\kappa_1(J) \\le` ``COND_MAX`` (it
contracts by :math:`\\delta\\Vert J^{-1}\\Vert \\le 10^{-2}`), and on a singular ``J`` the
condition estimate of the shifted factor is about :math:`1/(100\\,\\epsilon) > `
``COND_MAX``."""

MIN_NORM_TOL = EPS
"""LSMR's ``atol`` and ``btol`` in the minimum-norm solve: run to round-off."""
MIN_NORM_ITER = 20
"""LSMR's iteration limit, this times :math:`n + m`."""
MIN_NORM_ERROR = 1e-8
"""A minimum-norm solution is accepted only where the error bound
:math:`\\Vert e\\Vert_2 / \\sigma^2` of the normal equations' residual :math:`e`
(:math:`\\sigma` the smallest nonzero singular value, LSMR's estimate) is at most this times
the bound's scale :math:`\\Vert z\\Vert_2 + \\Vert r - Mz\\Vert_2 / \\sigma`."""

Solve = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class SampleSystem:
    """The Jacobian of one certified sample with its exact norms, the shifted LU's solves
    (``None`` where SuperLU failed) and the condition estimate (``inf`` then)."""

    J: SparseJacobian
    norm_1: float
    norm_inf: float
    solve: Solve | None
    solve_t: Solve | None
    cond: float

    @property
    def D(self) -> ConeJacobian:
        return self.J.D


def sample_system(call: SparseCall, i: int) -> SampleSystem:
    """The factored Jacobian of sample ``i`` (module doc; its ``D`` by the kink rule)."""
    prob = call.prob
    assert call.w is not None and call.kink_scale is not None
    atol = call.options.kink_tol * float(call.kink_scale[i])
    D = cone_jacobian_sparse(prob.cones, prob.slices, call.w[i], atol)
    J = SparseJacobian(prob.P, prob.A, D)
    norm_1, norm_inf = J.norms()
    try:
        solve, solve_t = lifted_solvers(J, BACKWARD_SHIFT * norm_1)
    except FactorizationError:
        return SampleSystem(J, norm_1, norm_inf, None, None, float("inf"))
    cond = norm_1 * inverse_norm_1(solve, solve_t, J.size)
    return SampleSystem(J, norm_1, norm_inf, solve, solve_t, cond)


@dataclass
class _Outcome:
    """Per-sample record of one derivative pass (written into ``info.backward``)."""

    residual: list[float]
    condition: list[float]
    singular: list[bool]
    steps: int = 0


def _solve(
    sys: SampleSystem, rhs: np.ndarray, *, adjoint: bool
) -> tuple[np.ndarray | None, float, int, bool]:
    """``(z, residual, steps, minimum_norm)`` of :math:`J z = r` (:math:`J^\\top z = r` if
    ``adjoint``): the refined LU solve where it passes its checks, else the checked
    minimum-norm solution (:func:`_min_norm`); ``z`` ``None`` where the sample is refused
    (module doc)."""
    residual, steps = float("inf"), 0
    if sys.solve is not None and sys.solve_t is not None:
        if adjoint:
            sol = refine(sys.solve_t, sys.J.rmatvec, rhs, norm=sys.norm_1, target=EPS)
        else:
            sol = refine(sys.solve, sys.J.matvec, rhs, norm=sys.norm_inf, target=EPS)
        if sol.residual <= ROUNDOFF and sys.cond <= COND_MAX:
            return sol.z, sol.residual, sol.steps, False
        residual, steps = sol.residual, sol.steps
    z, ls_residual = _min_norm(sys, rhs, adjoint=adjoint)
    if z is None:
        return None, residual, steps, False
    return z, ls_residual, steps, True


def _min_norm(sys: SampleSystem, rhs: np.ndarray, *, adjoint: bool) -> tuple[Any, float]:
    """The minimum-norm least-squares solution of :math:`Mz = r`, :math:`M = J^\\top` (or
    :math:`J`), by LSMR from :math:`z_0 = 0` (module doc), and its relative residual
    :math:`\\Vert r - Mz\\Vert_\\infty / (\\Vert M\\Vert_\\infty \\Vert z\\Vert_\\infty +
    \\Vert r\\Vert_\\infty)`; ``None`` where a check fails."""
    N = sys.J.size
    if not np.abs(rhs).max(initial=0.0) > 0:
        return np.zeros(N), 0.0
    jv, jtv = sys.J.products()
    if adjoint:
        mv, rmv, norm_m, norm_mt = jtv, jv, sys.norm_1, sys.norm_inf
    else:
        mv, rmv, norm_m, norm_mt = jv, jtv, sys.norm_inf, sys.norm_1
    op = spla.LinearOperator((N, N), matvec=mv, rmatvec=rmv, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        z, istop, _, _, _, norma, conda, _ = spla.lsmr(
            op,
            rhs,
            atol=MIN_NORM_TOL,
            btol=MIN_NORM_TOL,
            conlim=1.0 / PINV_RTOL,
            maxiter=MIN_NORM_ITER * N,
        )
        if istop in (3, 6, 7) or not np.isfinite(z).all():
            return None, float("inf")  # past conlim (the SVD's cut) or not converged
        r = rhs - mv(z)
        e = rmv(r)  # the normal equations' residual M'(r - Mz)
        scale = norm_m * float(np.abs(z).max()) + float(np.abs(rhs).max())
        normal = float(np.abs(e).max()) / (norm_mt * scale)
        # ||z - z+|| <= ||e|| / s^2 on range(M'), s = ||M|| / cond the least nonzero
        # singular value, against the bound's own scale ||z|| + ||r|| / s
        inv_s = conda / norma if norma > 0 else 0.0
        error = float(np.linalg.norm(e)) * inv_s**2
        size = float(np.linalg.norm(z)) + float(np.linalg.norm(r)) * inv_s
    if not (normal <= ROUNDOFF and error <= MIN_NORM_ERROR * size):
        return None, float("inf")
    return z, float(np.abs(r).max()) / scale


def _implicit(
    call: SparseCall,
    rhs: Callable[[int, ConeJacobian], np.ndarray],
    finish: Callable[[int, np.ndarray, ConeJacobian], None],
    *,
    adjoint: bool,
) -> None:
    """Solve per certified sample ``i`` with the right-hand side ``rhs(i, D)`` and hand the
    solution to ``finish(i, z, D)``; record, refuse and warn as the module doc says."""
    prob, info = call.prob, call.info
    assert info is not None
    B = prob.batch
    out = _Outcome([0.0] * B, [float("nan")] * B, [False] * B)
    kinks: list[int] = []
    bad: list[int] = []
    for i, st in enumerate(call.status):
        if not st.ok:
            continue
        if info.kink[i]:
            kinks.append(i)
        sys = sample_system(call, i)
        z, out.residual[i], steps, pinv = _solve(sys, rhs(i, sys.D), adjoint=adjoint)
        out.condition[i], out.steps = sys.cond, max(out.steps, steps)
        out.singular[i] = z is None or pinv
        if z is None:
            bad.append(i)
        else:
            finish(i, z, sys.D)
    bi: ConicBackwardInfo = info.backward
    bi.linear_solver, bi.residual, bi.refinement_steps = "splu", tuple(out.residual), out.steps
    bi.singular, bi.condition = tuple(out.singular), tuple(out.condition)
    mode = "reverse" if adjoint else "forward"
    if bad:
        raise ConicBackwardError(
            f"dxopt.conic (sparse route, {mode} mode): the Jacobian of samples {bad[:10]} is "
            f"singular or too ill-conditioned (condition estimate {out.condition[bad[0]]:.3g}, "
            f"refined residual {out.residual[bad[0]]:.3g}; see sol.info.backward): no "
            "derivative is returned. A singular Jacobian means a non-unique solution or an "
            "unresolved kink, and its minimum-norm solution did not pass its checks here "
            "(LSMR to round-off, the normal equations' residual and error bound); "
            "route='dense' gives the SVD's minimum-norm solution where the dense problem fits "
            "in memory"
        )
    warn_flagged(sorted(set(kinks) | {i for i in range(B) if out.singular[i]}), stacklevel=5)


def adjoint_gradients(
    call: SparseCall, gx: Tensor, gy: Tensor, gs: Tensor
) -> dict[str, np.ndarray]:
    """Reverse mode (module doc): ``q`` ``(B, n)``, ``b`` ``(B, m)`` per sample, ``A`` and
    ``P`` on their stored entries summed over the batch."""
    prob = call.prob
    X, Y = call.x, call.y
    assert X is not None and Y is not None
    B, n, m = prob.batch, prob.n, prob.m
    gq, gb = np.zeros((B, n)), np.zeros((B, m))
    A_rows, A_cols = prob.A_pattern.rows, prob.A_pattern.cols
    gA = np.zeros(A_rows.size)
    gP = np.zeros(prob.P_pattern.rows.size) if prob.P_pattern is not None else np.zeros(0)

    def rhs(i: int, D: ConeJacobian) -> np.ndarray:
        return np.concatenate([gx[i].numpy(), D.rmatvec((gy[i] + gs[i]).numpy()) - gs[i].numpy()])

    def finish(i: int, u: np.ndarray, D: ConeJacobian) -> None:
        nonlocal gA, gP
        ux, uw = u[:n], u[n:]
        x, y = X[i].numpy(), Y[i].numpy()
        gq[i], gb[i] = -ux, uw
        gA -= y[A_rows] * ux[A_cols] + uw[A_rows] * x[A_cols]
        if prob.P_pattern is not None:
            r, c = prob.P_pattern.rows, prob.P_pattern.cols
            gP -= 0.5 * (ux[r] * x[c] + x[r] * ux[c])

    _implicit(call, rhs, finish, adjoint=True)
    return {"q": gq, "b": gb, "A": gA, "P": gP}


def tangent_matrix(name: str, t: Tensor | None, shape: tuple[int, int]) -> sp.csr_matrix | None:
    """The tangent of the sparse input ``name`` (``P`` or ``A``) as a float64 scipy matrix, or
    ``None`` where it is absent or zero: a sparse COO/CSR or dense tensor of the input's
    shape (forward-mode AD hands a sparse input's tangent in the input's layout).

    Raises:
        ValueError: a tangent of another shape, naming the input.
    """
    if t is None:
        return None
    t = t.detach().to(device="cpu", dtype=torch.float64)
    if tuple(t.shape) != shape:
        raise ValueError(
            f"the tangent of {name}: expected shape {shape} ({name}'s shape), got "
            f"{tuple(t.shape)}; give a tangent of the input's shape"
        )
    if t.layout == torch.sparse_csr:
        parts = (t.values().numpy(), t.col_indices().numpy(), t.crow_indices().numpy())
        M = sp.csr_matrix(parts, shape=shape)
    elif t.layout == torch.sparse_coo:
        t = t.coalesce()
        idx = t.indices().numpy()
        M = sp.csr_matrix((t.values().numpy(), (idx[0], idx[1])), shape=shape)
    else:
        M = sp.csr_matrix(t.numpy())
    return M if M.count_nonzero() else None


def tangents(
    call: SparseCall,
    dP: sp.csr_matrix | None,
    dq: Tensor,
    dA: sp.csr_matrix | None,
    db: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Forward mode (module doc): ``(dx, dy, ds)`` ``(B, n), (B, m), (B, m)`` float64 for the
    shared matrix tangents ``dP``, ``dA`` (``None``: zero) and ``dq`` ``(B, n)``, ``db``
    ``(B, m)``."""
    prob = call.prob
    X, Y = call.x, call.y
    assert X is not None and Y is not None
    B, n, m = prob.batch, prob.n, prob.m
    f64 = torch.float64
    dx, dy, ds = (torch.zeros(B, k, dtype=f64) for k in (n, m, m))
    dPs = None if dP is None else 0.5 * (dP + dP.T)
    dAt = None if dA is None else sp.csr_matrix(dA.T)

    def rhs(i: int, D: ConeJacobian) -> np.ndarray:
        x, y = X[i].numpy(), Y[i].numpy()
        f1, f2 = dq[i].numpy().copy(), -db[i].numpy()
        if dPs is not None:
            f1 += dPs @ x
        if dA is not None and dAt is not None:
            f1 += dAt @ y
            f2 += dA @ x
        return -np.concatenate([f1, f2])

    def finish(i: int, z: np.ndarray, D: ConeJacobian) -> None:
        dw = z[n:]
        Ddw = D.matvec(dw)
        dx[i] = torch.from_numpy(z[:n])
        dy[i] = torch.from_numpy(Ddw)
        ds[i] = torch.from_numpy(Ddw - dw)

    _implicit(call, rhs, finish, adjoint=False)
    return dx, dy, ds
