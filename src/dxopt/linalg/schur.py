"""Batched Schur-complement solves of saddle-point systems with a positive definite block.

The system is the reduced KKT system

.. math:: \\begin{bmatrix} P & C^\\top \\\\ C & 0 \\end{bmatrix}
    \\begin{bmatrix} u \\\\ w \\end{bmatrix} = \\begin{bmatrix} r_1 \\\\ r_2 \\end{bmatrix},
    \\qquad P \\succ 0\\ (n\\times n),\\ C\\ (k\\times n).

Eliminating :math:`P` first (block elimination with Cholesky factors, a block
:math:`LDL^\\top`; Golub & Van Loan, *Matrix Computations*, 4th ed., chapter 4):

.. math:: P = LL^\\top,\\quad Y = L^{-1}C^\\top,\\quad S = CP^{-1}C^\\top = Y^\\top Y,\\quad
    t = L^{-1}r_1,\\quad Sw = Y^\\top t - r_2,\\quad u = L^{-\\top}(t - Yw).

Cost :math:`n^3/3 + n^2k + nk^2 + k^3/3` flops for the factorization (only the lower
triangle of :math:`S` is formed), :math:`2n^2 + 4nk + 2k^2` per solve, pivot-free and batched
(``torch.linalg.cholesky_ex`` on ``(B, n, n)`` and ``(B, k, k)``; one large float64 system on
a machine where torch's MKL runs on an AMD CPU goes through scipy's LAPACK instead, see
:func:`_cholesky`, and so does one small float64 system, whose torch dispatches would cost
more than its arithmetic, see :func:`_single`).

**Linear dependence of the rows of C, read off the same factorization.** With
:math:`s_j = S_{jj} = c_j^\\top P^{-1}c_j` the Cholesky factor of the unit-diagonal
:math:`\\hat S = D_s^{-1/2} S D_s^{-1/2}` has squared pivots :math:`\\pi_j` equal to the squared
sine of the angle, in the :math:`P^{-1}` inner product, between row :math:`j` and the span of
rows :math:`1..j-1`. It is scale-invariant (a row multiplied by any :math:`\\alpha \\ne 0`
gives the same :math:`\\pi`), so a tiny or huge row norm cannot hide or fake a dependence;
zero rows (padding, or an all-zero constraint: :math:`s_j = 0`, a zero row and column of
:math:`S`) get a unit diagonal in :math:`\\hat S` and so a unit pivot, never counted.
The factorization is of :math:`S` itself, the pivots of :math:`\\hat S` read off it
(:func:`_shifted`). :math:`\\pi_j <` ``tol`` marks row :math:`j` dependent; the
:math:`P^{-1}` metric is the one in which the saddle-point solve is conditioned, so a row
flagged here is one the exact solve cannot resolve to working accuracy.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.linalg.small import schur_factor_small, schur_solve_small
from dxopt.linalg.threads import blas_threads

__all__ = ["SchurFactor", "SmallSchur", "lower_gram", "schur_factor", "small_schur"]

_BLOCK = 256  # lower_gram: column-block width above which only the lower blocks are formed
_LAPACK_MIN = 400  # one system with n (and k) from this size: scipy's LAPACK (see _cholesky)
_SINGLE_MAX = 64  # one system with n and k up to this: scipy's LAPACK (see _single)


def lower_gram(Y: Tensor) -> Tensor:
    """:math:`Y^\\top Y` for ``Y`` of shape ``(B, n, k)``, exact on and below the diagonal.

    For ``k > 256`` the blocks above the diagonal are skipped (about half the flops of a full
    GEMM, as BLAS ``syrk``); their entries are then unspecified (zero), which is all a
    lower-triangular Cholesky reads.
    """
    k = Y.shape[-1]
    if k <= _BLOCK:
        return torch.bmm(Y.mT, Y)
    out = torch.zeros(*Y.shape[:-2], k, k, dtype=Y.dtype, device=Y.device)
    for start in range(0, k, _BLOCK):
        stop = min(start + _BLOCK, k)
        out[..., start:stop, :stop] = torch.bmm(Y[..., start:stop].mT, Y[..., :stop])
    return out


@dataclass(frozen=True)
class SchurFactor:
    """The factorization of :func:`schur_factor` (all tensors batched over the first axis).

    Attributes:
        L: ``(B, n, n)`` Cholesky factor of ``P``.
        Y: ``(B, n, k)`` :math:`L^{-1}C^\\top`.
        S_lower: ``(B, k, k)`` the factored matrix :math:`S' = S + \\text{shift}\\,D_s` (zero
            rows of ``C``: unit diagonal), :math:`S = Y^\\top Y`, valid on and below the
            diagonal.
        inv_scale: ``(B, k)`` :math:`1/\\sqrt{S_{jj}}` (1 on zero rows).
        nonzero: ``(B, k)`` rows of ``C`` that are not zero (:math:`S_{jj} > 0`).
        LS: ``(B, k, k)`` Cholesky factor of :math:`S'`; :math:`D_s^{-1/2}L_S` is the factor
            of :math:`\\hat S` (with the relative diagonal shift).
        pivots: ``(B, k)`` squared pivots :math:`\\pi_j` of :math:`\\hat S`,
            :math:`(L_S)_{jj}^2/S_{jj}` (about 1 on zero rows).
        info: ``(B,)`` ``cholesky_ex`` status of :math:`\\hat S` (nonzero: the factorization
            broke down, the rows are dependent to round-off).
        single: one small system factored by scipy's LAPACK (:func:`_factor_single`); its
            solves call LAPACK too.
    """

    L: Tensor
    Y: Tensor
    S_lower: Tensor
    inv_scale: Tensor
    nonzero: Tensor
    LS: Tensor
    pivots: Tensor
    info: Tensor
    single: bool = False

    def dependent(self, tol: float) -> Tensor:
        """Per-sample count of rows with :math:`\\pi_j <` ``tol`` (``(B,)``; at least 1 where
        the factorization of :math:`\\hat S` broke down)."""
        return (self.pivots < tol).sum(-1) + (self.info != 0).to(torch.int64)

    def solve(self, r1: Tensor, r2: Tensor) -> tuple[Tensor, Tensor]:
        """Solve the reduced KKT system (:math:`E = 0`) for ``(B, n)`` and ``(B, k)``
        right-hand sides; a zero row :math:`j` of ``C`` gives
        :math:`w_j = -r_{2,j}` (its equation :math:`0 = r_{2,j}` is left to the caller's
        residual check)."""
        if self.single:
            return self._solve_single(r1, r2)
        t = torch.linalg.solve_triangular(self.L, r1.unsqueeze(-1), upper=False)
        numpy = _numpy_batch(self.Y, r1, r2)
        if numpy:  # numpy's matmul: 0.03 against torch's baddbmm 0.05 ms at 128 x (50, 46)
            Y = self.Y.numpy()
            rhs = torch.from_numpy(
                np.matmul(Y.transpose(0, 2, 1), t.numpy()) - r2.numpy()[..., None]
            )
        else:
            rhs = torch.baddbmm(r2.unsqueeze(-1), self.Y.mT, t, beta=-1.0)
        # two triangular solves: about half the time of cholesky_solve on (128, 46, 46)
        w = torch.linalg.solve_triangular(self.LS, rhs, upper=False)
        w = torch.linalg.solve_triangular(self.LS.mT, w, upper=True)
        if numpy:
            t = torch.from_numpy(t.numpy() - np.matmul(Y, w.numpy()))
        else:
            t = torch.baddbmm(t, self.Y, w, alpha=-1.0)
        u = torch.linalg.solve_triangular(self.L.mT, t, upper=True)
        return u.squeeze(-1), w.squeeze(-1)

    def _solve_single(self, r1: Tensor, r2: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`solve` for one small system (:meth:`SmallSchur.solve`)."""
        small = SmallSchur(
            self.L[0].numpy(), self.Y[0].numpy(), self.S_lower[0].numpy(),
            self.inv_scale[0].numpy(), self.nonzero[0].numpy(), self.LS[0].numpy(),
            self.pivots[0].numpy(), int(self.info[0]),
        )  # fmt: skip
        u, w = small.solve(r1[0].numpy(), r2[0].numpy())
        return torch.from_numpy(u)[None], torch.from_numpy(w)[None]


def _shifted(S_lower: Tensor, shift: float) -> tuple[Tensor, Tensor, Tensor]:
    """Turn ``S_lower`` in place into :math:`S' = S + \\text{shift}\\,D_s` with a unit
    diagonal on zero rows; returns ``(inv_scale, nonzero, squared pivot scale)``.

    The Cholesky factor of :math:`S'` is :math:`D_s^{1/2}` times that of
    :math:`\\hat S + \\text{shift}\\,I`, and Cholesky's rounding errors are invariant under
    this diagonal scaling (:math:`|\\Delta S| \\le \\gamma_{k+1}|L_S||L_S^\\top|`, Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2nd ed., theorem 10.3, scales with it),
    so the pivots :math:`(L_S)_{jj}^2/S_{jj}` are those of :math:`\\hat S` to round-off without
    forming :math:`\\hat S` (two fewer passes over a ``(B, k, k)`` array)."""
    if _numpy_batch(S_lower):  # the same arithmetic in numpy: 4 fewer torch dispatches
        dn = np.einsum("...ii->...i", S_lower.numpy())  # a writable view of the diagonal
        nz = dn > 0
        sc = np.where(nz, dn, 1.0)
        dn[...] = np.where(nz, dn * (1.0 + shift), 1.0)
        return torch.from_numpy(1.0 / np.sqrt(sc)), torch.from_numpy(nz), torch.from_numpy(1.0 / sc)
    d = S_lower.diagonal(dim1=-2, dim2=-1)
    nonzero = d > 0
    scale = torch.where(nonzero, d, 1.0)
    d.copy_(torch.where(nonzero, d * (1.0 + shift), 1.0))
    return scale.rsqrt(), nonzero, scale.reciprocal()


def schur_factor(P: Tensor, C: Tensor, *, shift: float = 1e-14) -> SchurFactor | None:
    """Factor :math:`[[P, C^\\top], [C, 0]]` by block elimination (module docstring).

    Args:
        P: ``(B, n, n)``, or ``(n, n)`` shared by the batch (factored once); symmetric, only
            its lower triangle is read.
        C: ``(B, k, n)`` constraint rows; all-zero rows are allowed (padding).
        shift: relative diagonal shift of :math:`\\hat S` (keeps the factorization alive on
            exactly dependent rows, whose pivots then read about ``shift``).

    Returns:
        The :class:`SchurFactor`, or ``None`` when the Cholesky factorization of ``P`` fails
        for some sample (``P`` not numerically positive definite: use a method that does not
        eliminate ``P``).
    """
    if _single(P, C):
        return _factor_single(P, C, shift)
    big = _use_lapack(P, C)
    with _blas_threads(big):
        L, info = _cholesky(P[None] if big and P.ndim == 2 else P, big)
        if bool(info.any()):
            return None
        if L.ndim == 2:  # P shared by the batch: one factorization
            L = L.expand(C.shape[0], -1, -1)
        if big:
            Y = torch.from_numpy(_blas().dtrsm(1.0, L[0].numpy(), C[0].numpy().T, lower=1))[None]
            S_lower = torch.from_numpy(_blas().dsyrk(1.0, Y[0].numpy(), trans=1, lower=1))[None]
        else:
            Y = torch.linalg.solve_triangular(L, C.mT, upper=False)
            S_lower = _gram(Y)
        inv_scale, nonzero, pivot_scale = _shifted(S_lower, shift)
        LS, info = _cholesky(S_lower, big and S_lower.shape[-1] >= _LAPACK_MIN)
    if _numpy_batch(LS):
        ls = np.diagonal(LS.numpy(), axis1=-2, axis2=-1)
        pivots = torch.from_numpy(ls * ls * pivot_scale.numpy())
    else:
        pivots = LS.diagonal(dim1=-2, dim2=-1).pow(2).mul_(pivot_scale)
    return SchurFactor(L, Y, S_lower, inv_scale, nonzero, LS, pivots, info)


def _numpy_batch(*tensors: Tensor) -> bool:
    """A CPU float64 batch (more than one system) that numpy can take as it is."""
    return (
        tensors[0].ndim == 3
        and tensors[0].shape[0] > 1
        and all(
            t.device.type == "cpu" and t.dtype == torch.float64 and not t.requires_grad
            for t in tensors
        )
    )


def _gram(Y: Tensor) -> Tensor:
    """:func:`lower_gram`; a CPU float64 batch with ``k <= 256`` through numpy's ``matmul``,
    which calls BLAS ``syrk`` for :math:`Y^\\top Y` per matrix (half the flops of torch's
    ``bmm``) and mirrors the triangle: 128 x (n = 50, k = 46) 0.45 against 0.78 ms, 1024 x
    (100, 75) 23 against 50 ms, 4 x (2000, 256) 12 against 19 ms, one thread (numpy's loop over
    the batch stays on one thread: CPU time equals wall time with OpenBLAS's default threads)."""
    if Y.shape[-1] <= _BLOCK and _numpy_batch(Y):
        Yt = Y.mT.numpy()
        return torch.from_numpy(np.matmul(Yt, Yt.transpose(0, 2, 1)))
    return lower_gram(Y)


def _single(P: Tensor, C: Tensor) -> bool:
    """One small float64 CPU system: scipy's LAPACK directly (a torch dispatch per step costs
    more than the arithmetic: factor and one solve for n = 10, k = 4 measured 41 us against
    52 us through torch, one thread, CPU time on a loaded 2-core machine)."""
    return (
        C.shape[0] == 1
        and P.shape[-1] <= _SINGLE_MAX
        and C.shape[1] <= _SINGLE_MAX
        and P.device.type == "cpu"
        and P.dtype == C.dtype == torch.float64
    )


def _factor_single(P: Tensor, C: Tensor, shift: float) -> SchurFactor | None:
    """:func:`schur_factor` of one small system (:func:`small_schur`, LAPACK)."""
    small = small_schur((P if P.ndim == 2 else P[0]).numpy(), C[0].numpy(), shift=shift)
    if small is None:
        return None
    L_t, Y_t, S_t, inv_t, nz_t, LS_t, piv_t = (
        torch.from_numpy(a)[None]
        for a in (
            small.L,
            small.Y,
            small.S_lower,
            small.inv_scale,
            small.nonzero,
            small.LS,
            small.pivots,
        )
    )
    info_t = torch.tensor([small.info], dtype=torch.int32)
    return SchurFactor(L_t, Y_t, S_t, inv_t, nz_t, LS_t, piv_t, info_t, single=True)


@dataclass(frozen=True)
class SmallSchur:
    """The factorization of :func:`small_schur`: one unbatched system in numpy (the fields of
    :class:`SchurFactor` without the batch axis; ``info`` is the Cholesky status of
    :math:`S'`, 0 or the 1-based column where it broke down)."""

    L: np.ndarray
    Y: np.ndarray
    S_lower: np.ndarray
    inv_scale: np.ndarray
    nonzero: np.ndarray
    LS: np.ndarray
    pivots: np.ndarray
    info: int

    def dependent(self, tol: float) -> int:
        """Rows with :math:`\\pi_j <` ``tol`` (at least 1 if :math:`\\hat S`'s factorization
        broke down)."""
        return int((self.pivots < tol).sum()) + int(self.info != 0)

    def solve(self, r1: np.ndarray, r2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`SchurFactor.solve` for one system
        (:func:`dxopt.linalg.small.schur_solve_small`)."""
        return schur_solve_small(self.L, self.Y, self.LS, r1, r2)


def small_schur(P: np.ndarray, C: np.ndarray, *, shift: float = 1e-14) -> SmallSchur | None:
    """:func:`schur_factor` of one small float64 system ``P`` (n, n), ``C`` (k, n) by the
    compiled kernel :func:`dxopt.linalg.small.schur_factor_small` (no torch or LAPACK
    dispatch: for n = 10 the arithmetic costs less than one); ``None`` when the Cholesky
    factorization of ``P`` fails."""
    info_p, L, Y, S, inv_scale, nonzero, LS, pivots, info_s = schur_factor_small(P, C, shift)
    if info_p != 0:
        return None
    return SmallSchur(L, Y, S, inv_scale, nonzero, LS, pivots, int(info_s))


def _use_lapack(P: Tensor, C: Tensor) -> bool:
    """One large float64 CPU system on a machine where scipy's BLAS is the faster one, with
    thread control available (see :func:`_cholesky`)."""
    return (
        C.shape[0] == 1
        and P.shape[-1] >= _LAPACK_MIN
        and P.device.type == "cpu"
        and P.dtype == C.dtype == torch.float64
        and _mkl_on_amd()
    )


@lru_cache(maxsize=1)
def _mkl_on_amd() -> bool:
    """torch runs on MKL and the CPU is an AMD one (MKL's non-Intel code path)."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        with open("/proc/cpuinfo") as fh:
            return any("AuthenticAMD" in line for line in fh if line.startswith("vendor_id"))
    except OSError:
        return False


def _blas() -> Any:
    from scipy.linalg import blas

    return blas


def _blas_threads(active: bool) -> Any:
    """scipy's BLAS limited as :func:`dxopt.linalg.threads.blas_threads` does (no
    oversubscription) when ``active``."""
    return blas_threads() if active else nullcontext()


def _cholesky(A: Tensor, lapack: bool) -> tuple[Tensor, Tensor]:
    """Lower Cholesky factor and status of ``A`` (``(B, m, m)``), as ``cholesky_ex``.

    ``lapack=True`` (one large matrix) calls scipy's LAPACK ``dpotrf`` (with ``dtrsm`` and
    ``dsyrk`` for the rest of the factorization). It is chosen only where torch runs on MKL on
    an AMD CPU: there scipy's bundled OpenBLAS measured about 1.7x faster than torch's MKL for
    these kernels (AMD EPYC, n = 1000, k = 750, one thread: 82 ms against 131 ms for the whole
    factorization); ``dsyrk`` also forms only the lower triangle.
    """
    if not lapack:
        if A.ndim == 3 and A.shape[0] > 1 and A.device.type == "cpu" and A.dtype == torch.float64:
            # numpy's batched LAPACK loop: 1.2-2.3x faster than torch's on one thread (128 x
            # 50x50: 0.63 against 0.77 ms; 1024 x 100x100: 32 against 73 ms); it refuses the
            # whole batch if one matrix is not positive definite, then torch gives the flags
            try:
                L = np.linalg.cholesky(A.numpy())
            except (np.linalg.LinAlgError, RuntimeError):  # RuntimeError: no numpy view
                return torch.linalg.cholesky_ex(A)
            return torch.from_numpy(L), torch.zeros(A.shape[0], dtype=torch.int32)
        return torch.linalg.cholesky_ex(A)
    from scipy.linalg import lapack as lp

    L, info = lp.dpotrf(A[0].numpy(), lower=1, clean=1)
    return torch.from_numpy(L)[None], torch.tensor([int(info)], dtype=torch.int32)
