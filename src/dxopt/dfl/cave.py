"""Cone-aligned vector estimation, CaVE (Tang & Khalil, "CaVE: a cone-aligned approach for fast
predict-then-optimize with binary linear programs", CPAIOR 2024).

For :math:`\\min c^\\top x` over :math:`\\{Gx \\le h\\}` (equalities as two rows, bounds as unit
rows) a vertex :math:`x^*` is optimal exactly when :math:`-c` lies in the normal cone
:math:`K = \\mathrm{cone}\\{g_i : g_i^\\top x^* = h_i\\}` of the binding rows. CaVE trains the
prediction towards that cone without calling the oracle: with :math:`a = -s\\hat c`
(``sense="max"``: :math:`a = \\hat c`) and its Euclidean projection onto :math:`K`,

.. math::
    p = N^\\top \\lambda^*, \\quad \\lambda^* = \\arg\\min_{\\lambda \\ge 0} \\|N^\\top\\lambda
    - a\\|_2^2, \\qquad \\ell = 1 - \\cos(a, p) = 1 - \\frac{a^\\top p}{\\|a\\|\\,\\|p\\|},

(:math:`N` the binding normals, one non-negative least-squares problem per sample, all solved
in one compiled call by block principal pivoting with a KKT certificate per sample, and any
sample that does not certify by the active-set method of :func:`scipy.optimize.nnls`: see
:func:`cone_projection`); :math:`p` is a target held
fixed (no gradient through the projection), as in the paper. :math:`\\ell = 0` exactly when
:math:`-s\\hat c \\in K`, i.e. when :math:`x^*` is optimal for :math:`\\hat c`. This is the
exact-projection CaVE; the paper's CaVE+ (a truncated interior-point projection) and PyEPO's
default ``max_iter=3`` are not it. Where :math:`a` lies in the polar cone (:math:`p = 0`, the
cosine undefined) the target is the mean unit normal :math:`\\bar n` (a direction inside
:math:`K`), :math:`\\ell = 1 - \\cos(a, \\bar n) \\ge 1`; :attr:`CaVE.last_outside` counts such
samples.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from scipy.optimize import nnls
from torch import Tensor

from dxopt._core import DxoptWarning, check_positive, check_tensor
from dxopt.dfl._nnls import CERTIFIED, nnls_batch
from dxopt.dfl.base import OracleLoss
from dxopt.dfl.lp import lp_keywords, no_other_keywords, split_lp

__all__ = ["CaVE", "binding_normals", "cone_projection"]


@lp_keywords()
def binding_normals(x: Tensor, *, rtol: float = 1e-9, **lp: Any) -> Tensor:
    """The normals of the constraints binding at each solution, in the ``<=`` orientation:
    rows :math:`g_i` of :math:`Gx \\le h` with :math:`|g_i^\\top x - h_i| \\le`
    ``rtol`` :math:`(|g_i|^\\top|x| + |h_i|)`, both :math:`\\pm a_j` of every equality row,
    :math:`-e_i` where :math:`x_i = lb_i`, :math:`+e_i` where :math:`x_i = ub_i`.

    Returns ``(B, m, d)`` (zero rows pad samples with fewer binding rows; ``(m, d)`` for a
    ``(d,)`` ``x``), the ``tight_ctrs`` of PyEPO's ``optDatasetConstrs``. The test is relative
    to the size of the terms it sums, so 0/1 solutions of integer data are classified exactly.
    """
    check_tensor("x", x, floating=True, finite=True)
    data, rest = split_lp("binding_normals", lp)
    no_other_keywords("binding_normals", rest)
    dim = data.dim
    if x.shape[-1] != dim or x.ndim not in (1, 2):
        raise ValueError(f"x: expected shape ({dim},) or (B, {dim}), got {tuple(x.shape)}.")
    rtol = check_positive("rtol", rtol, allow_zero=True)
    X = x.detach().reshape(-1, dim).to("cpu", torch.float64).numpy()
    rows: list[list[np.ndarray]] = [[] for _ in range(X.shape[0])]
    if data.A is not None:
        for r in rows:
            r.extend([data.A, -data.A])
    if data.G is not None and data.h is not None:
        Gm, hv = data.G, data.h
        slack = np.abs(X @ Gm.T - hv)
        scale = np.abs(X) @ np.abs(Gm).T + np.abs(hv)
        for i, r in enumerate(rows):
            r.append(Gm[slack[i] <= rtol * scale[i]])
    lo, hi = data.lb, data.ub
    eye = np.eye(dim)
    for i, r in enumerate(rows):
        for sign, bound in ((-1.0, lo), (1.0, hi)):  # an infinite bound never binds
            tight = np.isfinite(bound) & (
                np.abs(X[i] - bound) <= rtol * (np.abs(bound) + np.abs(X[i]))
            )
            r.append(sign * eye[tight])
    stacked = [np.concatenate(r) if r else np.zeros((0, dim)) for r in rows]
    m = max(s.shape[0] for s in stacked)
    out = np.zeros((len(stacked), m, dim))
    for i, s in enumerate(stacked):
        out[i, : s.shape[0]] = s
    result = torch.as_tensor(out).to(x.device, x.dtype)
    return result[0] if x.ndim == 1 else result


def cone_projection(a: Tensor, normals: Tensor, *, tol: float = 1e-12) -> tuple[Tensor, Tensor]:
    """The Euclidean projection of each row of ``a`` ``(B, d)`` onto the cone spanned by the
    non-zero rows of ``normals`` ``(B, m, d)``: ``(p, lam)`` with ``p = lam @ N`` and
    ``lam = argmin_{lam >= 0} ||N^T lam - a||`` (float64; ``lam`` is 0 on the zero padding
    rows; where the generators are dependent ``lam`` is one of the minimisers, ``p`` is unique).

    All samples are solved in one compiled call by block principal pivoting, each answer
    certified by its KKT conditions to the relative tolerance ``tol``
    (:mod:`dxopt.dfl._nnls`); a sample that does not certify is solved again by the exact
    active-set method of :func:`scipy.optimize.nnls` (Lawson & Hanson, *Solving Least Squares
    Problems*, 1974, ch. 23). :attr:`CaVE.last_fallbacks` counts those samples."""
    check_tensor("a", a, floating=True, finite=True)
    check_tensor("normals", normals, floating=True, finite=True)
    tol = check_positive("tol", tol)
    if a.ndim != 2 or normals.ndim != 3 or normals.shape[::2] != a.shape:
        raise ValueError(
            f"cone_projection: expected a (B, d) and normals (B, m, d), got a "
            f"{tuple(a.shape)} and normals {tuple(normals.shape)}; pass one row of a per "
            "sample and its generators as the rows of normals[i] (zero rows are padding)."
        )
    return _cone_projection(a, normals, tol)[:2]


def _cone_projection(a: Tensor, normals: Tensor, tol: float) -> tuple[Tensor, Tensor, int]:
    """:func:`cone_projection` on checked inputs, and the number of samples that fell back."""
    A = a.detach().to("cpu", torch.float64).numpy()
    N = normals.detach().to("cpu", torch.float64).numpy()
    lam, status, _ = nnls_batch(N, A, tol=tol)
    redo = np.flatnonzero(status != CERTIFIED).tolist()
    missed = []
    for i in redo:
        keep = np.abs(N[i]).sum(1) > 0
        if keep.any():
            lam[i, keep] = nnls(N[i][keep].T, A[i])[0]
            worst = _kkt_residual(N[i][keep], A[i], lam[i, keep])
            if worst > tol:
                missed.append((i, worst))
    if missed:
        warnings.warn(
            f"cone_projection: {len(missed)} sample(s) (first: {missed[0][0]}) did not certify "
            "by block principal pivoting, and scipy.optimize.nnls's answer misses the KKT "
            f"conditions too (relative residual up to {max(m for _, m in missed):.1e} > tol = "
            f"{tol:.0e}): their projections are inaccurate; check their generators for "
            "near-dependent rows.",
            DxoptWarning,
            stacklevel=3,
        )
    proj = np.einsum("bm,bmd->bd", lam, N)
    p = torch.as_tensor(proj).to(a.device, a.dtype)
    return p, torch.as_tensor(lam).to(a.device, a.dtype), len(redo)


def _kkt_residual(N: np.ndarray, a: np.ndarray, lam: np.ndarray) -> float:
    """The largest KKT violation of ``lam`` for :math:`\\min_{\\lambda \\ge 0}
    \\|N^\\top\\lambda - a\\|`, relative to :math:`\\|n_i\\|\\,\\|a\\|`: of
    :math:`\\lambda \\ge 0`, of :math:`w = N(a - N^\\top\\lambda) \\le 0` and of
    :math:`w_i = 0` where :math:`\\lambda_i > 0`."""
    w = N @ (a - lam @ N)
    scale = np.linalg.norm(N, axis=1) * np.linalg.norm(a)
    rel = w / np.where(scale > 0, scale, 1.0)
    active = np.abs(rel[lam > 0]).max(initial=0.0)
    return float(max(rel.max(initial=0.0), active, -lam.min(initial=0.0)))


class CaVE(OracleLoss):
    """The CaVE loss (Tang & Khalil 2024), see :mod:`dxopt.dfl.cave`:
    :math:`\\ell = 1 - \\cos(-s\\hat c, \\mathrm{proj}_K(-s\\hat c))`, no oracle call.

    Args:
        oracle: the problem's oracle (only its ``sense`` and ``dim`` are used; the loss never
            calls it, :attr:`cost` stays zero).
        **kwargs: ``reduction`` of :class:`~dxopt.dfl.OracleLoss`.

    Call: ``loss(c_hat, tight_ctrs)`` with ``(B, d)`` predictions and the ``(B, m, d)`` binding
    normals at the true optima (:func:`binding_normals`; zero rows are padding).
    :attr:`last_fallbacks` counts the samples of the last call whose projection did not
    certify and was solved by :func:`scipy.optimize.nnls` (:func:`cone_projection`). A sample
    without any binding normal is refused: a non-zero linear objective has no interior optimum.
    """

    def __init__(self, oracle: Any, **kwargs: Any) -> None:
        super().__init__(oracle, **kwargs)
        self.last_outside = 0
        self.last_fallbacks = 0

    def forward(self, c_hat: Tensor, tight_ctrs: Tensor) -> Tensor:
        self.check_costs(c_hat)
        check_tensor("tight_ctrs", tight_ctrs, floating=True, finite=True)
        flat = c_hat.reshape(-1, c_hat.shape[-1])
        normals = tight_ctrs.reshape(-1, *tight_ctrs.shape[-2:])
        expected = (flat.shape[0], flat.shape[1])
        if normals.ndim != 3 or (normals.shape[0], normals.shape[2]) != expected:
            raise ValueError(
                f"tight_ctrs: expected shape ({flat.shape[0]}, m, {flat.shape[1]}) (the binding "
                f"normals of each sample, binding_normals(x_true, ...)), got "
                f"{tuple(tight_ctrs.shape)}."
            )
        nonzero = normals.detach().abs().sum(-1) > 0
        empty = ~nonzero.any(-1)
        if bool(empty.any()):
            row = int(torch.nonzero(empty)[0])
            raise ValueError(
                f"tight_ctrs: sample {row} has no binding constraint (all rows zero); an optimum "
                "of a non-zero linear cost lies on the boundary, so check the solutions given "
                "to binding_normals."
            )
        a = -self.sign * flat
        with torch.no_grad():
            proj, _, self.last_fallbacks = _cone_projection(a, normals, 1e-12)
            outside = proj.norm(dim=-1) == 0  # exactly when lam = 0: a in the polar cone
            self.last_outside = int(outside.sum())
            if self.last_outside:
                unit = normals / normals.norm(dim=-1, keepdim=True).clamp_min(
                    torch.finfo(normals.dtype).tiny
                )
                mean_unit = unit.sum(1) / nonzero.sum(1, keepdim=True).to(unit.dtype)
                proj = torch.where(outside.unsqueeze(-1), mean_unit.to(proj.dtype), proj)
        a_norm = a.norm(dim=-1)
        if bool((a_norm == 0).any()):
            row = int(torch.nonzero(a_norm == 0)[0])
            raise ValueError(f"c_hat: row {row} is zero; the cosine to the cone is undefined.")
        cos = (a * proj).sum(-1) / (a_norm * proj.norm(dim=-1))
        return self.reduce((1.0 - cos).reshape(c_hat.shape[:-1]))
