r"""Oracles built by ``torch.autograd`` from plain upper- and lower-level functions.

Given scalar functions ``upper(x, y)`` = :math:`f` and ``lower(x, y)`` = :math:`g` on flat
vectors, :class:`AutogradOracle` provides the four counted oracles by reverse mode
(gradients) and reverse-over-reverse mode (second-order products, one double backward each):

.. math::

    \nabla^2_{yy} g\, v = \partial_t \nabla_y g(x, y + t v)\big|_{t=0}, \qquad
    \nabla^2_{xy} g\, v = \partial_t \nabla_x g(x, y + t v)\big|_{t=0}.

The exact hypergradient (evaluation only) solves the lower level by damped Newton with the
dense Hessian (``dim_y`` double-backward rows) and then the adjoint system by Cholesky, so it suits
``dim_y`` up to a few thousand.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

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
        self._y_star: torch.Tensor | None = None
        if check_strong_convexity:
            _cholesky_or_raise(self.dense_second_derivatives(x0, y0)[0], "x = 0, y = 0")

    @staticmethod
    def _leaves(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.detach().requires_grad_(True), y.detach().requires_grad_(True)

    def _gradients(self, fn: ScalarFn, x: torch.Tensor, y: torch.Tensor):
        with torch.enable_grad():
            xl, yl = self._leaves(x, y)
            gx, gy = torch.autograd.grad(fn(xl, yl), (xl, yl), allow_unused=True)
        gx = torch.zeros_like(x) if gx is None else gx
        gy = torch.zeros_like(y) if gy is None else gy
        return gx, gy

    def _second_order(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, wrt_x: bool):
        with torch.enable_grad():
            xl, yl = self._leaves(x, y)
            (gy,) = torch.autograd.grad(self.lower(xl, yl), yl, create_graph=True)
            target = xl if wrt_x else yl
            (out,) = torch.autograd.grad(gy, target, grad_outputs=v, allow_unused=True)
        return torch.zeros_like(target) if out is None else out.detach()

    def dense_second_derivatives(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Dense :math:`\nabla^2_{yy} g` ``(m, m)`` and :math:`\nabla^2_{xy} g` ``(n, m)``
        (not counted; for evaluation and the lower-level check)."""
        with torch.enable_grad():
            xl, yl = self._leaves(x, y)
            (gy,) = torch.autograd.grad(self.lower(xl, yl), yl, create_graph=True)
            rows_y, rows_x = [], []
            for i in range(self.dim_y):
                if not gy[i].requires_grad:  # g is linear in this coordinate
                    rows_y.append(torch.zeros_like(y))
                    rows_x.append(torch.zeros_like(x))
                    continue
                dx, dy = torch.autograd.grad(gy[i], (xl, yl), retain_graph=True, allow_unused=True)
                rows_y.append(torch.zeros_like(y) if dy is None else dy)
                rows_x.append(torch.zeros_like(x) if dx is None else dx)
        return torch.stack(rows_y).detach(), torch.stack(rows_x, dim=1).detach()

    def grad_f(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gradients(self.upper, x, y)

    def grad_g(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gradients(self.lower, x, y)

    def hvp_yy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._second_order(x, y, v, wrt_x=False)

    def jvp_xy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        r""":math:`\nabla^2_{xy} g\, v = \nabla_x (\nabla_y g \cdot v)`."""
        return self._second_order(x, y, v, wrt_x=True)

    def upper_value(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(self.upper(x, y))

    def lower_solution(
        self, x: torch.Tensor, *, tol: float = 1e-12, max_iter: int = 100
    ) -> torch.Tensor:
        """:math:`y^*(x)` by damped Newton from the previous solution (not counted)."""
        y = torch.zeros(self.dim_y, dtype=self.dtype) if self._y_star is None else self._y_star
        for _ in range(max_iter):
            gy = self._gradients(self.lower, x, y)[1]
            if float(torch.linalg.vector_norm(gy)) <= tol * max(1.0, float(y.abs().max())):
                break
            L = _cholesky_or_raise(self.dense_second_derivatives(x, y)[0], "the current x")
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
        fx, fy = self.grad_f(x, y)
        H_yy, cross = self.dense_second_derivatives(x, y)
        L = _cholesky_or_raise(H_yy, "y*(x)")
        v = torch.cholesky_solve(fy.unsqueeze(-1), L).squeeze(-1)
        return fx - cross @ v
