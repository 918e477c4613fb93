"""The Jacobian of the optimality map on the sparse route: a structured cone Jacobian, the
lifted sparse matrix that is factored, and the exact products that refinement checks against.

:math:`J = [[P, A^\\top D], [A, D - I]]` (:mod:`dxopt.conic.kkt`) with
:math:`D = D\\Pi_{K^*}(w)` block diagonal. Each block is kept in the form

.. math:: D = \\Lambda + B + U C U^\\top

(:class:`ConeJacobian`): :math:`\\Lambda` diagonal (zero and nonnegative cones, whose
projections act entrywise: each entry is differentiated by the cone's own rule on a slice of
one), :math:`B` the dense blocks of the small cones (exponential, power, PSD, second-order
cones below :data:`SOC_STRUCTURED_MIN`), and for a large second-order cone in its third
region (:mod:`dxopt.conic.cones.soc`, :math:`\\rho = t/r` clipped to :math:`[-1, 1]`,
:math:`\\bar x = x/r`)

.. math:: D_K = \\tfrac12 \\begin{pmatrix} 1 & \\bar x^\\top \\\\ \\bar x & (1 + \\rho) I -
    \\rho \\bar x \\bar x^\\top \\end{pmatrix} = \\tfrac12 (1 + \\rho) I + U_K C_K U_K^\\top,
    \\quad U_K = [e_0, (0, \\bar x)],\\ C_K = \\tfrac12 \\begin{pmatrix} -\\rho & 1 \\\\ 1 &
    -\\rho \\end{pmatrix}

(the identity or zero in the other two regions), so that a cone of dimension :math:`d` costs
:math:`O(d)` entries, not :math:`d^2`. With :math:`M = \\Lambda + B`, the lifted matrix

.. math:: L = \\begin{pmatrix} P & A^\\top M & A^\\top U \\\\ A & M - I & U \\\\ 0 & C U^\\top &
    -I \\end{pmatrix}

has :math:`J` as the Schur complement of its :math:`-I` block (eliminate
:math:`\\xi = C U^\\top w`), so :math:`L` is sparse, nonsingular iff :math:`J` is, and the
first :math:`n + m` entries of :math:`L^{-1}(r, 0)` and :math:`L^{-\\top}(r, 0)` are
:math:`J^{-1}r` and :math:`J^{-\\top}r`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.nonneg import NonnegCone
from dxopt.conic.cones.soc import SecondOrderCone
from dxopt.conic.cones.zero import ZeroCone
from dxopt.conic.kkt import cone_runs
from dxopt.linalg import shifted_splu

__all__ = [
    "SOC_STRUCTURED_MIN",
    "ConeJacobian",
    "SparseJacobian",
    "cone_jacobian_sparse",
    "lifted_solvers",
]

SOC_STRUCTURED_MIN = 16
"""Second-order cones of this dimension or more keep :math:`D_K` as diagonal plus rank 2;
smaller ones are dense blocks (two lifted rows per cone would cost more than the block)."""

_CHUNK = 2048  # columns per dense chunk in the exact norms of A'D


@dataclass(frozen=True)
class ConeJacobian:
    """:math:`D = \\Lambda + B + U C U^\\top` of one sample (module doc): ``diag`` ``(m,)``,
    ``blocks`` ``(m, m)`` CSR, ``U`` ``(m, r)`` CSC, ``C`` ``(r, r)`` CSR, and per
    structured cone its rows ``(start, stop)`` and columns ``(2j, 2j + 1)`` of ``U``."""

    diag: np.ndarray
    blocks: sp.csr_matrix
    U: sp.csc_matrix
    C: sp.csr_matrix
    low_rank: tuple[tuple[int, int, int], ...]

    @property
    def M(self) -> sp.csr_matrix:
        """:math:`\\Lambda + B`."""
        return sp.csr_matrix(sp.diags(self.diag) + self.blocks)

    def matvec(self, v: np.ndarray) -> np.ndarray:
        return self.diag * v + self.blocks @ v + self.U @ (self.C @ (self.U.T @ v))

    def rmatvec(self, v: np.ndarray) -> np.ndarray:
        return self.diag * v + self.blocks.T @ v + self.U @ (self.C.T @ (self.U.T @ v))

    def dense(self) -> np.ndarray:
        """``D`` as a dense array (tests and small problems only)."""
        return np.asarray(self.M.toarray() + (self.U @ self.C @ self.U.T).toarray())


def _soc_parts(
    cone: SecondOrderCone, v: Tensor, atol: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per block of ``v`` ``(cnt, d)``: the diagonal value, whether it has the rank-2 part,
    :math:`\\rho` and :math:`\\bar x`, by the regions of
    :meth:`SecondOrderCone.dproject` (``atol``: those of ``dproject_dual_snapped``)."""
    t, x = v[:, 0], v[:, 1:]
    r = torch.linalg.vector_norm(x, dim=-1)
    if atol is None:
        identity, zero = r <= t, r <= -t
    else:
        identity, zero = r < t - atol, r <= -t + atol
    middle = ~(identity | zero) & (r > 0)
    safe = torch.where(middle, r, torch.ones_like(r))
    rho = torch.clamp(t / safe, -1.0, 1.0)
    lam = torch.where(middle, 0.5 * (1 + rho), identity.to(v.dtype))
    lam = torch.where(zero, torch.zeros_like(lam), lam)
    return lam, middle, rho, x / safe[:, None]


def cone_jacobian_sparse(
    cones: tuple[Cone, ...], slices: tuple[slice, ...], w: Tensor, atol: float | None = None
) -> ConeJacobian:
    """:math:`D\\Pi_{K^*}(w)` of one sample ``w`` ``(m,)`` (float64) in the structured form;
    with ``atol`` the cones' one-sided rule at kinks (as
    :func:`dxopt.conic.kkt.cone_jacobian`)."""
    m = w.shape[0]
    diag = np.zeros(m)
    b_rows: list[np.ndarray] = []
    b_cols: list[np.ndarray] = []
    b_vals: list[np.ndarray] = []
    u_rows: list[np.ndarray] = []
    u_cols: list[np.ndarray] = []
    u_vals: list[np.ndarray] = []
    c_blocks: list[np.ndarray] = []
    low_rank: list[tuple[int, int, int]] = []
    for c, s0, cnt, d in cone_runs(cones, slices):
        v = w[s0 : s0 + cnt * d].reshape(cnt, d)
        tol = None if atol is None else torch.full((cnt,), atol, dtype=w.dtype)
        if isinstance(c, ZeroCone | NonnegCone):
            unit = type(c)(1)
            e = v.reshape(-1, 1)
            etol = None if tol is None else tol.repeat_interleave(d)
            blk = unit.dproject_dual(e) if etol is None else unit.dproject_dual_snapped(e, etol)
            diag[s0 : s0 + cnt * d] = blk.reshape(-1).numpy()
        elif isinstance(c, SecondOrderCone) and d >= SOC_STRUCTURED_MIN:
            lam, middle, rho, xbar = _soc_parts(c, v, tol)
            diag[s0 : s0 + cnt * d] = np.repeat(lam.numpy(), d)
            for j in torch.nonzero(middle).flatten().tolist():
                start, col = s0 + j * d, 2 * len(low_rank)
                u_rows += [np.array([start]), np.arange(start + 1, start + d)]
                u_cols += [np.array([col]), np.full(d - 1, col + 1)]
                u_vals += [np.ones(1), xbar[j].numpy()]
                rj = float(rho[j])
                c_blocks.append(0.5 * np.array([[-rj, 1.0], [1.0, -rj]]))
                low_rank.append((start, start + d, col))
        else:
            blocks = c.dproject_dual(v) if tol is None else c.dproject_dual_snapped(v, tol)
            base = s0 + d * np.arange(cnt)
            off = np.arange(d)
            rows = base[:, None, None] + off[None, :, None] + 0 * off[None, None, :]
            cols = base[:, None, None] + 0 * off[None, :, None] + off[None, None, :]
            b_rows.append(rows.ravel())
            b_cols.append(cols.ravel())
            b_vals.append(blocks.reshape(-1).numpy())
    cat = (lambda parts: np.concatenate(parts)) if b_rows else (lambda parts: np.zeros(0))
    blocks_m = sp.csr_matrix(
        (cat(b_vals), (cat(b_rows).astype(np.int64), cat(b_cols).astype(np.int64))),
        shape=(m, m),
    )
    r = 2 * len(low_rank)
    if r:
        U = sp.csc_matrix(
            (np.concatenate(u_vals), (np.concatenate(u_rows), np.concatenate(u_cols))),
            shape=(m, r),
        )
        C = sp.csr_matrix(sp.block_diag(c_blocks))
    else:
        U, C = sp.csc_matrix((m, 0)), sp.csr_matrix((0, 0))
    return ConeJacobian(diag, blocks_m, U, C, tuple(low_rank))


class SparseJacobian:
    """:math:`J` of one sample (module doc): exact products, exact 1-norm, and the lifted
    matrix :math:`L` to factor."""

    def __init__(self, P: sp.csc_matrix, A: sp.csc_matrix, D: ConeJacobian) -> None:
        self.P, self.A, self.D = P, A, D
        self.At = sp.csr_matrix(A.T)
        self.n, self.m = A.shape[1], A.shape[0]
        self.r = D.U.shape[1]

    @property
    def size(self) -> int:
        return self.n + self.m

    def matvec(self, z: np.ndarray) -> np.ndarray:
        """:math:`Jz`."""
        n = self.n
        zx, zw = z[:n], z[n:]
        Dzw = self.D.matvec(zw)
        return np.concatenate([self.P @ zx + self.At @ Dzw, self.A @ zx + Dzw - zw])

    def rmatvec(self, u: np.ndarray) -> np.ndarray:
        """:math:`J^\\top u`."""
        n = self.n
        ux, uw = u[:n], u[n:]
        return np.concatenate([self.P @ ux + self.At @ uw, self.D.rmatvec(self.A @ ux + uw) - uw])

    def products(self) -> tuple[Callable[[np.ndarray], np.ndarray], ...]:
        """``(matvec, rmatvec)`` of :math:`J` and :math:`J^\\top` for many products (an
        iterative solve): :math:`J = K + W C U^\\top` on the ``w`` columns with
        :math:`K = [[P, A^\\top M], [A, M - I]]` and :math:`W = [A^\\top U; U]` assembled once
        (each product then two sparse products and the rank-2 terms)."""
        M, U, C = self.D.M, self.D.U, self.D.C
        n, eye_m = self.n, sp.identity(self.m, format="csr")
        K = sp.csr_matrix(sp.bmat([[self.P, self.At @ M], [self.A, M - eye_m]]))
        Kt, W = sp.csr_matrix(K.T), sp.csr_matrix(sp.vstack([self.At @ U, U]))
        Wt, CUt, UCt = sp.csr_matrix(W.T), sp.csr_matrix(C @ U.T), sp.csr_matrix(U @ C.T)

        def matvec(z: np.ndarray) -> np.ndarray:
            out = K @ z
            if self.r:
                out += W @ (CUt @ z[n:])
            return np.asarray(out)

        def rmatvec(u: np.ndarray) -> np.ndarray:
            out = Kt @ u
            if self.r:
                out[n:] += UCt @ (Wt @ u)
            return np.asarray(out)

        return matvec, rmatvec

    def lifted(self) -> sp.csc_matrix:
        """:math:`L` (module doc), ``(n + m + r)``-square CSC."""
        M = self.D.M
        U, C = self.D.U, self.D.C
        eye_m = sp.identity(self.m, format="csr")
        top = [self.P, self.At @ M, self.At @ U]
        mid = [self.A, M - eye_m, U]
        if not self.r:
            return sp.csc_matrix(sp.bmat([top[:2], mid[:2]], format="csc"))
        bottom = [None, C @ U.T, -sp.identity(self.r, format="csr")]
        return sp.csc_matrix(sp.bmat([top, mid, bottom], format="csc"))

    def norm_1(self) -> float:
        """:math:`\\Vert J\\Vert_1` (largest column sum of :math:`|J|`), exact."""
        return self.norms()[0]

    def norms(self) -> tuple[float, float]:
        """:math:`(\\Vert J\\Vert_1, \\Vert J\\Vert_\\infty)`, exact (the largest column
        and row sums of :math:`|J|`): the entries of :math:`A^\\top D` in the columns of a
        low-rank cone, :math:`\\lambda_k A_{kj} + (G\\, C U^\\top)_{jk}` with
        :math:`G = A_R^\\top U_R`, are formed in dense chunks over the columns of :math:`A`
        that touch the cone's rows :math:`R`, and summed both ways."""
        absP, absA = abs(self.P), abs(self.A)
        cols_x = np.asarray(absP.sum(axis=0)).ravel() + np.asarray(absA.sum(axis=0)).ravel()
        rows_w = np.asarray(absA.sum(axis=1)).ravel()
        M = self.D.M
        # the low-rank cones' columns of A'M and rows of M - I are summed with their rank-2
        # part below
        plain = np.ones(self.m)
        for start, stop, _ in self.D.low_rank:
            plain[start:stop] = 0.0
        AtM = abs(self.At @ M)
        Dm = abs(sp.csc_matrix(M - sp.identity(self.m)))
        cols_w = np.asarray(AtM.sum(axis=0)).ravel() + np.asarray(Dm.sum(axis=0)).ravel()
        rows_x = np.asarray((AtM @ sp.diags(plain)).sum(axis=1)).ravel()
        rows_x += np.asarray(absP.sum(axis=1)).ravel()
        rows_w += plain * np.asarray(Dm.sum(axis=1)).ravel()
        U, C = self.D.U, self.D.C
        Acsr = sp.csr_matrix(self.A)
        for start, stop, col in self.D.low_rank:
            d = stop - start
            Ur = U[start:stop, col : col + 2].toarray()  # (d, 2): [e_0, (0, xbar)]
            CU = C[col : col + 2, col : col + 2].toarray() @ Ur.T  # (2, d)
            lam = self.D.diag[start:stop]
            # D - I on these rows is diag(lam - 1) + Ur CU; each row of Ur has one nonzero
            xbar = Ur[:, 1]
            onk = Ur[:, 0] * CU[0] + xbar * CU[1]  # the diagonal of Ur CU
            fix = np.abs(onk + lam - 1.0) - np.abs(onk)
            cols_w[start:stop] = np.abs(CU[0]) + np.abs(CU[1]) * np.abs(xbar).sum() + fix
            row_sums = np.abs(Ur[:, 0]) * np.abs(CU[0]).sum() + np.abs(xbar) * np.abs(CU[1]).sum()
            rows_w[start:stop] += row_sums + fix
            # A'D on these columns: lam_k A[k, :]' + G CU[:, k], G = A_R' U_R (n, 2)
            Ar = Acsr[start:stop]
            touched = np.unique(Ar.indices)
            G = (Ar[:, touched].T @ Ur) if touched.size else np.zeros((0, 2))
            atd, tr = np.zeros(d), np.zeros(touched.size)
            for a in range(0, d, _CHUNK):
                b = min(a + _CHUNK, d)
                T = np.abs(G @ CU[:, a:b])
                atd[a:b] = T.sum(0)
                tr += T.sum(1)
            Ac = Ar.tocoo()
            kk, jj = Ac.row, np.searchsorted(touched, Ac.col)
            v = (G[jj] * CU[:, kk].T).sum(1)
            corr = np.abs(v + lam[kk] * Ac.data) - np.abs(v)
            np.add.at(atd, kk, corr)
            np.add.at(tr, jj, corr)
            cols_w[start:stop] += atd
            rows_x[touched] += tr
        norm_1 = max(cols_x.max(initial=0.0), cols_w.max(initial=0.0))
        norm_inf = max(rows_x.max(initial=0.0), rows_w.max(initial=0.0))
        return float(norm_1), float(norm_inf)


def lifted_solvers(J: SparseJacobian, shift: float, L: Any = None) -> tuple[Any, Any]:
    """``(solve, solve_t)``: :math:`(J + \\delta I)^{-1}` and its transpose through the LU of
    the shifted lifted matrix ``L`` (module doc; built here if not given)."""
    N, r = J.size, J.r
    # the pattern of L is nearly symmetric: minimum degree on L' + L (for the n = 5000
    # problem of benchmarks/conic/large.py 8x less fill than COLAMD, the LU 3x faster)
    lu = shifted_splu(
        J.lifted() if L is None else L,
        shift,
        size=N,
        what="lifted cone-program Jacobian",
        permc_spec="MMD_AT_PLUS_A",
    )
    pad = np.zeros(r)

    def solve(v: np.ndarray) -> np.ndarray:
        return lu.solve(np.concatenate([v, pad]))[:N]

    def solve_t(v: np.ndarray) -> np.ndarray:
        return lu.solve(np.concatenate([v, pad]), trans="T")[:N]

    return solve, solve_t
