"""Natural-gradient directions for least-squares losses :math:`\\tfrac12\\|r(\\theta)\\|^2`.

Given the residual :math:`r \\in \\mathbb{R}^B` on a row set and its Jacobian
:math:`J \\in \\mathbb{R}^{B \\times P}`, the damped Gauss-Newton (natural-gradient) direction
has two equal forms by the push-through (Woodbury) identity

.. math::

    d = (J^\\top J + \\lambda I)^{-1} J^\\top r = J^\\top (J J^\\top + \\lambda I)^{-1} r ,

the *kernel* form costing :math:`O(B^2 P + B^3)` and the *parameter* form
:math:`O(B P^2 + P^3)`. For :math:`\\lambda \\to 0` and :math:`B \\le P` the kernel form tends to
the minimum-norm solution of :math:`J d = r`, one sketch-and-project (block Kaczmarz) step
(Goldshlager, Hu, Lin, arXiv:2508.21022).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dxopt.linalg import spd_solve

__all__ = ["DirectionSolve", "gauss_newton_direction", "kernel_direction", "spring_direction"]


class DirectionSolve(NamedTuple):
    """A natural-gradient direction and how its linear system was solved.

    Attributes:
        direction: the direction :math:`d` (length ``P``); the step is :math:`\\theta - \\eta d`.
        method: ``"cholesky"``, ``"cholesky+jitter"``, ``"eigh-pinv"`` or ``"lstsq"``.
        jitter: absolute diagonal shift added beyond ``damping`` (0.0 when none).
        residual: relative residual of the solved linear system.
    """

    direction: torch.Tensor
    method: str
    jitter: float
    residual: float


def check_jacobian_system(jacobian: torch.Tensor, residual: torch.Tensor) -> None:
    """Raise a ValueError naming the argument if ``(jacobian, residual)`` are malformed."""
    if not isinstance(jacobian, torch.Tensor) or not isinstance(residual, torch.Tensor):
        raise TypeError(
            "jacobian, residual: expected torch.Tensor objects, got "
            f"{type(jacobian).__name__} and {type(residual).__name__}."
        )
    if residual.ndim != 1:
        raise ValueError(
            f"residual: expected a 1-D vector of B rows, got shape {tuple(residual.shape)}; "
            "flatten the residual (e.g. with .reshape(-1))."
        )
    if jacobian.ndim != 2 or jacobian.shape[0] != residual.shape[0]:
        raise ValueError(
            f"jacobian: expected shape (B, P) = ({residual.shape[0]}, P) to match the residual, "
            f"got {tuple(jacobian.shape)}."
        )
    if not torch.isfinite(residual).all():
        raise ValueError(
            "residual: contains NaN or Inf; the iterate has diverged or the residual function "
            "is ill-defined at these points (lower the learning rate or set a norm cap)."
        )
    if not torch.isfinite(jacobian).all():
        raise ValueError(
            "jacobian: contains NaN or Inf; check the residual function for non-differentiable "
            "operations at these points."
        )


def kernel_direction(
    jacobian: torch.Tensor, residual: torch.Tensor, *, damping: float
) -> DirectionSolve:
    """Damped natural-gradient direction in kernel (Woodbury) form.

    .. math::

        d = J^\\top (J J^\\top + \\lambda I)^{-1} r .

    The ``B x B`` kernel is factored by Cholesky; if that fails, :func:`dxopt.linalg.spd_solve`
    retries with jitter and then an eigendecomposition pseudo-inverse, and the method used is
    returned so the caller can report it.

    Args:
        jacobian: ``(B, P)`` Jacobian of the residual rows.
        residual: ``(B,)`` residual vector.
        damping: :math:`\\lambda \\ge 0`.

    Returns:
        A :class:`DirectionSolve`.
    """
    check_jacobian_system(jacobian, residual)
    if damping < 0:
        raise ValueError(f"damping: expected a value >= 0, got {damping}.")
    kernel = jacobian @ jacobian.T
    if damping:
        kernel.diagonal().add_(damping)
    z, info = spd_solve(kernel, residual)
    return DirectionSolve(jacobian.T @ z, info.method, info.jitter, info.residual)


def gauss_newton_direction(
    jacobian: torch.Tensor, residual: torch.Tensor, *, damping: float = 0.0
) -> DirectionSolve:
    """Full-batch Gauss-Newton (ENGD) direction, in the cheaper of the two forms.

    For :math:`\\lambda = 0` this is the minimum-norm least-squares solution
    :math:`d = J^{+} r` (LAPACK ``gelsd``, as in the original ENGD code of Müller and
    Zeinhofer, arXiv:2302.13163); for :math:`\\lambda > 0` it is
    :math:`(J^\\top J + \\lambda I)^{-1} J^\\top r` when :math:`P < B`, else the kernel form.

    Args:
        jacobian: ``(N, P)`` Jacobian.
        residual: ``(N,)`` residual.
        damping: :math:`\\lambda \\ge 0`.

    Returns:
        A :class:`DirectionSolve`.
    """
    check_jacobian_system(jacobian, residual)
    if damping < 0:
        raise ValueError(f"damping: expected a value >= 0, got {damping}.")
    n_rows, n_params = jacobian.shape
    if damping == 0.0:
        sol = torch.linalg.lstsq(jacobian, residual.unsqueeze(-1), driver="gelsd").solution
        direction = sol.squeeze(-1)
        fit = jacobian.T @ (jacobian @ direction - residual)
        scale = torch.linalg.vector_norm(jacobian.T @ residual).clamp_min(1e-300)
        return DirectionSolve(direction, "lstsq", 0.0, float(fit.norm() / scale))
    if n_params >= n_rows:
        return kernel_direction(jacobian, residual, damping=damping)
    gram = jacobian.T @ jacobian
    gram.diagonal().add_(damping)
    direction, info = spd_solve(gram, jacobian.T @ residual)
    return DirectionSolve(direction, info.method, info.jitter, info.residual)


def spring_direction(
    jacobian: torch.Tensor,
    residual: torch.Tensor,
    previous: torch.Tensor,
    *,
    damping: float,
    momentum: float,
) -> DirectionSolve:
    """SPRING direction (Goldshlager, Abrahamsen, Lin, arXiv:2401.10190, Algorithm 1).

    .. math::

        \\phi_k = \\mu \\phi_{k-1} + J^\\top (J J^\\top + \\lambda I)^{-1}
                  (r - \\mu J \\phi_{k-1}) ,

    the damped minimum-norm correction of :math:`\\mu\\phi_{k-1}` towards :math:`J\\phi = r`.
    With :math:`\\mu = 0` this is exactly :func:`kernel_direction`.

    Args:
        jacobian: ``(B, P)``.
        residual: ``(B,)``.
        previous: ``(P,)`` previous direction :math:`\\phi_{k-1}` (zeros at the start).
        damping: :math:`\\lambda \\ge 0`.
        momentum: :math:`\\mu \\in [0, 1)`.

    Returns:
        A :class:`DirectionSolve` holding :math:`\\phi_k`.
    """
    if previous.shape != (jacobian.shape[-1],):
        raise ValueError(
            f"previous: expected shape ({jacobian.shape[-1]},) to match the Jacobian, "
            f"got {tuple(previous.shape)}."
        )
    corrected = residual - momentum * (jacobian @ previous)
    solve = kernel_direction(jacobian, corrected, damping=damping)
    return solve._replace(direction=momentum * previous + solve.direction)
