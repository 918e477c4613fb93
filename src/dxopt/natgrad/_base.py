"""Shared machinery of the natural-gradient optimizers: parameters, checks and reports."""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal, NamedTuple

import torch
from torch import nn

from dxopt.natgrad._directions import DirectionSolve
from dxopt.natgrad._jacobian import ResidualFunction, residual_and_jacobian

__all__ = ["CholeskyFallbackError", "NaturalGradientOptimizer", "StepReport"]

FallbackPolicy = Literal["report", "warn", "raise"]


class CholeskyFallbackError(RuntimeError):
    """Raised when the Cholesky factorization of the kernel fails and ``on_fallback="raise"``."""


class StepReport(NamedTuple):
    """What one optimizer step did.

    Attributes:
        loss: :math:`\\tfrac12\\|r\\|^2` on the step's batch *before* the update.
        step_size: the factor :math:`\\eta_k` actually applied to the direction (after the
            norm cap or line search; 0.0 when the step was rejected).
        direction_norm: :math:`\\|d_k\\|_2`.
        solve_method: how the linear system was solved (``"cholesky"``, ``"cholesky+jitter"``,
            ``"eigh-pinv"`` or ``"lstsq"``).
        jitter: diagonal shift added by a fallback beyond the damping.
        rows: number of residual rows used.
    """

    loss: float
    step_size: float
    direction_norm: float
    solve_method: str
    jitter: float
    rows: int

    @property
    def used_fallback(self) -> bool:
        return self.solve_method in ("cholesky+jitter", "eigh-pinv")


def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}.")
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite value {bound}, got {value}.")
    return float(value)


class NaturalGradientOptimizer:
    """Base class: holds the model's trainable parameters and the residual function.

    Args:
        model: the ``nn.Module`` whose trainable parameters are optimized in place.
        residual: ``residual(params, batch) -> (N,)``; the loss is :math:`\\tfrac12\\|r\\|^2`.
        chunk_size: rows differentiated at once when building the Jacobian (bounds memory).
        on_fallback: what to do when the Cholesky factorization fails and a jitter or
            eigendecomposition fallback is used: ``"report"`` (in the :class:`StepReport` and
            the ``fallbacks`` counter), ``"warn"`` (also a ``RuntimeWarning``) or ``"raise"``
            (:class:`CholeskyFallbackError`).
    """

    def __init__(
        self,
        model: nn.Module,
        residual: ResidualFunction,
        *,
        chunk_size: int | None = None,
        on_fallback: FallbackPolicy = "report",
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}.")
        if not callable(residual):
            raise TypeError(
                "residual: expected a callable residual(params, batch) -> 1-D tensor, got "
                f"{type(residual).__name__}."
            )
        if on_fallback not in ("report", "warn", "raise"):
            raise ValueError(
                f"on_fallback: expected 'report', 'warn' or 'raise', got {on_fallback!r}."
            )
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size: expected None or a positive int, got {chunk_size!r}.")
        self.model = model
        self.residual = residual
        self.chunk_size = chunk_size
        self.on_fallback = on_fallback
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named_params:
            raise ValueError("model: has no trainable parameters (requires_grad=True).")
        dtypes = {p.dtype for _, p in self.named_params}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise TypeError(
                f"model: expected all trainable parameters in one floating dtype, got {dtypes}; "
                "convert the model with model.double()."
            )
        self.dtype = next(iter(dtypes))
        self.num_params = sum(p.numel() for _, p in self.named_params)
        self.fallbacks = 0
        self.steps = 0

    def _warn_precision(self, damping: float, *, what: str) -> None:
        eps = torch.finfo(self.dtype).eps
        if self.dtype != torch.float64 and (0 < damping < math.sqrt(eps) or damping == 0):
            warnings.warn(
                f"{what}: damping={damping:g} is below what {self.dtype} resolves "
                f"(sqrt(eps) = {math.sqrt(eps):.1e}); the kernel solve will be dominated by "
                "round-off. Use model.double() (float64, the default for PINNs) or a larger "
                "damping.",
                UserWarning,
                stacklevel=3,
            )

    def params(self) -> dict[str, torch.Tensor]:
        """The current parameters, detached, as a dictionary for ``functional_call``."""
        return {n: p.detach() for n, p in self.named_params}

    def residual_and_jacobian(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r, J)`` at the current parameters on ``batch``."""
        r, jac = residual_and_jacobian(
            self.residual, self.params(), batch, chunk_size=self.chunk_size
        )
        if r.dtype != self.dtype:
            raise TypeError(
                f"residual: returned dtype {r.dtype} but the parameters are {self.dtype}; make "
                "the batch and the residual use the parameters' dtype."
            )
        return r, jac

    def _handle_solve(self, solve: DirectionSolve) -> None:
        if solve.method in ("cholesky", "lstsq"):
            return
        self.fallbacks += 1
        msg = (
            f"Cholesky of the kernel failed at step {self.steps}; solved by {solve.method} "
            f"(extra jitter {solve.jitter:.2e}, relative residual {solve.residual:.2e}). "
            "Increase damping to keep the kernel positive definite."
        )
        if self.on_fallback == "raise":
            raise CholeskyFallbackError(msg)
        if self.on_fallback == "warn":
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    @torch.no_grad()
    def _apply(self, direction: torch.Tensor, step_size: float) -> None:
        offset = 0
        for _, p in self.named_params:
            n = p.numel()
            p.add_(direction[offset : offset + n].view_as(p), alpha=-step_size)
            offset += n

    def step(self, batch: Any) -> StepReport:  # pragma: no cover - abstract
        raise NotImplementedError
