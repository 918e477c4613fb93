"""Checked Krylov solves.

Preconditioned conjugate gradients (Hestenes and Stiefel, 1952; Saad, *Iterative Methods for
Sparse Linear Systems*, 2nd ed., Alg. 9.1) for :math:`K x = b` with :math:`K` symmetric
positive definite and given only as a matrix-vector product. Stops when
:math:`\\|b - Kx\\| \\le \\max(\\text{rtol}\\,\\|b\\|, \\text{atol})`, recomputes the true
residual at the end and reports it, so a caller can refuse an unconverged answer instead of
returning a silently wrong one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["KrylovResult", "conjugate_gradient"]

MatVec = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class KrylovResult:
    """Outcome of a Krylov solve.

    Attributes:
        x: the approximate solution.
        converged: whether the true final residual meets the tolerance.
        iterations: matrix-vector products with the operator (excluding the final check).
        residual_norm: ``||b - K x||`` recomputed at the end.
    """

    x: torch.Tensor
    converged: bool
    iterations: int
    residual_norm: float


def conjugate_gradient(
    matvec: MatVec,
    b: torch.Tensor,
    *,
    x0: torch.Tensor | None = None,
    rtol: float = 1e-10,
    atol: float = 0.0,
    maxiter: int | None = None,
    preconditioner: MatVec | None = None,
) -> KrylovResult:
    """Solve ``K x = b`` by preconditioned CG, ``K`` given by ``matvec``.

    Args:
        matvec: ``v -> K v`` for a symmetric positive definite ``K``.
        b: right-hand side (any shape; treated as a flat vector in inner products).
        x0: starting point (default zero; warm starts save iterations).
        rtol, atol: stopping tolerances on the residual norm.
        maxiter: iteration cap (default ``10 * b.numel()``).
        preconditioner: ``r -> M^{-1} r`` for an SPD preconditioner ``M``.

    Raises:
        ValueError: for negative tolerances or a non-positive ``maxiter``.
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol/atol: expected non-negative tolerances, got {rtol}, {atol}.")
    if maxiter is not None and maxiter < 1:
        raise ValueError(f"maxiter: expected a positive integer, got {maxiter}.")
    cap = maxiter if maxiter is not None else 10 * max(b.numel(), 1)
    x = torch.zeros_like(b) if x0 is None else x0.clone()
    r = b - matvec(x) if x0 is not None else b.clone()
    tol = max(rtol * float(torch.linalg.vector_norm(b)), atol)
    z = preconditioner(r) if preconditioner is not None else r
    p = z.clone()
    rz = torch.sum(r * z)
    iterations = 0
    while float(torch.linalg.vector_norm(r)) > tol and iterations < cap:
        Kp = matvec(p)
        pKp = torch.sum(p * Kp)
        if float(pKp) <= 0.0:
            break  # K is not positive definite along p; report non-convergence below
        alpha = rz / pKp
        x = x + alpha * p
        r = r - alpha * Kp
        z = preconditioner(r) if preconditioner is not None else r
        rz_new = torch.sum(r * z)
        p = z + (rz_new / rz) * p
        rz = rz_new
        iterations += 1
    true_res = float(torch.linalg.vector_norm(b - matvec(x)))
    return KrylovResult(
        x=x,
        converged=true_res <= tol * 1.01 + 1e-300,
        iterations=iterations,
        residual_norm=true_res,
    )
