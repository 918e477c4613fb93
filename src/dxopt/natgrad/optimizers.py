"""Subsampled natural gradient (SNG), SPRING and ENGD (full Gauss-Newton) optimizers.

All three minimize :math:`L(\\theta) = \\tfrac12\\|r(\\theta)\\|^2` for a residual function
``residual(params, batch)`` and update the model's parameters in place with
``report = opt.step(batch)``, or, as any :class:`torch.optim.Optimizer`, with
``report = opt.step(closure)`` where ``closure()`` returns the residual vector with its graph.
SNG and SPRING take a (sub)sampled batch of rows each step; ENGD takes the full batch and
picks its step by a line search. Hyperparameters live in ``param_groups[0]`` (LR schedulers,
``state_dict``); SPRING's momentum is in ``state[p]["momentum_buffer"]``.

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
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import nn
from torch.func import vmap

from dxopt._core import Cost, check_choice, check_int, check_range, renamed_kwargs
from dxopt.natgrad._base import (
    FailurePolicy,
    NaturalGradientOptimizer,
    StepReport,
    _Rows,
    _split,
    check_hyper,
)
from dxopt.natgrad._directions import (
    DirectionSolve,
    gauss_newton_direction,
    kernel_direction,
    spring_direction,
)
from dxopt.natgrad._jacobian import ResidualFunction

__all__ = ["ENGD", "SNG", "SPRING"]

Params = nn.Module | Iterable[Any]


def _capped_step(lr: float, norm_cap: float | None, direction_norm: float) -> float:
    if norm_cap is None or direction_norm == 0.0:
        return lr
    return min(lr, math.sqrt(norm_cap) / direction_norm)


def _capped_update(opt: SNG | SPRING, rows: _Rows, solve: DirectionSolve) -> StepReport:
    """Report the solve, take the norm-capped step along its direction, return the report."""
    status = opt._handle_solve(solve)
    norm = float(torch.linalg.vector_norm(solve.direction))
    eta = _capped_step(opt._hyper("lr"), opt._hyper("norm_cap"), norm)
    opt._apply(rows.params, solve.direction, eta)
    opt._finish()
    r = rows.r
    cost = Cost(rows=r.shape[0])
    return StepReport(0.5 * float(r @ r), eta, norm, solve.method, solve.jitter, status, cost)


_CLOSURE_DOC = """
        Args:
            closure: either a callable with no arguments returning the residual vector
                :math:`r` (1-D, with its autograd graph through the parameters), as a torch
                closure returns the loss; or a batch for the ``residual`` function given at
                construction (the batch API; ``None`` is passed on as the batch).

        Returns:
            The :class:`StepReport` (its ``loss`` is :math:`\\tfrac12\\|r\\|^2` before
            the update).
"""


@renamed_kwargs(on_fallback="on_failure", model="params")
class SNG(NaturalGradientOptimizer):
    """Subsampled natural gradient in kernel (Woodbury) form.

    On the step's rows :math:`S` with residual :math:`r_S` and Jacobian :math:`J_S`,

    .. math::

        d_k = J_S^\\top (J_S J_S^\\top + \\lambda I)^{-1} r_S, \\qquad
        \\theta_{k+1} = \\theta_k - \\eta_k d_k, \\quad
        \\eta_k = \\min(\\eta, \\sqrt{C}/\\|d_k\\|) ,

    the cap applying only when ``norm_cap`` :math:`C` is given. With :math:`\\lambda\\to0` this
    is one sketch-and-project step on :math:`J d = r` (arXiv:2508.21022).

    Args:
        params: the ``nn.Module`` whose trainable parameters are updated in place (float64
            recommended), or an iterable of parameters (closure steps only).
        residual: ``residual(params, batch) -> (B,)`` for batch steps, or ``None``.
        lr: :math:`\\eta > 0` (default 0.2).
        damping: :math:`\\lambda \\ge 0` (default 1e-3), relative to the residual's scaling.
        norm_cap: :math:`C` or ``None`` for no cap (default ``None``).
        chunk_size, on_failure: see :class:`NaturalGradientOptimizer` (``on_fallback`` is the
            deprecated name of ``on_failure``).

    Example:
        >>> import torch
        >>> from dxopt.natgrad import SNG, Poisson2D, tanh_mlp
        >>> problem, model = Poisson2D(), tanh_mlp(2, (16,))
        >>> opt = SNG(model, problem.residual(model), lr=0.5, damping=1e-8, norm_cap=1e-2)
        >>> report = opt.step(problem.sample(64, 16, torch.Generator().manual_seed(0)))
        >>> report.solve_method, report.cost.rows
        ('cholesky', 80)
    """

    def __init__(
        self,
        params: Params,
        residual: ResidualFunction | None = None,
        *,
        lr: float = 0.2,
        damping: float = 1e-3,
        norm_cap: float | None = None,
        chunk_size: int | None = None,
        on_failure: FailurePolicy = "ignore",
    ) -> None:
        defaults = {
            "lr": check_hyper("lr", lr),
            "damping": check_hyper("damping", damping, allow_zero=True),
            "norm_cap": None if norm_cap is None else check_hyper("norm_cap", norm_cap),
        }
        super().__init__(params, residual, defaults, chunk_size=chunk_size, on_failure=on_failure)
        self._warn_precision(self._hyper("damping"), what=type(self).__name__)

    def step(self, closure: Any = None) -> StepReport:  # type: ignore[override]
        """One SNG step."""
        with self._one_batch():
            rows = self._rows(closure)
        solve = kernel_direction(rows.jac, rows.r, damping=self._hyper("damping"))
        return _capped_update(self, rows, solve)

    step.__doc__ = (step.__doc__ or "") + _CLOSURE_DOC


@renamed_kwargs(on_fallback="on_failure", model="params")
class SPRING(NaturalGradientOptimizer):
    """SPRING: subsampled natural gradient with Kaczmarz-style momentum.

    .. math::

        \\phi_k = \\mu\\phi_{k-1} + J_S^\\top (J_S J_S^\\top + \\lambda I)^{-1}
                 (r_S - \\mu J_S \\phi_{k-1}), \\qquad
        \\theta_{k+1} = \\theta_k - \\min(\\eta, \\sqrt{C}/\\|\\phi_k\\|)\\,\\phi_k ,

    (arXiv:2401.10190, Algorithm 1; accelerated sketch-and-project per arXiv:2508.21022). With
    :math:`\\mu = 0` it is exactly :class:`SNG` with the same ``lr``, ``damping`` and cap.
    :math:`\\phi` is kept per parameter in ``state[p]["momentum_buffer"]``, so it is saved
    and restored by ``state_dict`` / ``load_state_dict``.

    Args:
        params: the ``nn.Module`` whose trainable parameters are updated in place (float64
            recommended), or an iterable of parameters (closure steps only).
        residual: ``residual(params, batch) -> (B,)`` for batch steps, or ``None``.
        lr: :math:`\\eta > 0` (default 0.5).
        damping: :math:`\\lambda \\ge 0` (default 1e-3).
        momentum: :math:`\\mu \\in [0, 1)` (default 0.9).
        norm_cap: :math:`C` (default 1.0); ``None`` disables the cap.
        chunk_size, on_failure: see :class:`NaturalGradientOptimizer`.

    Choosing them: the defaults (:math:`\\eta = 0.5, \\lambda = 10^{-3}, \\mu = 0.9,
    C = 1`) were the most robust of a 54-point grid over three seeds on the 1-D Poisson PINN
    (32 + 2 fresh points, 50 steps: median relative L2 2.9e-4) that also holds on the 2-D one
    (64 + 16 points, 100 steps: 4.6e-4), ``python -m benchmarks.natgrad.hyperparameters
    --part spring``. The VMC values :math:`\\mu = 0.99, C = 10^{-2}` with
    :math:`\\lambda = 10^{-8}` left the 1-D PINN at relative L2 1.0 after 50 steps: a
    momentum near 1 pays off only over thousands of steps (the 60 s benchmark, ``dxopt bench
    natgrad``, uses :math:`\\mu = 0.99, \\lambda = 10^{-10}` with a decaying ``lr``), and a
    cap as small as :math:`10^{-2}` stalls every short run. Raise ``damping`` when the
    fallback counter grows or the error jumps between steps (rows are noisy or few); lower it
    (towards 1e-8, float64 only) and raise ``momentum`` for long runs aiming below 1e-6;
    ``damping`` is relative to the residual's scaling (:math:`1/\\sqrt{N_b}` rows here).
    """

    def __init__(
        self,
        params: Params,
        residual: ResidualFunction | None = None,
        *,
        lr: float = 0.5,
        damping: float = 1e-3,
        momentum: float = 0.9,
        norm_cap: float | None = 1.0,
        chunk_size: int | None = None,
        on_failure: FailurePolicy = "ignore",
    ) -> None:
        defaults = {
            "lr": check_hyper("lr", lr),
            "damping": check_hyper("damping", damping, allow_zero=True),
            "momentum": check_range("momentum", momentum, 0, 1),
            "norm_cap": None if norm_cap is None else check_hyper("norm_cap", norm_cap),
        }
        super().__init__(params, residual, defaults, chunk_size=chunk_size, on_failure=on_failure)
        self._warn_precision(self._hyper("damping"), what=type(self).__name__)

    @property
    def phi(self) -> torch.Tensor:
        """The momentum :math:`\\phi` over the trainable parameters, flattened (a copy)."""
        pieces = []
        for p in self._trainable():
            buf = self.state[p].get("momentum_buffer")
            pieces.append(
                torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                if buf is None
                else buf.reshape(-1)
            )
        return torch.cat(pieces)

    def step(self, closure: Any = None) -> StepReport:  # type: ignore[override]
        """One SPRING step."""
        with self._one_batch():
            rows = self._rows(closure)
        solve = spring_direction(
            rows.jac,
            rows.r,
            self.phi,
            damping=self._hyper("damping"),
            momentum=self._hyper("momentum"),
        )
        for p, piece in zip(rows.params, _split(solve.direction, rows.params)):
            self.state[p]["momentum_buffer"] = piece.detach().clone()
        return _capped_update(self, rows, solve)

    step.__doc__ = (step.__doc__ or "") + _CLOSURE_DOC


@renamed_kwargs(on_fallback="on_failure", grid_size="line_search_max_iter", model="params")
class ENGD(NaturalGradientOptimizer):
    """Energy natural gradient descent = full-batch Gauss-Newton with a grid line search.

    .. math::

        d_k = (J^\\top J + \\lambda I)^{+} J^\\top r, \\qquad
        \\theta_{k+1} = \\theta_k - \\eta_k d_k, \\quad
        \\eta_k = \\arg\\min_{\\eta \\in \\{2^{-j}\\}_{j=0}^{m}}
        L(\\theta_k - \\eta d_k)

    (arXiv:2302.13163). With :math:`\\lambda = 0` the direction is the minimum-norm
    least-squares solution (LAPACK ``gelsd``), which on PINNs (Jacobian singular values
    spanning 1e-17..1) is dominated by noise directions. The default :math:`\\lambda =
    10^{-4}` is the one that does not overfit: on plain regression (a 1-32-1 tanh network
    fitted to 64 noisy samples, residual ``model(x) - y``) 1e-8 reached test MSE 0.25 after
    100 steps (it interpolates the noise), 1e-4 2.5e-3, Adam 9.7e-4; on the 1-D / 2-D Poisson
    PINNs 1e-4 reached 5.0e-5 / 4.8e-4 relative L2 in 30 steps (medians of three seeds,
    ``python -m benchmarks.natgrad.hyperparameters --part engd``). Lower it when the rows
    are exact and the target accuracy is high: PINNs on fixed collocation points reach 1e-6
    and below only with 1e-6..1e-8 (the README and the benchmark use 1e-8; Dangel, Müller and
    Zeinhofer, arXiv:2405.15603, report 1e-10 as best on 2D Poisson); keep or raise it for
    noisy data or few rows per parameter. If no grid point lowers the loss the step is
    rejected (``step_size == 0``).

    ``line_search="grid"`` evaluates all :math:`m+1` step sizes (in one vectorised call for
    batch steps); ``"descending"`` walks :math:`\\eta = 1, 1/2, 1/4, \\dots` and stops at the
    first rise of the loss after a decrease (the grid minimiser whenever the loss profile
    along :math:`d_k` is unimodal), usually after two or three evaluations.

    Args:
        params: the ``nn.Module`` whose trainable parameters are updated in place (float64
            recommended), or an iterable of parameters (closure steps only).
        residual: ``residual(params, batch) -> (N,)`` (it must support
            :func:`torch.func.vmap` over the parameters for the batch grid search), or
            ``None``.
        lr: a factor on the line-search step (default 1.0, which LR schedulers may lower).
        damping: :math:`\\lambda \\ge 0` (default 1e-4; see above for when to change it).
        line_search_max_iter: :math:`m + 1`, the number of step sizes :math:`2^{-j}` tried
            at most (default 31; ``grid_size`` before 0.2).
        line_search: ``"grid"`` (default) or ``"descending"``.
        damping_floor: if given, the damping follows the loss, Levenberg-Marquardt style
            (:math:`\\lambda_k = \\min(\\lambda, \\max(\\lambda_{\\min}, L(\\theta_k)))`, the
            :math:`\\lambda_k \\propto \\|r_k\\|^2` rule of Yamashita and Fukushima, 2001),
            so it is large far from a fit and small close to one.
        chunk_size, on_failure: see :class:`NaturalGradientOptimizer`.
    """

    def __init__(
        self,
        params: Params,
        residual: ResidualFunction | None = None,
        *,
        lr: float = 1.0,
        damping: float = 1e-4,
        line_search_max_iter: int = 31,
        line_search: Literal["grid", "descending"] = "grid",
        damping_floor: float | None = None,
        chunk_size: int | None = None,
        on_failure: FailurePolicy = "ignore",
    ) -> None:
        defaults = {
            "lr": check_hyper("lr", lr),
            "damping": check_hyper("damping", damping, allow_zero=True),
            "line_search_max_iter": check_int("line_search_max_iter", line_search_max_iter),
            "line_search": check_choice("line_search", line_search, ("grid", "descending")),
            "damping_floor": (
                None if damping_floor is None else check_hyper("damping_floor", damping_floor)
            ),
        }
        super().__init__(params, residual, defaults, chunk_size=chunk_size, on_failure=on_failure)
        self._warn_precision(self._hyper("damping"), what=type(self).__name__)

    def _step_sizes(self) -> list[float]:
        lr = self._hyper("lr")
        return [lr * 2.0**-j for j in range(self._hyper("line_search_max_iter"))]

    def _descending_search(
        self, rows: _Rows, direction: torch.Tensor, loss0: float
    ) -> tuple[float, int]:
        best_eta, best_loss, evaluations = 0.0, loss0, 0
        for eta in self._step_sizes():
            (loss,) = self._loss_at(rows, direction, [eta])
            evaluations += 1
            if loss < best_loss:
                best_eta, best_loss = eta, loss
            elif best_eta:
                break
        return best_eta, evaluations

    def _grid_losses(self, rows: _Rows, direction: torch.Tensor) -> torch.Tensor:
        etas = self._step_sizes()
        if rows.closure is not None:
            return torch.tensor(self._loss_at(rows, direction, etas), dtype=torch.float64)
        assert self.residual is not None and rows.names is not None
        residual, batch = self.residual, rows.batch
        steps = torch.tensor(etas, dtype=self.dtype, device=rows.r.device)
        trial = {
            name: p.detach().unsqueeze(0) - steps.view(-1, *([1] * p.ndim)) * d
            for name, p, d in zip(rows.names, rows.params, _split(direction, rows.params))
        }

        def loss(pp: dict[str, torch.Tensor]) -> torch.Tensor:
            r = residual(pp, batch)
            return 0.5 * (r * r).sum()

        try:
            losses = self._evaluate(lambda: vmap(loss)(trial))
        except RuntimeError as err:
            raise ValueError(
                f"residual: the grid line search evaluates it at all {len(etas)} step sizes "
                "in one torch.func.vmap call over the parameters, and under vmap it failed "
                f"({err}). Make it vmappable (no .item(), no data-dependent Python control "
                "flow, no in-place writes to captured tensors), or use "
                "line_search='descending', which evaluates one step size at a time."
            ) from err
        return losses.detach()

    def step(self, closure: Any = None) -> StepReport:  # type: ignore[override]
        """One ENGD step on the full batch: every line-search evaluation sees the batch (RNG
        state) of the first one and leaves module buffers as it did (see
        :class:`NaturalGradientOptimizer`)."""
        with self._one_batch():
            rows = self._rows(closure)
            r = rows.r
            loss = 0.5 * float(r @ r)
            damping = self._hyper("damping")
            floor = self._hyper("damping_floor")
            if floor is not None:
                damping = min(damping, max(floor, loss))
            solve = gauss_newton_direction(rows.jac, r, damping=damping)
            status = self._handle_solve(solve)
            if self._hyper("line_search") == "descending":
                eta, evaluations = self._descending_search(rows, solve.direction, loss)
            else:
                losses = self._grid_losses(rows, solve.direction)
                evaluations = losses.shape[0]
                finite = torch.isfinite(losses)
                losses = torch.where(finite, losses, torch.full_like(losses, math.inf))
                best = int(torch.argmin(losses))
                eta = self._step_sizes()[best] if float(losses[best]) < loss else 0.0
        if eta:
            self._apply(rows.params, solve.direction, eta)
        self._finish()
        norm = float(torch.linalg.vector_norm(solve.direction))
        cost = Cost(rows=r.shape[0], forwards=evaluations)
        return StepReport(loss, eta, norm, solve.method, solve.jitter, status, cost)

    step.__doc__ = (step.__doc__ or "") + _CLOSURE_DOC
