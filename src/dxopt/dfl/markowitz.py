"""The risk-constrained portfolio: an oracle and a smooth layer on :mod:`dxopt.conic`.

The problem (PyEPO's ``portfolioModel``; Tang & Khalil, arXiv 2206.14234):

.. math::

    x(c) \\in \\arg\\max_x\\; c^\\top x \\quad\\text{s.t.}\\quad \\mathbf 1^\\top x = 1,\\;
    x \\ge 0,\\; x^\\top \\Sigma x \\le \\rho,\\qquad \\rho = \\gamma\\,\\bar\\Sigma,

with :math:`\\bar\\Sigma` the mean entry of :math:`\\Sigma` (PyEPO's ``risk_level``; its
default :math:`\\gamma = 2.25`). With :math:`\\Sigma = LL^\\top` (Cholesky) the risk bound is
the second-order cone :math:`\\|L^\\top x\\|_2 \\le \\sqrt\\rho`, so the problem is the cone
program :math:`\\min -c^\\top x` s.t. :math:`(\\mathbf 1^\\top x - 1) \\in \\{0\\}`,
:math:`x \\in \\mathbb R^n_+`, :math:`(\\sqrt\\rho, L^\\top x) \\in \\mathcal Q^{n+1}`, solved and
certified by :func:`dxopt.conic.solve`.

:class:`PortfolioOracle` answers :math:`x(c)` for a batch with a per-sample status, so the
oracle losses of :mod:`dxopt.dfl` (SPO+, PFYL, DBB, NCE, ...) run on it.
:class:`PortfolioLayer` is the smooth counterpart
:math:`x_\\mu(c) = \\arg\\max c^\\top x - \\tfrac\\mu2\\|x\\|^2` over the same set, unique for
:math:`\\mu > 0` and differentiated exactly by the implicit backward of :mod:`dxopt.conic`
(the quadratic smoothing of Wilder, Dilkina & Tambe, AAAI 2019, on a conic feasible set).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dxopt._core import check_positive
from dxopt.conic import NonnegCone, SecondOrderCone, ZeroCone
from dxopt.conic import solve as conic_solve
from dxopt.dfl._checks import check_cost_vectors
from dxopt.dfl._cost import CostMeter, Metered
from dxopt.dfl.oracles import OracleBase, OracleError

__all__ = ["PortfolioLayer", "PortfolioOracle", "portfolio_cone_program"]


def _check_covariance(covariance: Any) -> Tensor:
    if not isinstance(covariance, (Tensor, np.ndarray)):
        raise TypeError(
            "covariance: expected a (n, n) tensor or ndarray (e.g. dxopt.dfl.portfolio(...)"
            f".covariance), got {type(covariance).__name__}."
        )
    cov = torch.as_tensor(covariance).detach().to("cpu", torch.float64)
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1] or cov.shape[0] < 1:
        raise ValueError(
            f"covariance: expected a square (n, n) matrix, got shape {tuple(cov.shape)}."
        )
    if not bool(torch.isfinite(cov).all()):
        raise ValueError("covariance: has non-finite entries; pass a finite matrix.")
    if not torch.allclose(cov, cov.T, rtol=1e-10, atol=1e-12 * float(cov.abs().max())):
        raise ValueError("covariance: is not symmetric; pass (S + S.T) / 2.")
    return cov


def portfolio_cone_program(
    covariance: Any, *, gamma: float = 2.25
) -> tuple[Tensor, Tensor, list[Any], float]:
    """The constraints of the portfolio as :math:`Ax + s = b`, :math:`s \\in K`.

    Returns ``(A, b, cones, rho)`` in float64: one zero-cone row (the budget), ``n`` nonnegative
    rows (:math:`x \\ge 0`), one second-order cone of dimension ``n + 1``
    (:math:`(\\sqrt\\rho, L^\\top x)`), and the risk budget :math:`\\rho = \\gamma\\,\\bar\\Sigma`.

    Raises:
        ValueError: ``covariance`` not square, symmetric, finite and positive definite
            (a semidefinite one: add a small ridge), or ``rho`` not positive.
    """
    cov = _check_covariance(covariance)
    gamma = check_positive("gamma", gamma)
    n = cov.shape[0]
    rho = gamma * float(cov.mean())
    if not rho > 0.0:
        raise ValueError(
            f"gamma: the risk budget gamma * mean(covariance) = {rho:g} must be positive "
            "(PyEPO's convention); pass a covariance with a positive mean entry."
        )
    L, info = torch.linalg.cholesky_ex(cov)
    if int(info) != 0:
        raise ValueError(
            "covariance: not positive definite (Cholesky failed); add a small ridge, "
            "covariance + eps * I."
        )
    eye = torch.eye(n, dtype=torch.float64)
    A = torch.cat([torch.ones(1, n, dtype=torch.float64), -eye, torch.zeros(1, n), -L.T])
    b = torch.zeros(2 * n + 2, dtype=torch.float64)
    b[0], b[n + 1] = 1.0, rho**0.5
    cones = [ZeroCone(1), NonnegCone(n), SecondOrderCone(n + 1)]
    return A, b, cones, rho


class PortfolioOracle(OracleBase):
    """The maximum-return portfolio under a risk budget, certified by :mod:`dxopt.conic`.

    :math:`x(c) \\in \\arg\\max\\{c^\\top x : \\mathbf 1^\\top x = 1, x \\ge 0,
    x^\\top\\Sigma x \\le \\gamma\\bar\\Sigma\\}` (module docstring), ``sense="max"``.

    Args:
        covariance: ``(n, n)`` symmetric positive definite :math:`\\Sigma`.
        gamma: the risk multiplier (PyEPO's, default ``2.25``): the budget is
            ``gamma * covariance.mean()``.
        atol, rtol: the tolerances the conic solution is certified to (primal and dual
            residuals and the gap, :func:`dxopt.conic.solve`).

    Each call solves the batch in one :func:`dxopt.conic.solve`; :attr:`last_status` holds its
    per-sample status. A sample without a certified optimum (an infeasible budget: ``gamma``
    below the least risk on the simplex, or a solver failure) raises :class:`OracleError`
    naming it, never a silently wrong decision.
    """

    def __init__(
        self, covariance: Any, *, gamma: float = 2.25, atol: float = 1e-9, rtol: float = 1e-9
    ) -> None:
        A, b, cones, rho = portfolio_cone_program(covariance, gamma=gamma)
        super().__init__(dim=A.shape[1], sense="max")
        self.covariance = _check_covariance(covariance)
        self.gamma, self.risk_level = float(gamma), rho
        self.atol = check_positive("atol", atol)
        self.rtol = check_positive("rtol", rtol)
        self._A, self._b, self._cones = A, b, cones

    def _solve(self, c: np.ndarray) -> np.ndarray:
        q = -torch.from_numpy(c)
        sol = conic_solve(
            None, q, self._A, self._b, cones=self._cones, atol=self.atol, rtol=self.rtol,
            on_failure="ignore",
        )  # fmt: skip
        bad = [i for i, st in enumerate(sol.status) if not st.ok]
        if bad:
            listed = ", ".join(f"{i}: {sol.status[i].value}" for i in bad[:10])
            raise OracleError(
                f"PortfolioOracle: {len(bad)} of {len(sol.status)} cost vectors have no "
                f"certified optimum ({listed}); an infeasible status means gamma={self.gamma:g} "
                "is below the least risk on the simplex: raise gamma.",
                status=tuple(sol.status),
            )
        self._status = tuple(sol.status)  # SOLVED, or DEGENERATE (a valid optimum as well)
        return sol.x.detach().numpy()


class PortfolioLayer(Metered, nn.Module):
    """The quadratically smoothed portfolio :math:`x_\\mu(\\hat c)` as a differentiable layer.

    .. math::

        x_\\mu(\\hat c) = \\arg\\max_x\\; \\hat c^\\top x - \\tfrac\\mu2\\|x\\|_2^2
        \\quad\\text{s.t.}\\quad \\mathbf 1^\\top x = 1,\\; x \\ge 0,\\;
        x^\\top\\Sigma x \\le \\gamma\\bar\\Sigma,

    the strongly concave program has one solution, Lipschitz in :math:`\\hat c`, and
    :func:`dxopt.conic.solve` differentiates it through its KKT system
    (where a bound is weakly active, a kink, the conic backward takes the one-sided derivative
    of the adjoining piece and says so with a :class:`dxopt.conic.ConicDegenerateWarning`).
    As :math:`\\mu \\to 0`, :math:`x_\\mu(\\hat c) \\to x(\\hat c)` of :class:`PortfolioOracle`.

    Args:
        covariance, gamma: as :class:`PortfolioOracle`.
        mu: the smoothing weight :math:`\\mu > 0` (default ``0.1``; in units of the costs).
        atol, rtol: the conic tolerances.

    ``forward(c_hat)``: ``(n,)`` or ``(B, n)`` predicted returns in, the decisions out (same
    shape and dtype); a sample without a certified solution raises.
    """

    def __init__(
        self,
        covariance: Any,
        *,
        gamma: float = 2.25,
        mu: float = 0.1,
        atol: float = 1e-9,
        rtol: float = 1e-9,
    ) -> None:
        super().__init__()
        A, b, cones, rho = portfolio_cone_program(covariance, gamma=gamma)
        self.dim, self.gamma, self.risk_level = A.shape[1], float(gamma), rho
        self.mu = check_positive("mu", mu)
        self.atol = check_positive("atol", atol)
        self.rtol = check_positive("rtol", rtol)
        self._A, self._b, self._cones = A, b, cones
        self._meter = CostMeter()

    def forward(self, c_hat: Tensor) -> Tensor:
        c_hat = check_cost_vectors("c_hat", c_hat, self.dim)
        dev, dt = c_hat.device, c_hat.dtype
        flat = c_hat.reshape(-1, self.dim).to("cpu", torch.float64)
        P = self.mu * torch.eye(self.dim, dtype=torch.float64)
        with self._meter.timed(flat.shape[0]):
            sol = conic_solve(
                P, -flat, self._A, self._b, cones=self._cones, atol=self.atol, rtol=self.rtol
            )
        return sol.x.to(dev, dt).reshape(c_hat.shape)
