"""Subsampled natural gradient (SNG), SPRING and ENGD (full Gauss-Newton) optimizers.

All three minimize :math:`L(\\theta) = \\tfrac12\\|r(\\theta)\\|^2` for a residual function
``residual(params, batch)`` and update the model's parameters in place with
``report = opt.step(batch)``. SNG and SPRING take a (sub)sampled batch of rows each step;
ENGD takes the full batch and picks its step by a line search.

References:
    - Goldshlager, Hu, Lin. A Sketch-and-Project Analysis of Subsampled Natural Gradient
      Algorithms. ICML 2026, arXiv:2508.21022.
    - Goldshlager, Abrahamsen, Lin. A Kaczmarz-inspired approach to accelerate the
      optimization of neural network wavefunctions (SPRING). JCP 2024, arXiv:2401.10190.
    - Müller, Zeinhofer. Achieving High Accuracy with PINNs via Energy Natural Gradient
      Descent (ENGD). ICML 2023, arXiv:2302.13163.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn
from torch.func import vmap

from dxopt.natgrad._base import (
    FallbackPolicy,
    NaturalGradientOptimizer,
    StepReport,
    _check_positive,
)
from dxopt.natgrad._directions import (
    DirectionSolve,
    gauss_newton_direction,
    kernel_direction,
    spring_direction,
)
from dxopt.natgrad._jacobian import ResidualFunction

__all__ = ["ENGD", "SNG", "SPRING"]


def _capped_step(lr: float, norm_cap: float | None, direction_norm: float) -> float:
    if norm_cap is None or direction_norm == 0.0:
        return lr
    return min(lr, math.sqrt(norm_cap) / direction_norm)


def _capped_update(opt: SNG | SPRING, solve: DirectionSolve, r: torch.Tensor) -> StepReport:
    """Report the solve, take the norm-capped step along its direction, return the report."""
    opt._handle_solve(solve)
    norm = float(torch.linalg.vector_norm(solve.direction))
    eta = _capped_step(opt.lr, opt.norm_cap, norm)
    opt._apply(solve.direction, eta)
    opt.steps += 1
    return StepReport(0.5 * float(r @ r), eta, norm, solve.method, solve.jitter, r.shape[0])


class SNG(NaturalGradientOptimizer):
    """Subsampled natural gradient in kernel (Woodbury) form.

    On the step's rows :math:`S` with residual :math:`r_S` and Jacobian :math:`J_S`,

    .. math::

        d_k = J_S^\\top (J_S J_S^\\top + \\lambda I)^{-1} r_S, \\qquad
        \\theta_{k+1} = \\theta_k - \\eta_k d_k, \\quad
        \\eta_k = \\min(\\eta, \\sqrt{C}/\\|d_k\\|) ,

    the cap applying only when ``norm_cap`` :math:`C` is given. With :math:`\\lambda\\to0` this is
    one sketch-and-project step on :math:`J d = r` (arXiv:2508.21022).

    Args:
        model: module whose parameters are updated in place (float64 recommended).
        residual: ``residual(params, batch) -> (B,)``.
        lr: :math:`\\eta > 0` (default 0.2).
        damping: :math:`\\lambda \\ge 0` (default 1e-3), relative to the residual's scaling.
        norm_cap: :math:`C` or ``None`` for no cap (default ``None``).
        chunk_size, on_fallback: see :class:`NaturalGradientOptimizer`.

    Example:
        >>> import torch
        >>> from dxopt.natgrad import SNG, Poisson2D, tanh_mlp
        >>> problem, model = Poisson2D(), tanh_mlp(2, (16,))
        >>> opt = SNG(model, problem.residual(model), lr=0.5, damping=1e-8, norm_cap=1e-2)
        >>> report = opt.step(problem.sample(64, 16, torch.Generator().manual_seed(0)))
        >>> report.solve_method, report.rows
        ('cholesky', 80)
    """

    def __init__(
        self,
        model: nn.Module,
        residual: ResidualFunction,
        *,
        lr: float = 0.2,
        damping: float = 1e-3,
        norm_cap: float | None = None,
        chunk_size: int | None = None,
        on_fallback: FallbackPolicy = "report",
    ) -> None:
        super().__init__(model, residual, chunk_size=chunk_size, on_fallback=on_fallback)
        self.lr = _check_positive("lr", lr)
        self.damping = _check_positive("damping", damping, allow_zero=True)
        self.norm_cap = None if norm_cap is None else _check_positive("norm_cap", norm_cap)
        self._warn_precision(self.damping, what=type(self).__name__)

    def step(self, batch: Any) -> StepReport:
        """One SNG step on ``batch``; returns its :class:`StepReport`."""
        r, jac = self.residual_and_jacobian(batch)
        solve = kernel_direction(jac, r, damping=self.damping)
        return _capped_update(self, solve, r)


class SPRING(NaturalGradientOptimizer):
    """SPRING: subsampled natural gradient with Kaczmarz-style momentum.

    .. math::

        \\phi_k = \\mu\\phi_{k-1} + J_S^\\top (J_S J_S^\\top + \\lambda I)^{-1}
                 (r_S - \\mu J_S \\phi_{k-1}), \\qquad
        \\theta_{k+1} = \\theta_k - \\min(\\eta, \\sqrt{C}/\\|\\phi_k\\|)\\,\\phi_k ,

    (arXiv:2401.10190, Algorithm 1; accelerated sketch-and-project per arXiv:2508.21022). With
    :math:`\\mu = 0` it is exactly :class:`SNG` with the same ``lr``, ``damping`` and cap.

    Args:
        model: module whose parameters are updated in place (float64 recommended).
        residual: ``residual(params, batch) -> (B,)``.
        lr: :math:`\\eta > 0` (default 0.2).
        damping: :math:`\\lambda \\ge 0` (default 1e-3).
        momentum: :math:`\\mu \\in [0, 1)` (default 0.99).
        norm_cap: :math:`C` (default 1e-3); ``None`` disables the cap.
        chunk_size, on_fallback: see :class:`NaturalGradientOptimizer`.
    """

    def __init__(
        self,
        model: nn.Module,
        residual: ResidualFunction,
        *,
        lr: float = 0.2,
        damping: float = 1e-3,
        momentum: float = 0.99,
        norm_cap: float | None = 1e-3,
        chunk_size: int | None = None,
        on_fallback: FallbackPolicy = "report",
    ) -> None:
        super().__init__(model, residual, chunk_size=chunk_size, on_fallback=on_fallback)
        self.lr = _check_positive("lr", lr)
        self.damping = _check_positive("damping", damping, allow_zero=True)
        momentum = _check_positive("momentum", momentum, allow_zero=True)
        if momentum >= 1:
            raise ValueError(f"momentum: expected a value in [0, 1), got {momentum}.")
        self.momentum = momentum
        self.norm_cap = None if norm_cap is None else _check_positive("norm_cap", norm_cap)
        self._warn_precision(self.damping, what=type(self).__name__)
        self.phi = torch.zeros(self.num_params, dtype=self.dtype)

    def step(self, batch: Any) -> StepReport:
        """One SPRING step on ``batch``; returns its :class:`StepReport`."""
        r, jac = self.residual_and_jacobian(batch)
        solve = spring_direction(jac, r, self.phi, damping=self.damping, momentum=self.momentum)
        self.phi = solve.direction
        return _capped_update(self, solve, r)


class ENGD(NaturalGradientOptimizer):
    """Energy natural gradient descent = full-batch Gauss-Newton with a grid line search.

    .. math::

        d_k = (J^\\top J + \\lambda I)^{+} J^\\top r, \\qquad
        \\theta_{k+1} = \\theta_k - \\eta_k d_k, \\quad
        \\eta_k = \\arg\\min_{\\eta \\in \\{2^{-j}\\}_{j=0}^{m}}
        L(\\theta_k - \\eta d_k)

    (arXiv:2302.13163). With :math:`\\lambda = 0` the direction is the minimum-norm least-squares
    solution (LAPACK ``gelsd``), which on PINNs (Jacobian singular values spanning 1e-17..1)
    is dominated by noise directions, hence a small default damping. Dangel, Müller and
    Zeinhofer (arXiv:2405.15603) report 1e-10 as best on 2D Poisson; from our random
    initialisation (2-32-1 tanh, 1/sqrt(N_b) row scaling) 1e-10 wandered for the first ~40
    steps while 1e-8 reached 2e-5 relative error in 40 steps, so 1e-8 is the default. If no
    grid point lowers the loss the step is rejected (``step_size == 0``).

    ``line_search="grid"`` evaluates all :math:`m+1` step sizes in one vectorised call;
    ``"descending"`` walks :math:`\\eta = 1, 1/2, 1/4, \\dots` and stops at the first rise of the
    loss after a decrease (the grid minimiser whenever the loss profile along :math:`d_k` is
    unimodal), usually after two or three evaluations.

    Args:
        model: module whose parameters are updated in place (float64 recommended).
        residual: ``residual(params, batch) -> (N,)`` (it must support :func:`torch.func.vmap`
            over the parameters for the line search).
        damping: :math:`\\lambda \\ge 0` (default 1e-8).
        grid_size: :math:`m + 1`, the number of step sizes :math:`2^{-j}` (default 31).
        line_search: ``"grid"`` (default) or ``"descending"``.
        damping_floor: if given, the damping follows the loss, Levenberg-Marquardt style
            (:math:`\\lambda_k = \\min(\\lambda, \\max(\\lambda_{\\min}, L(\\theta_k)))`, the
            :math:`\\lambda_k \\propto \\|r_k\\|^2` rule of Yamashita and Fukushima, 2001),
            so it is large far from a fit and small close to one.
        chunk_size, on_fallback: see :class:`NaturalGradientOptimizer`.
    """

    def __init__(
        self,
        model: nn.Module,
        residual: ResidualFunction,
        *,
        damping: float = 1e-8,
        grid_size: int = 31,
        line_search: Literal["grid", "descending"] = "grid",
        damping_floor: float | None = None,
        chunk_size: int | None = None,
        on_fallback: FallbackPolicy = "report",
    ) -> None:
        super().__init__(model, residual, chunk_size=chunk_size, on_fallback=on_fallback)
        self.damping = _check_positive("damping", damping, allow_zero=True)
        if not isinstance(grid_size, int) or grid_size < 1:
            raise ValueError(f"grid_size: expected a positive int, got {grid_size!r}.")
        if line_search not in ("grid", "descending"):
            raise ValueError(f"line_search: expected 'grid' or 'descending', got {line_search!r}.")
        self.line_search = line_search
        self.damping_floor = (
            None if damping_floor is None else _check_positive("damping_floor", damping_floor)
        )
        self.step_sizes = torch.tensor([2.0**-j for j in range(grid_size)], dtype=self.dtype)
        self._warn_precision(self.damping, what=type(self).__name__)

    def _descending_search(self, direction: torch.Tensor, batch: Any, loss0: float) -> float:
        params = self.params()
        offsets, pieces = 0, {}
        for name, p in params.items():
            n = p.numel()
            pieces[name] = direction[offsets : offsets + n].view_as(p)
            offsets += n
        best_eta, best_loss = 0.0, loss0
        for eta in self.step_sizes.tolist():
            r = self.residual({k: p - eta * pieces[k] for k, p in params.items()}, batch)
            loss = 0.5 * float(r @ r)
            if loss < best_loss:
                best_eta, best_loss = eta, loss
            elif best_eta:
                break
        return best_eta

    def _grid_losses(self, direction: torch.Tensor, batch: Any) -> torch.Tensor:
        params = self.params()
        offsets, pieces = 0, {}
        for name, p in params.items():
            n = p.numel()
            pieces[name] = direction[offsets : offsets + n].view_as(p)
            offsets += n
        trial = {
            name: p.unsqueeze(0) - self.step_sizes.view(-1, *([1] * p.ndim)) * pieces[name]
            for name, p in params.items()
        }

        def loss(pp: dict[str, torch.Tensor]) -> torch.Tensor:
            r = self.residual(pp, batch)
            return 0.5 * (r * r).sum()

        return vmap(loss)(trial)

    def step(self, batch: Any) -> StepReport:
        """One ENGD step on the full ``batch``; returns its :class:`StepReport`."""
        r, jac = self.residual_and_jacobian(batch)
        loss = 0.5 * float(r @ r)
        damping = self.damping
        if self.damping_floor is not None:
            damping = min(self.damping, max(self.damping_floor, loss))
        solve = gauss_newton_direction(jac, r, damping=damping)
        self._handle_solve(solve)
        if self.line_search == "descending":
            eta = self._descending_search(solve.direction, batch, loss)
        else:
            losses = self._grid_losses(solve.direction, batch)
            losses = torch.where(torch.isfinite(losses), losses, torch.full_like(losses, math.inf))
            best = int(torch.argmin(losses))
            eta = float(self.step_sizes[best]) if float(losses[best]) < loss else 0.0
        if eta:
            self._apply(solve.direction, eta)
        self.steps += 1
        norm = float(torch.linalg.vector_norm(solve.direction))
        return StepReport(loss, eta, norm, solve.method, solve.jitter, r.shape[0])
