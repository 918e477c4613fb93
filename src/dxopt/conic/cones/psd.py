"""The cone of positive semidefinite ``k x k`` matrices, stored as a scaled triangle (self-dual).

**Storage** (Clarabel's convention, :class:`clarabel.PSDTriangleConeT`): the upper triangle
column by column, :math:`(X_{00}, X_{01}, X_{11}, X_{02}, X_{12}, X_{22}, \\dots)`, each
off-diagonal entry times :math:`\\sqrt 2`, so that :math:`\\langle \\mathrm{svec}\\,X,
\\mathrm{svec}\\,Y\\rangle = \\mathrm{tr}(XY)` and the cone is self-dual in these coordinates. The
slice has ``k(k+1)/2`` entries. SCS stores the *lower* triangle column by column with the same
scaling; :meth:`PSDCone.scs_perm` gives the reordering.

**Projection**: with :math:`X = U \\mathrm{diag}(\\lambda) U^\\top`,
:math:`\\Pi(X) = U \\mathrm{diag}(\\max(\\lambda, 0)) U^\\top`; its derivative
:math:`D\\Pi[dX] = U (B \\circ U^\\top dX U) U^\\top` with
:math:`B_{ij} = (\\lambda_i^+ - \\lambda_j^+)/(\\lambda_i - \\lambda_j)` (and
:math:`1[\\lambda_i > 0]` on ties). In ``svec`` coordinates it is
:math:`\\sum_{i \\le j} B_{ij} e_{ij} e_{ij}^\\top` with the orthonormal
:math:`e_{ij} = \\mathrm{svec}((u_i u_j^\\top + u_j u_i^\\top)/\\sqrt 2)`
(:math:`\\mathrm{svec}(u_i u_i^\\top)` for :math:`i = j`), which is how it is built here.
Kinks: a zero eigenvalue. One-sided rule (:meth:`PSDCone.dproject_dual_snapped`): eigenvalues
within the tolerance of 0 count as negative (the smaller face; the divided differences stay
continuous, :math:`B_{ij} = 1` against a positive :math:`\\lambda_j`).

Log-barrier (the smoothed backward): :math:`F(v) = -\\log\\det S`, :math:`S = ` ``smat(v)``.
As ``svec`` is an isometry (:math:`\\langle \\mathrm{svec} X, \\mathrm{svec} Y\\rangle =
\\mathrm{tr}(XY)`), :math:`\\nabla F = -\\mathrm{svec}(S^{-1})` and the Hessian maps
:math:`\\mathrm{svec}(E)` to :math:`\\mathrm{svec}(S^{-1} E S^{-1})`, on the interior
:math:`S \\succ 0` (a Cholesky factor exists).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from dxopt.conic.cones._surface import memoized
from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.zero import _check_dim

__all__ = ["PSDCone", "smat", "svec"]


def _pairs(k: int) -> tuple[list[int], list[int]]:
    """Row and column of each svec entry (upper triangle, column by column)."""
    rows = [i for j in range(k) for i in range(j + 1)]
    cols = [j for j in range(k) for i in range(j + 1)]
    return rows, cols


def svec(X: Tensor) -> Tensor:
    """``(..., k, k)`` symmetric -> ``(..., k(k+1)/2)`` scaled upper triangle (column-wise)."""
    k = X.shape[-1]
    rows, cols = _pairs(k)
    scale = X.new_tensor([1.0 if i == j else math.sqrt(2.0) for i, j in zip(rows, cols)])
    return X[..., rows, cols] * scale


def smat(v: Tensor, k: int) -> Tensor:
    """The inverse of :func:`svec`: ``(..., k(k+1)/2)`` -> symmetric ``(..., k, k)``."""
    rows, cols = _pairs(k)
    scale = v.new_tensor([1.0 if i == j else 1.0 / math.sqrt(2.0) for i, j in zip(rows, cols)])
    X = v.new_zeros((*v.shape[:-1], k, k))
    X[..., rows, cols] = v * scale
    X[..., cols, rows] = v * scale
    return X


@dataclass(frozen=True)
class PSDCone(Cone):
    """The ``k x k`` PSD cone in the scaled upper triangle (``k(k+1)/2`` entries)."""

    k: int
    name: ClassVar[str] = "psd"
    self_dual: ClassVar[bool] = True
    _index: tuple[list[int], list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_dim("PSDCone", "k", self.k)
        object.__setattr__(self, "_index", _pairs(self.k))

    @property
    def dim(self) -> int:
        return self.k * (self.k + 1) // 2

    def _eig(self, v: Tensor) -> tuple[Tensor, Tensor]:
        # through the engine's memo (the polish, certificate, kink test and backward
        # decompose the same point): exact, keyed by v
        return memoized(("psd", self.k), v, self._eig_fresh)

    def _eig_fresh(self, v: Tensor, hint: object = None) -> tuple[Tensor, Tensor]:
        lam, U = torch.linalg.eigh(smat(v, self.k))
        return lam, U

    def project(self, v: Tensor) -> Tensor:
        lam, U = self._eig(v)
        return svec((U * torch.clamp(lam, min=0)[..., None, :]) @ U.transpose(-1, -2))

    def _jacobian(self, v: Tensor, atol: Tensor | None) -> Tensor:
        lam, U = self._eig(v)
        if atol is not None:
            lam = torch.where(lam.abs() <= atol[..., None], torch.zeros_like(lam), lam)
        rows, cols = self._index
        li, lj = lam[..., rows], lam[..., cols]
        pi, pj = li > 0, lj > 0
        mixed = torch.clamp(li, min=0) + torch.clamp(lj, min=0)
        denom = li.abs() + lj.abs()
        safe = torch.where(denom > 0, denom, torch.ones_like(denom))
        B = torch.where(pi & pj, torch.ones_like(li), mixed / safe)
        B = torch.where(~pi & ~pj, torch.zeros_like(li), B)
        # E[..., p, r]: svec entry r of the unit matrix of pair p = (i_p, j_p)
        ua_i = U[..., rows, :][..., :, rows]  # U[a_r, i_p]: (..., r, p)
        ub_j = U[..., cols, :][..., :, cols]  # U[b_r, j_p]
        ua_j = U[..., rows, :][..., :, cols]  # U[a_r, j_p]
        ub_i = U[..., cols, :][..., :, rows]  # U[b_r, i_p]
        c_p = v.new_tensor([0.5 if i == j else 1.0 / math.sqrt(2.0) for i, j in zip(rows, cols)])
        d_r = v.new_tensor([1.0 if i == j else math.sqrt(2.0) for i, j in zip(rows, cols)])
        Et = (ua_i * ub_j + ua_j * ub_i) * c_p * d_r[:, None]  # (..., r, p)
        return (Et * B[..., None, :]) @ Et.transpose(-1, -2)

    def dproject(self, v: Tensor) -> Tensor:
        return self._jacobian(v, None)

    def dproject_dual_snapped(self, v: Tensor, atol: Tensor) -> Tensor:
        return self._jacobian(v, atol)

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        lam, _ = self._eig(v)
        bound = torch.as_tensor(tol, dtype=v.dtype, device=v.device) * torch.linalg.vector_norm(
            v, dim=-1
        )
        return (lam.abs() <= bound[..., None]).any(dim=-1)

    def barrier(self, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        k, d = self.k, self.dim
        S = smat(v, k)
        L, info = torch.linalg.cholesky_ex(S)
        inside = info == 0
        eye = torch.eye(k, dtype=v.dtype, device=v.device)
        L = torch.where(inside[..., None, None], L, eye)
        Sinv = torch.cholesky_inverse(L)
        basis = smat(torch.eye(d, dtype=v.dtype, device=v.device), k)  # (d, k, k)
        images = Sinv[..., None, :, :] @ basis @ Sinv[..., None, :, :]  # (..., d, k, k)
        hess = svec(images).transpose(-1, -2)  # column j: svec(S^-1 E_j S^-1)
        return -svec(Sinv), hess, inside

    def barrier_center(self) -> Tensor:
        return svec(torch.eye(self.k, dtype=torch.float64))

    def clarabel(self) -> object:
        import clarabel

        return clarabel.PSDTriangleConeT(self.k)

    def scs(self) -> tuple[str, float | int]:
        return ("s", self.k)

    def scs_perm(self) -> list[int] | None:
        k = self.k
        return [i * (i + 1) // 2 + j for j in range(k) for i in range(j, k)]
