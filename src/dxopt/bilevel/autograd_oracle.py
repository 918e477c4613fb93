r"""Oracles built by ``torch.func`` from plain upper- and lower-level functions.

Given scalar functions ``upper(x, y)`` = :math:`f` and ``lower(x, y)`` = :math:`g` on flat
vectors, :class:`AutogradOracle` provides the four counted oracles by reverse mode
(gradients) and forward-over-reverse mode (second-order products):

.. math::

    \nabla^2_{yy} g\, v = \partial_t \nabla_y g(x, y + t v)\big|_{t=0}, \qquad
    \nabla^2_{xy} g\, v = \partial_t \nabla_x g(x, y + t v)\big|_{t=0}.

The exact hypergradient (evaluation only) solves the lower level by damped Newton with the
dense Hessian and then the adjoint system by Cholesky, so it suits ``dim_y`` up to a few
thousand.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import grad, hessian, jacrev, jvp

__all__ = ["AutogradOracle"]

ScalarFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cholesky_or_raise(H: torch.Tensor, where: str) -> torch.Tensor:
    L, info = torch.linalg.cholesky_ex(H)
    if int(info) != 0:
        lam_min = float(torch.linalg.eigvalsh(0.5 * (H + H.T))[0])
        raise ValueError(
            f"lower: expected g(x, .) strongly convex in y, but its Hessian at {where} has "
            f"smallest eigenvalue {lam_min:.3e}; add a ridge term (mu/2)||y||^2 to the lower "
            "level or reformulate it."
        )
    return L


class AutogradOracle:
    """First-order bilevel oracles from ``upper(x, y)`` and ``lower(x, y)`` by autograd.

    Args:
        upper: :math:`f(x, y)`, returning a scalar tensor.
        lower: :math:`g(x, y)`, returning a scalar tensor, strongly convex in ``y``.
        dim_x: length of ``x``.
        dim_y: length of ``y``.
        dtype: floating dtype of ``x`` and ``y`` (default float64).
        check_strong_convexity: factor :math:`\nabla^2_{yy} g(0, 0)` once at construction
            (cheap for ``dim_y`` up to a few thousand) and refuse a lower level that is not
            strongly convex there.

    Raises:
        TypeError: if ``upper``/``lower`` are not callable or ``dtype`` is not floating.
        ValueError: for non-positive dimensions, functions that do not return a scalar at
            zero inputs of the stated sizes, or a lower level that is not strongly convex.
    """

    def __init__(
        self,
        upper: ScalarFn,
        lower: ScalarFn,
        *,
        dim_x: int,
        dim_y: int,
        dtype: torch.dtype = torch.float64,
        check_strong_convexity: bool = True,
    ) -> None:
        for name, fn in (("upper", upper), ("lower", lower)):
            if not callable(fn):
                raise TypeError(f"{name}: expected a callable (x, y) -> scalar tensor, got {fn!r}.")
        if dim_x < 1 or dim_y < 1:
            raise ValueError(f"dim_x, dim_y: expected positive sizes, got {dim_x}, {dim_y}.")
        if not dtype.is_floating_point:
            raise TypeError(f"dtype: expected a floating dtype such as float64, got {dtype}.")
        self.upper, self.lower = upper, lower
        self.dim_x, self.dim_y, self.dtype = dim_x, dim_y, dtype
        x0 = torch.zeros(dim_x, dtype=dtype)
        y0 = torch.zeros(dim_y, dtype=dtype)
        for name, fn in (("upper", upper), ("lower", lower)):
            try:
                out = fn(x0, y0)
            except (RuntimeError, IndexError) as err:
                raise ValueError(
                    f"{name}: calling it with x of shape ({dim_x},) and y of shape ({dim_y},) "
                    f"failed ({err}); check dim_x and dim_y."
                ) from err
            if not isinstance(out, torch.Tensor) or out.numel() != 1:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(
                    f"{name}: expected a scalar tensor for x of shape ({dim_x},) and y of shape "
                    f"({dim_y},), got {shape}; reduce it with .sum() or .mean()."
                )
        self._grad_f = grad(upper, argnums=(0, 1))
        self._grad_g = grad(lower, argnums=(0, 1))
        self._grad_g_x = grad(lower, argnums=0)
        self._grad_g_y = grad(lower, argnums=1)
        self._y_star: torch.Tensor | None = None
        if check_strong_convexity:
            _cholesky_or_raise(hessian(lower, argnums=1)(x0, y0), "x = 0, y = 0")

    def grad_f(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gx, gy = self._grad_f(x, y)
        return gx, gy

    def grad_g(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gx, gy = self._grad_g(x, y)
        return gx, gy

    def hvp_yy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return jvp(lambda t: self._grad_g_y(x, t), (y,), (v,))[1]

    def jvp_xy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return jvp(lambda t: self._grad_g_x(x, t), (y,), (v,))[1]

    def upper_value(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(self.upper(x, y))

    def lower_solution(self, x: torch.Tensor, *, tol: float = 1e-12, max_iter: int = 100):
        """:math:`y^*(x)` by damped Newton from the previous solution (not counted)."""
        y = torch.zeros(self.dim_y, dtype=self.dtype) if self._y_star is None else self._y_star
        for _ in range(max_iter):
            gy = self._grad_g_y(x, y)
            if float(torch.linalg.vector_norm(gy)) <= tol * max(1.0, float(y.abs().max())):
                break
            L = _cholesky_or_raise(hessian(self.lower, argnums=1)(x, y), "the current x")
            step = torch.cholesky_solve(gy.unsqueeze(-1), L).squeeze(-1)
            t, g0, slope = 1.0, float(self.lower(x, y)), float(gy @ step)
            while float(self.lower(x, y - t * step)) > g0 - 0.25 * t * slope and t > 1e-8:
                t *= 0.5
            y = y - t * step
        self._y_star = y
        return y

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        r""":math:`\nabla H(x)` from :math:`y^*(x)` and dense solves (not counted)."""
        y = self.lower_solution(x)
        fx, fy = self._grad_f(x, y)
        L = _cholesky_or_raise(hessian(self.lower, argnums=1)(x, y), "y*(x)")
        cross = jacrev(self._grad_g_x, argnums=1)(x, y)  # (dim_x, dim_y) = d^2 g / dx dy
        v = torch.cholesky_solve(fy.unsqueeze(-1), L).squeeze(-1)
        return fx - cross @ v
