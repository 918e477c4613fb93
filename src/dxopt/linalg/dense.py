"""Checked dense SPD solves.

A system :math:`K x = b` with :math:`K \\succeq 0` is solved by Cholesky,
:math:`K = L L^\\top`. When the factorization fails (``K`` singular or indefinite in floating
point) the solve retries with :math:`K + \\delta I`, where
:math:`\\delta = \\tau \\cdot \\operatorname{tr}(K)/n` and :math:`\\tau` runs through
``jitters``. If every attempt fails it falls back to the pseudo-inverse from a symmetric
eigendecomposition (eigenvalues below ``n * eps * max|lambda|`` are dropped), which gives the
minimum-norm least-squares solution. The returned :class:`SPDSolveInfo` says which path ran,
so callers can report it instead of silently changing the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SPDSolveInfo", "spd_solve"]


@dataclass(frozen=True)
class SPDSolveInfo:
    """How :func:`spd_solve` solved the system.

    Attributes:
        method: ``"cholesky"``, ``"cholesky+jitter"`` or ``"eigh-pinv"``.
        jitter: the absolute diagonal shift that was added (0.0 for plain Cholesky).
        residual: max over the batch of ``||K x - b|| / max(||b||, tiny)``.
    """

    method: str
    jitter: float
    residual: float

    @property
    def used_fallback(self) -> bool:
        return self.method != "cholesky"


def _relative_residual(K: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> float:
    r = K @ x - b
    num = torch.linalg.vector_norm(r, dim=(-2, -1))
    den = torch.linalg.vector_norm(b, dim=(-2, -1)).clamp_min(torch.finfo(b.dtype).tiny)
    return float((num / den).max()) if num.numel() else 0.0


def spd_solve(
    K: torch.Tensor,
    b: torch.Tensor,
    *,
    jitters: tuple[float, ...] = (1e-12, 1e-10, 1e-8),
) -> tuple[torch.Tensor, SPDSolveInfo]:
    """Solve ``K x = b`` for symmetric positive (semi)definite ``K``.

    Args:
        K: ``(..., n, n)`` symmetric matrix (batched allowed).
        b: ``(..., n)`` or ``(..., n, k)`` right-hand side.
        jitters: relative diagonal shifts tried, in order, when plain Cholesky fails.

    Returns:
        ``(x, info)`` with ``x`` shaped like ``b``.

    Raises:
        ValueError: if ``K`` is not square or ``b`` does not match it.
    """
    if K.ndim < 2 or K.shape[-1] != K.shape[-2]:
        raise ValueError(f"K: expected a square (..., n, n) matrix, got shape {tuple(K.shape)}.")
    vector_rhs = b.ndim == K.ndim - 1
    rhs = b.unsqueeze(-1) if vector_rhs else b
    if rhs.shape[-2] != K.shape[-1]:
        raise ValueError(
            f"b: expected {K.shape[-1]} rows to match K of shape {tuple(K.shape)}, "
            f"got shape {tuple(b.shape)}."
        )
    n = K.shape[-1]
    eye = torch.eye(n, dtype=K.dtype, device=K.device)
    scale = (torch.diagonal(K, dim1=-2, dim2=-1).sum(-1) / max(n, 1)).abs().clamp_min(1.0)
    attempts = [(0.0, "cholesky")] + [(t, "cholesky+jitter") for t in jitters]
    for tau, method in attempts:
        shift = (tau * scale)[..., None, None] * eye if tau else 0.0
        L, info = torch.linalg.cholesky_ex(K + shift)
        if int(info.max()) == 0 if info.numel() else True:
            x = torch.cholesky_solve(rhs, L)
            res = _relative_residual(K, x, rhs)
            jitter = float((tau * scale).max()) if tau else 0.0
            out = x.squeeze(-1) if vector_rhs else x
            return out, SPDSolveInfo(method=method, jitter=jitter, residual=res)
    evals, evecs = torch.linalg.eigh(0.5 * (K + K.transpose(-1, -2)))
    cutoff = n * torch.finfo(K.dtype).eps * evals.abs().amax(-1, keepdim=True)
    inv = torch.where(evals > cutoff, 1.0 / evals, torch.zeros_like(evals))
    x = evecs @ (inv.unsqueeze(-1) * (evecs.transpose(-1, -2) @ rhs))
    res = _relative_residual(K, x, rhs)
    out = x.squeeze(-1) if vector_rhs else x
    return out, SPDSolveInfo(method="eigh-pinv", jitter=0.0, residual=res)
