r"""Oracles built by ``torch.autograd`` from plain upper- and lower-level functions.

Given scalar functions ``upper(x, y)`` = :math:`f` and ``lower(x, y)`` = :math:`g` on flat
vectors, :class:`AutogradOracle` provides the four counted oracles by reverse mode
(gradients) and reverse-over-reverse mode (second-order products, one double backward each):

.. math::

    \nabla^2_{yy} g\, v = \partial_t \nabla_y g(x, y + t v)\big|_{t=0}, \qquad
    \nabla^2_{xy} g\, v = \partial_t \nabla_x g(x, y + t v)\big|_{t=0}.

The exact hypergradient (evaluation only) solves the lower level by damped Newton-CG and
then the adjoint system :math:`\nabla^2_{yy} g\, v = \nabla_y f` by conjugate gradients
(:func:`dxopt.linalg.conjugate_gradient`) on Hessian-vector products, so nothing of size
``dim_y**2`` is ever built; it refuses (``NotConvergedError``) rather than return an inaccurate
reference. ``dense_hessian=True`` switches construction check and evaluation to the dense
Hessian (``dim_y`` double-backward rows, Cholesky), for small problems or a cross-check.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dxopt._core import NotConvergedError, Status, check_callable, check_int
from dxopt.linalg import conjugate_gradient

__all__ = ["AutogradOracle"]

_PROBE_ITERS = 20  # CG iterations of the matrix-free strong-convexity probe

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
        check_strong_convexity: at construction, probe :math:`\nabla^2_{yy} g(0, 0)` and refuse
            a lower level that is not strongly convex there: by default a few CG iterations on
            Hessian-vector products that fail on a direction of non-positive curvature (cheap,
            a probe rather than a proof), with ``dense_hessian`` a Cholesky factorization.
        dense_hessian: build the dense Hessian for the construction check and the exact
            hypergradient (``dim_y`` double backwards each time; off by default).

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
        dense_hessian: bool = False,
    ) -> None:
        for name, fn in (("upper", upper), ("lower", lower)):
            check_callable(name, fn, signature="(x, y) -> scalar tensor")
        check_int("dim_x", dim_x)
        check_int("dim_y", dim_y)
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
        self.dense_hessian = dense_hessian
        if check_strong_convexity:
            if dense_hessian:
                _cholesky_or_raise(self.dense_second_derivatives(x0, y0)[0], "x = 0, y = 0")
            else:
                self._probe_convexity(x0, y0)

    def _hvp_operator(self, x: torch.Tensor, y: torch.Tensor):
        """``v -> H v`` at ``(x, y)``, the gradient graph built once and reused."""
        with torch.enable_grad():
            xl, yl = self._leaves(x, y)
            gy = self._lower_grad_y(xl, yl)

        def matvec(v: torch.Tensor) -> torch.Tensor:
            if not gy.requires_grad:  # g is linear in y: zero Hessian
                return torch.zeros_like(v)
            with torch.enable_grad():
                (out,) = torch.autograd.grad(
                    gy, yl, grad_outputs=v, retain_graph=True, allow_unused=True
                )
            return torch.zeros_like(v) if out is None else out.detach()  # None: zero curvature

        return matvec

    def _probe_convexity(self, x: torch.Tensor, y: torch.Tensor) -> None:
        b = torch.randn(self.dim_y, generator=torch.Generator().manual_seed(0), dtype=self.dtype)
        result = conjugate_gradient(
            self._hvp_operator(x, y),
            b,
            rtol=1e-8,
            max_iter=min(self.dim_y, _PROBE_ITERS),
            check_residual=False,
        )
        if result.status is Status.FAILED:
            raise ValueError(
                "lower: expected g(x, .) strongly convex in y, but its Hessian at x = 0, y = 0 "
                "has a direction of non-positive curvature; add a ridge term (mu/2)||y||^2 to "
                "the lower level or reformulate it."
            )

    def _solve(self, x: torch.Tensor, y: torch.Tensor, b: torch.Tensor, rtol: float, what: str):
        result = conjugate_gradient(
            self._hvp_operator(x, y), b, rtol=rtol, max_iter=10 * self.dim_y + 10
        )
        if result.status is not Status.SOLVED:
            raise NotConvergedError(
                f"AutogradOracle: the {what} solve by CG stopped with status "
                f"{result.status.value} (residual {result.residual_norm:.3e}); the lower level "
                "may not be strongly convex here, or pass dense_hessian=True.",
                status=result.status,
            )
        return result.x

    @staticmethod
    def _leaves(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.detach().requires_grad_(True), y.detach().requires_grad_(True)

    def _lower_grad_y(self, xl: torch.Tensor, yl: torch.Tensor) -> torch.Tensor:
        """:math:`\nabla_y g` with its graph (call under ``enable_grad``); a lower level that
        does not read ``y`` gives zeros (no graph), so its zero curvature reaches the
        strong-convexity checks instead of a raw autograd error."""
        out = self.lower(xl, yl)
        if not out.requires_grad:
            return torch.zeros_like(yl)
        (gy,) = torch.autograd.grad(out, yl, create_graph=True, allow_unused=True)
        return torch.zeros_like(yl) if gy is None else gy

    def _gradients(self, fn: ScalarFn, x: torch.Tensor, y: torch.Tensor):
        with torch.enable_grad():
            xl, yl = self._leaves(x, y)
            out = fn(xl, yl)
            if not out.requires_grad:  # a constant: both gradients vanish
                return torch.zeros_like(x), torch.zeros_like(y)
            gx, gy = torch.autograd.grad(out, (xl, yl), allow_unused=True)
        gx = torch.zeros_like(x) if gx is None else gx
        gy = torch.zeros_like(y) if gy is None else gy
        return gx, gy

    def _second_order(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, wrt_x: bool):
        with torch.enable_grad():
            xl, yl = self._leaves(x, y)
            gy = self._lower_grad_y(xl, yl)
            target = xl if wrt_x else yl
            if not gy.requires_grad:  # g is linear in y: both products vanish
                return torch.zeros_like(target).detach()
            (out,) = torch.autograd.grad(gy, target, grad_outputs=v, allow_unused=True)
        return torch.zeros_like(target) if out is None else out.detach()

    def dense_second_derivatives(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Dense :math:`\nabla^2_{yy} g` ``(m, m)`` and :math:`\nabla^2_{xy} g` ``(n, m)``
        (not counted; for evaluation and the lower-level check)."""
        with torch.enable_grad():
            xl, yl = self._leaves(x, y)
            gy = self._lower_grad_y(xl, yl)
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

    @property
    def _accuracy(self) -> float:
        """The tightest relative tolerance the dtype supports: 1e-12 in float64."""
        return max(1e-12, 100 * torch.finfo(self.dtype).eps)

    def lower_solution(
        self, x: torch.Tensor, *, tol: float | None = None, max_iter: int = 100
    ) -> torch.Tensor:
        """:math:`y^*(x)` by damped Newton (Newton-CG unless ``dense_hessian``) from the
        previous solution (not counted); ``tol`` defaults to 1e-12 in float64 (100 machine
        epsilons in lower precision)."""
        tol = self._accuracy if tol is None else tol
        y = torch.zeros(self.dim_y, dtype=self.dtype) if self._y_star is None else self._y_star
        for _ in range(max_iter):
            gy = self._gradients(self.lower, x, y)[1]
            gnorm = float(torch.linalg.vector_norm(gy))
            if gnorm <= tol * max(1.0, float(y.abs().max())):
                break
            if self.dense_hessian:
                L = _cholesky_or_raise(self.dense_second_derivatives(x, y)[0], "the current x")
                step = torch.cholesky_solve(gy.unsqueeze(-1), L).squeeze(-1)
            else:  # inexact Newton: forcing term min(0.1, sqrt(||g||)), superlinear near y*
                forcing = min(0.1, max(gnorm**0.5, self._accuracy))
                step = self._solve(x, y, gy, forcing, "Newton step")
            t, g0, slope = 1.0, float(self.lower(x, y)), float(gy @ step)
            while float(self.lower(x, y - t * step)) > g0 - 0.25 * t * slope and t > 1e-8:
                t *= 0.5
            y = y - t * step
        self._y_star = y
        return y

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        r""":math:`\nabla H(x)` from :math:`y^*(x)` and a CG adjoint solve to ``rtol = 1e-12``
        in float64 (dense Cholesky with ``dense_hessian``); not counted."""
        y = self.lower_solution(x)
        fx, fy = self.grad_f(x, y)
        if not self.dense_hessian:
            v = self._solve(x, y, fy, self._accuracy, "adjoint")
            return fx - self.jvp_xy(x, y, v)
        H_yy, cross = self.dense_second_derivatives(x, y)
        L = _cholesky_or_raise(H_yy, "y*(x)")
        v = torch.cholesky_solve(fy.unsqueeze(-1), L).squeeze(-1)
        return fx - cross @ v
