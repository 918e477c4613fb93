r"""Quadratic bilevel problems with closed-form oracles and hypergradient.

.. math::

    g(x, y) = \tfrac12 y^\top Q y + y^\top P x + q^\top y, \qquad
    f(x, y) = \tfrac12 x^\top F_{xx} x + y^\top F_{yx} x + \tfrac12 y^\top F_{yy} y
        + a^\top x + b^\top y,

so :math:`y^*(x) = -Q^{-1}(Px + q)` and :math:`\nabla H(x) = \nabla_x f - P^\top Q^{-1}
\nabla_y f` at :math:`y^*(x)`. :math:`Q` must be symmetric positive definite (checked by a
Cholesky factorization at construction); the upper level may be nonconvex.
"""

from __future__ import annotations

import torch

__all__ = ["QuadraticBilevel", "random_quadratic_bilevel"]


class QuadraticBilevel:
    """A quadratic bilevel problem as an analytic oracle (float64).

    Args:
        Q: ``(m, m)`` symmetric positive definite lower-level Hessian.
        P: ``(m, n)`` coupling; q: ``(m,)``.
        F_xx: ``(n, n)``, F_yx: ``(m, n)``, F_yy: ``(m, m)`` symmetric; a: ``(n,)``; b: ``(m,)``.

    Raises:
        ValueError: if a shape does not match ``Q`` and ``P``, or ``Q`` is not symmetric
            positive definite (the lower level would not be strongly convex).
    """

    def __init__(
        self,
        *,
        Q: torch.Tensor,
        P: torch.Tensor,
        q: torch.Tensor,
        F_xx: torch.Tensor,
        F_yx: torch.Tensor,
        F_yy: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
    ) -> None:
        if Q.ndim != 2 or Q.shape[0] != Q.shape[1]:
            raise ValueError(f"Q: expected a square (m, m) matrix, got shape {tuple(Q.shape)}.")
        m = Q.shape[0]
        if P.ndim != 2 or P.shape[0] != m:
            raise ValueError(f"P: expected shape ({m}, n) to match Q, got {tuple(P.shape)}.")
        n = P.shape[1]
        expected = {
            "q": (m,),
            "F_xx": (n, n),
            "F_yx": (m, n),
            "F_yy": (m, m),
            "a": (n,),
            "b": (m,),
        }
        given = {"q": q, "F_xx": F_xx, "F_yx": F_yx, "F_yy": F_yy, "a": a, "b": b}
        for name, shape in expected.items():
            if tuple(given[name].shape) != shape:
                raise ValueError(
                    f"{name}: expected shape {shape} for dim_x={n}, dim_y={m} (from P and Q), "
                    f"got {tuple(given[name].shape)}."
                )
        if not torch.allclose(Q, Q.T, atol=1e-12 * float(Q.abs().max())):
            raise ValueError("Q: expected a symmetric matrix; pass (Q + Q.T) / 2.")
        L, info = torch.linalg.cholesky_ex(Q.double())
        if int(info) != 0:
            lam = float(torch.linalg.eigvalsh(Q.double())[0])
            raise ValueError(
                f"Q: the lower level must be strongly convex in y, but Q has smallest eigenvalue "
                f"{lam:.3e}; add mu * I with mu > 0."
            )
        self._chol = L
        d = torch.float64
        self.Q, self.P, self.q = Q.to(d), P.to(d), q.to(d)
        self.F_xx, self.F_yx, self.F_yy = F_xx.to(d), F_yx.to(d), F_yy.to(d)
        self.a, self.b = a.to(d), b.to(d)
        self.dim_x, self.dim_y, self.dtype = n, m, d

    def upper(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (
            0.5 * x @ self.F_xx @ x + y @ self.F_yx @ x + 0.5 * y @ self.F_yy @ y
            + self.a @ x + self.b @ y
        )  # fmt: skip

    def lower(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * y @ self.Q @ y + y @ self.P @ x + self.q @ y

    def grad_f(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gx = self.F_xx @ x + self.F_yx.T @ y + self.a
        gy = self.F_yx @ x + self.F_yy @ y + self.b
        return gx, gy

    def grad_g(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.P.T @ y, self.Q @ y + self.P @ x + self.q

    def hvp_yy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.Q @ v

    def jvp_xy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.P.T @ v

    def lower_solution(self, x: torch.Tensor) -> torch.Tensor:
        rhs = -(self.P @ x + self.q)
        return torch.cholesky_solve(rhs.unsqueeze(-1), self._chol).squeeze(-1)

    def upper_value(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(self.upper(x, y))

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        gx, gy = self.grad_f(x, self.lower_solution(x))
        return gx - self.P.T @ torch.cholesky_solve(gy.unsqueeze(-1), self._chol).squeeze(-1)


def random_quadratic_bilevel(
    dim_x: int,
    dim_y: int,
    *,
    strong_convexity: float = 0.1,
    smoothness: float = 1.0,
    seed: int = 0,
) -> QuadraticBilevel:
    """A random instance whose ``Q`` has spectrum in ``[strong_convexity, smoothness]``.

    The upper level is a random (indefinite) quadratic with unit-scale coefficients.
    """
    if not 0 < strong_convexity <= smoothness:
        raise ValueError(
            "strong_convexity, smoothness: expected 0 < mu <= L, got "
            f"{strong_convexity}, {smoothness}."
        )
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    U, _ = torch.linalg.qr(randn(dim_y, dim_y))
    eig = torch.linspace(strong_convexity, smoothness, dim_y, dtype=torch.float64)
    Q = (U * eig) @ U.T
    S = randn(dim_y, dim_y)
    return QuadraticBilevel(
        Q=0.5 * (Q + Q.T),
        P=randn(dim_y, dim_x) / dim_x**0.5,
        q=randn(dim_y),
        F_xx=torch.eye(dim_x, dtype=torch.float64) * 0.1,
        F_yx=randn(dim_y, dim_x) / dim_x**0.5,
        F_yy=0.5 * (S + S.T) / dim_y**0.5,
        a=randn(dim_x),
        b=randn(dim_y),
    )
