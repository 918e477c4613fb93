"""The three cvxpylayers QP examples of the benchmark, in CVXPY and in matrix form.

Each :class:`Problem` carries the CVXPY problem (its parameters and the variable returned),
float64 parameter values (one sample or a batch) and ``direct(*leaves)``: the same QP written
by hand for :func:`dxopt.qp.solve` from the same leaves (what a user without the front end
would write: ``P = L^T L``, ``P = 2 F^T F``, ...), so both paths get gradients for the same
tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cvxpy as cp
import numpy as np
import torch
from torch import Tensor

import dxopt.qp as dqp

F64 = torch.float64


@dataclass
class Problem:
    name: str
    size: str
    problem: Any
    parameters: list[Any]
    variable: Any
    values: list[Tensor]
    direct: Callable[..., Tensor]


def _stack(
    draw: Callable[[np.random.Generator], list[np.ndarray]], batch: int, seed: int
) -> list[Tensor]:
    samples = [draw(np.random.default_rng(seed + i)) for i in range(batch)]
    values = [torch.tensor(np.stack(column), dtype=F64) for column in zip(*samples)]
    return [v[0] for v in values] if batch == 1 else values


def optnet(batch: int, *, n: int = 20, m: int = 20, p: int = 5, seed: int = 0) -> Problem:
    """OptNet's QP: min 1/2 ||L x||^2 + q'x s.t. A x = b, G x <= h (all parameters)."""
    x = cp.Variable(n)
    L, q = cp.Parameter((n, n)), cp.Parameter(n)
    A, b, G, h = cp.Parameter((p, n)), cp.Parameter(p), cp.Parameter((m, n)), cp.Parameter(m)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(L @ x) + q @ x), [A @ x == b, G @ x <= h])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        Lv = rng.standard_normal((n, n)) / np.sqrt(n) + np.eye(n)
        Av, Gv, x0 = (
            rng.standard_normal((p, n)),
            rng.standard_normal((m, n)),
            rng.standard_normal(n),
        )
        return [Lv, rng.standard_normal(n), Av, Av @ x0, Gv, Gv @ x0 + rng.uniform(0.1, 1.0, m)]

    def direct(L: Tensor, q: Tensor, A: Tensor, b: Tensor, G: Tensor, h: Tensor) -> Tensor:
        return dqp.solve(L.mT @ L, q, A=A, b=b, G=G, h=h).x

    return Problem("OptNet QP", f"n={n}, m={m}, p={p}", problem, [L, q, A, b, G, h], x,
                   _stack(draw, batch, seed), direct)  # fmt: skip


def box_least_squares(batch: int, *, n: int = 20, k: int = 30, seed: int = 0) -> Problem:
    """Box-constrained least squares: min ||F x - g||^2 s.t. 0 <= x <= 1 (F, g parameters)."""
    x = cp.Variable(n)
    F, g = cp.Parameter((k, n)), cp.Parameter(k)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(F @ x - g)), [x >= 0, x <= 1])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal((k, n)), 2.0 * rng.standard_normal(k)]

    def direct(F: Tensor, g: Tensor) -> Tensor:
        zero, one = torch.zeros(n, dtype=F.dtype), torch.ones(n, dtype=F.dtype)
        P, q = 2.0 * F.mT @ F, -2.0 * (F.mT @ g.unsqueeze(-1)).squeeze(-1)
        return dqp.solve(P, q, lb=zero, ub=one).x

    return Problem("box least squares", f"n={n}, k={k}", problem, [F, g], x,
                   _stack(draw, batch, seed), direct)  # fmt: skip


def simplex(batch: int, *, n: int = 50, seed: int = 0) -> Problem:
    """Euclidean projection onto the probability simplex: min ||x - y||^2, 1'x = 1, x >= 0."""
    x, y = cp.Variable(n), cp.Parameter(n)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.sum(x) == 1, x >= 0])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal(n)]

    eye, ones = torch.eye(n, dtype=F64), torch.ones(1, n, dtype=F64)
    one, zeros = torch.ones(1, dtype=F64), torch.zeros(n, dtype=F64)

    def direct(y: Tensor) -> Tensor:
        return dqp.solve(2.0 * eye, -2.0 * y, A=ones, b=one, G=-eye, h=zeros).x

    return Problem("simplex projection", f"n={n}", problem, [y], x, _stack(draw, batch, seed),
                   direct)  # fmt: skip


PROBLEMS = {"optnet": optnet, "box_lsq": box_least_squares, "simplex": simplex}
