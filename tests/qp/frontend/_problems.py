"""CVXPY problems for the front-end tests, with parameter values that have a known, stable
active set (strict complementarity with margins >= 0.3), so finite differences are smooth.

Each builder returns a :class:`Case`: the problem, its parameters in call order, the outputs
(variables, then constraints whose multipliers are returned) and float64 parameter values
(unbatched, or with a leading batch dimension ``batch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cvxpy as cp
import numpy as np
import torch
from torch import Tensor

F64 = torch.float64


@dataclass
class Case:
    name: str
    problem: Any
    parameters: list[Any]
    outputs: list[Any]
    values: list[Tensor]


def _t(a: np.ndarray) -> Tensor:
    return torch.tensor(a, dtype=F64)


def _batch(draw: Any, batch: int | None, seed: int) -> list[Tensor]:
    if batch is None:
        return [_t(a) for a in draw(np.random.default_rng(seed))]
    samples = [draw(np.random.default_rng(seed + i)) for i in range(batch)]
    return [_t(np.stack(column)) for column in zip(*samples)]


def optnet(n: int = 6, m: int = 5, p: int = 2, *, batch: int | None = None, seed: int = 0) -> Case:
    """OptNet's QP (Amos & Kolter 2017): min 1/2 ||L x||^2 + q'x s.t. A x = b, G x <= h, every
    datum a parameter; x*, the multipliers and the active set are drawn first, q follows."""
    x = cp.Variable(n)
    L, q = cp.Parameter((n, n), name="L"), cp.Parameter(n, name="q")
    A, b = cp.Parameter((p, n), name="A"), cp.Parameter(p, name="b")
    G, h = cp.Parameter((m, n), name="G"), cp.Parameter(m, name="h")
    eq, ineq = A @ x == b, G @ x <= h
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(L @ x) + q @ x), [eq, ineq])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        Lv = rng.standard_normal((n, n)) / np.sqrt(n) + np.eye(n)
        Av, Gv = rng.standard_normal((p, n)), rng.standard_normal((m, n))
        xs, mu = rng.standard_normal(n), rng.standard_normal(p)
        active = np.arange(m) < m // 2
        nu = np.where(active, rng.uniform(0.5, 1.5, m), 0.0)
        slack = np.where(active, 0.0, rng.uniform(0.5, 1.5, m))
        qv = -(Lv.T @ Lv @ xs + Av.T @ mu + Gv.T @ nu)
        return [Lv, qv, Av, Av @ xs, Gv, Gv @ xs + slack]

    return Case("optnet", problem, [L, q, A, b, G, h], [x, eq, ineq], _batch(draw, batch, seed))


def box_least_squares(n: int = 5, k: int = 8, *, batch: int | None = None, seed: int = 0) -> Case:
    """Box-constrained least squares: min ||F x - g||^2 s.t. 0 <= x <= 1, F and g parameters;
    g = F x* + r with r chosen so that x* (some entries at 0, some at 1) is optimal."""
    x = cp.Variable(n)
    F, g = cp.Parameter((k, n), name="F"), cp.Parameter(k, name="g")
    lower, upper = x >= 0, x <= 1
    problem = cp.Problem(cp.Minimize(cp.sum_squares(F @ x - g)), [lower, upper])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        Fv = rng.standard_normal((k, n))
        xs = rng.uniform(0.3, 0.7, n)
        xs[0], xs[1] = 0.0, 1.0
        # gradient 2 F'(F x - g) = -lam_lower + lam_upper: lower active at 0, upper at 1
        grad = np.zeros(n)
        grad[0], grad[1] = rng.uniform(0.5, 1.5), -rng.uniform(0.5, 1.5)
        r, *_ = np.linalg.lstsq(Fv.T, grad / 2, rcond=None)  # F' r = grad / 2
        return [Fv, Fv @ xs - r]

    return Case("box_lsq", problem, [F, g], [x, lower, upper], _batch(draw, batch, seed))


def simplex(n: int = 6, *, batch: int | None = None, seed: int = 0) -> Case:
    """Euclidean projection onto the probability simplex: min ||x - y||^2 s.t. 1'x = 1, x >= 0;
    y spaced so that the support is stable (gaps >= 0.3 from the threshold)."""
    x, y = cp.Variable(n), cp.Parameter(n, name="y")
    total, nonneg = cp.sum(x) == 1, x >= 0
    problem = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [total, nonneg])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        support = n // 2
        xs = rng.uniform(0.5, 1.5, support)
        xs /= xs.sum()
        tau = rng.standard_normal()
        yv = np.concatenate([xs + tau, tau - rng.uniform(0.3, 1.0, n - support)])
        return [rng.permutation(yv)]

    return Case("simplex", problem, [y], [x, total, nonneg], _batch(draw, batch, seed))


def mpc(
    horizon: int = 5,
    nx: int = 3,
    nu: int = 2,
    *,
    batch: int | None = None,
    seed: int = 0,
    dynamics_parameter: bool = False,
) -> Case:
    """Linear MPC: min sum ||x_t||^2 + ||u_t||^2 s.t. x_{t+1} = A x_t + B u_t, x_0 = x_init,
    -1 <= u_t <= 1; the initial state is the parameter (and ``A`` with
    ``dynamics_parameter``: then the defining rows of the states depend on a parameter)."""
    rng = np.random.default_rng(100)
    A0 = np.eye(nx) + 0.1 * rng.standard_normal((nx, nx))
    Bm = rng.standard_normal((nx, nu))
    Am = cp.Parameter((nx, nx), name="A") if dynamics_parameter else A0
    X, U = cp.Variable((nx, horizon + 1)), cp.Variable((nu, horizon))
    x_init = cp.Parameter(nx, name="x_init")
    dynamics = [X[:, t + 1] == Am @ X[:, t] + Bm @ U[:, t] for t in range(horizon)]
    constraints = [X[:, 0] == x_init, *dynamics, U <= 1, U >= -1]
    problem = cp.Problem(cp.Minimize(cp.sum_squares(X) + cp.sum_squares(U)), constraints)

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        x0 = rng.uniform(-2.0, 2.0, nx)
        return [x0, A0 + 0.05 * rng.standard_normal((nx, nx))] if dynamics_parameter else [x0]

    parameters = [x_init, Am] if dynamics_parameter else [x_init]
    return Case("mpc", problem, parameters, [U, X, constraints[0]], _batch(draw, batch, seed))


def cvxpy_solution(case: Case, values: list[Tensor]) -> list[np.ndarray]:
    """The outputs by CVXPY itself (Clarabel at 1e-12): variable values and dual values."""
    for parameter, value in zip(case.parameters, values):
        parameter.value = value.numpy()
    case.problem.solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-10
    )
    return [
        np.asarray(o.value if isinstance(o, cp.Variable) else o.dual_value) for o in case.outputs
    ]
