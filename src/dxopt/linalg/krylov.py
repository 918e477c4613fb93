"""Checked Krylov solves.

Preconditioned conjugate gradients (Hestenes and Stiefel, 1952; Saad, *Iterative Methods for
Sparse Linear Systems*, 2nd ed., Alg. 9.1) for :math:`K x = b` with :math:`K` symmetric
positive definite and given only as a matrix-vector product. Stops when
:math:`\\|r_k\\| \\le \\max(\\text{rtol}\\,\\|b\\|, \\text{atol})` or after ``max_iter``
iterations. By default it recomputes the true residual :math:`\\|b - Kx\\|` at the end (one
extra product) and reports it, so a caller can refuse an unconverged answer instead of
returning a silently wrong one; with ``check_residual=False`` it reports the recursively
updated residual instead and charges no extra product (what a caller that counts oracle calls,
such as :mod:`dxopt.bilevel`, wants).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dxopt._core import (
    NotConvergedError,
    Status,
    check_int,
    check_on_failure,
    check_positive,
    handle_failure,
    renamed_kwargs,
)

__all__ = ["KrylovResult", "conjugate_gradient"]

MatVec = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class KrylovResult:
    """Outcome of a Krylov solve.

    Attributes:
        x: the approximate solution.
        converged: whether the final residual meets the tolerance.
        iterations: CG iterations run (one product with the operator each).
        residual_norm: ``||b - K x||``, recomputed at the end when ``check_residual`` (else the
            recursively updated residual, equal in exact arithmetic).
        matvecs: products with the operator charged, warm-start residual and final check
            included.
        status: ``SOLVED``, ``MAX_ITER`` (cap reached) or ``FAILED`` (non-positive curvature
            ``p^T K p <= 0``: ``K`` is not positive definite).
    """

    x: torch.Tensor
    converged: bool
    iterations: int
    residual_norm: float
    matvecs: int = 0
    status: Status = Status.SOLVED


@renamed_kwargs(maxiter="max_iter")
def conjugate_gradient(
    matvec: MatVec,
    b: torch.Tensor,
    *,
    x0: torch.Tensor | None = None,
    rtol: float = 1e-10,
    atol: float = 0.0,
    max_iter: int | None = None,
    preconditioner: MatVec | None = None,
    check_residual: bool = True,
    on_failure: str = "ignore",
) -> KrylovResult:
    """Solve ``K x = b`` by preconditioned CG, ``K`` given by ``matvec``.

    Args:
        matvec: ``v -> K v`` for a symmetric positive definite ``K``.
        b: right-hand side (any shape; treated as a flat vector in inner products).
        x0: starting point (default zero; warm starts save iterations but cost one product for
            the initial residual).
        rtol, atol: stopping tolerances on the residual norm (``rtol = atol = 0`` runs exactly
            ``max_iter`` iterations unless the residual is exactly zero).
        max_iter: iteration cap (default ``10 * b.numel()``); ``maxiter`` is its deprecated
            name.
        preconditioner: ``r -> M^{-1} r`` for an SPD preconditioner ``M``.
        check_residual: recompute the true residual at the end (one extra ``matvec``).
        on_failure: when the solve does not converge: ``"ignore"`` (report it in the result),
            ``"warn"`` or ``"raise"`` (:class:`~dxopt._core.NotConvergedError`).

    Raises:
        ValueError: for negative tolerances, a non-positive ``max_iter`` or an unknown
            ``on_failure``.
    """
    check_positive("rtol", rtol, allow_zero=True)
    check_positive("atol", atol, allow_zero=True)
    if max_iter is not None:
        check_int("max_iter", max_iter, hint="pass None for the default 10 * b.numel().")
    check_on_failure(on_failure)
    cap = max_iter if max_iter is not None else 10 * max(b.numel(), 1)
    matvecs = 0
    if x0 is None:
        x = torch.zeros_like(b)
        r = b.clone()
    else:
        x = x0.clone()
        r = b - matvec(x)
        matvecs += 1
    tol = max(rtol * float(torch.linalg.vector_norm(b)), atol)
    z = preconditioner(r) if preconditioner is not None else r
    p = z.clone()
    rz = torch.sum(r * z)
    iterations = 0
    breakdown = False
    while float(torch.linalg.vector_norm(r)) > tol and iterations < cap:
        Kp = matvec(p)
        matvecs += 1
        pKp = torch.sum(p * Kp)
        if not float(pKp) > 0.0:
            breakdown = True  # K is not positive definite along p (or NaN)
            break
        alpha = rz / pKp
        x = x + alpha * p
        r = r - alpha * Kp
        z = preconditioner(r) if preconditioner is not None else r
        rz_new = torch.sum(r * z)
        p = z + (rz_new / rz) * p
        rz = rz_new
        iterations += 1
    if check_residual:
        res = float(torch.linalg.vector_norm(b - matvec(x)))
        matvecs += 1
        converged = res <= tol * 1.01 + 1e-300
    else:
        res = float(torch.linalg.vector_norm(r))
        converged = res <= tol
    if breakdown:
        status = Status.FAILED
    elif converged:
        status = Status.SOLVED
    else:
        status = Status.MAX_ITER
    if status is not Status.SOLVED:
        handle_failure(
            on_failure,
            f"conjugate_gradient: {status.message} (residual {res:.3e} > tolerance {tol:.3e} "
            f"after {iterations} iterations).",
            error=NotConvergedError,
            status=status,
        )
    return KrylovResult(
        x=x,
        converged=converged,
        iterations=iterations,
        residual_norm=res,
        matvecs=matvecs,
        status=status,
    )
