"""The problem set of ``dxopt bench conic``: each model as a CVXPY DPP problem with parameter
values (one sample or a batch), and as raw cone data ``(P, q, A, b, cones)`` per sample in the
form ``min 1/2 x'Px + q'x  s.t.  Ax + s = b,  s in K`` (CVXPY's own canonicalisation for
Clarabel, so the raw loop and the layers solve the same program).

- ``socp``: least squares with a norm ball and a box, ``min ||F x - g||^2 s.t. ||x|| <= r,
  -1 <= x <= 1`` (n = 20), parameters ``F, g``;
- ``portfolio``: ``max mu'x s.t. x' Sigma x <= gamma, 1'x = 1, x >= 0`` (the risk constraint
  as a second-order cone through ``||L' x|| <= sqrt(gamma)``), parameter ``mu``;
- ``logistic``: l2-regularised logistic regression (exponential cones), parameters the
  features ``X`` and labels' signs enter as data, the weights ``y``;
- ``sdp``: ``min <C, X> s.t. <A_i, X> = b_i, X >> 0`` (a small PSD cone), parameters ``C, b``;
- ``log_penalty``: ``max x + lam (log(1 - x) + log(1 + x))`` (cvxpylayers issue 135 / diffcp
  issue 57 in one variable, two exponential cones), parameter ``lam``; closed form
  ``x* = sqrt(lam^2 + 1) - lam``, ``dx*/dlam = lam / sqrt(lam^2 + 1) - 1``;
- ``log_trading``: the trading model of cvxpylayers issue 135 (where cvxpylayers returned
  -45.69 against a finite difference of -2.10), written here from its description: one
  stock over ``D = 10`` days with known prices, trades ``|q_t| < 1`` kept off the bounds by a
  log barrier of weight ``lam``, positions ``|cumsum(q)| <= 10``;
  ``max sum((p_D - p_t) q_t) + lam sum(log(1 - q_t) + log(1 + q_t))``, parameter ``lam``;
- three of cvxpylayers' torch examples as their models read (our own code): ``monotone``
  (monotone output regression, ``min ||x - y||_2 s.t. diff(x) >= 0``, parameter ``y``),
  ``transport`` (entropic optimal transport, ``min <C, T> - eps sum(entr(T))`` with fixed
  marginals, parameter ``C``) and ``resource`` (resource allocation,
  ``min w' exp(-x) s.t. 1'x = 1, x >= 0``, parameter ``w``).
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
class Problem:
    name: str
    size: str
    problem: Any
    parameters: list[Any]
    variable: Any
    values: list[Tensor]  # batched along dim 0 (batch >= 1)


@dataclass(frozen=True)
class ConeData:
    """One sample's cone program (SciPy CSC ``P`` upper triangle and ``A``)."""

    P: Any
    q: np.ndarray
    A: Any
    b: np.ndarray
    zero: int
    nonneg: int
    soc: tuple[int, ...]
    exp: int
    power: tuple[float, ...]
    psd: tuple[int, ...]


def _batch(draw: Any, batch: int, seed: int) -> list[Tensor]:
    samples = [draw(np.random.default_rng(seed + i)) for i in range(batch)]
    return [torch.tensor(np.stack(col), dtype=F64) for col in zip(*samples, strict=True)]


def socp(batch: int, *, n: int = 20, k: int = 30, seed: int = 0) -> Problem:
    x = cp.Variable(n)
    F, g = cp.Parameter((k, n)), cp.Parameter(k)
    prob = cp.Problem(
        cp.Minimize(cp.sum_squares(F @ x - g)),
        [cp.norm(x, 2) <= 0.5 * np.sqrt(n) * 0.3, cp.abs(x) <= 1],
    )

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal((k, n)), rng.standard_normal(k) * 3]

    return Problem("socp", f"n={n}, k={k}", prob, [F, g], x, _batch(draw, batch, seed))


def portfolio(batch: int, *, n: int = 20, seed: int = 0) -> Problem:
    rng = np.random.default_rng(1234)
    factor = rng.standard_normal((n, 5)) * 0.1
    sigma = factor @ factor.T + np.diag(rng.uniform(0.01, 0.05, n))
    chol = np.linalg.cholesky(sigma)
    gamma = float(np.mean(np.diag(sigma))) * 0.3
    x = cp.Variable(n)
    mu = cp.Parameter(n)
    prob = cp.Problem(
        cp.Maximize(mu @ x - 1e-3 * cp.sum_squares(x)),
        [cp.norm(chol.T @ x, 2) <= np.sqrt(gamma), cp.sum(x) == 1, x >= 0],
    )

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(0.0, 0.2, n)]

    return Problem("portfolio", f"n={n}", prob, [mu], x, _batch(draw, batch, seed))


def logistic(batch: int, *, n: int = 5, m: int = 20, seed: int = 0) -> Problem:
    rng = np.random.default_rng(99)
    X = rng.standard_normal((m, n))
    labels = np.sign(X @ rng.standard_normal(n) + 0.5 * rng.standard_normal(m))
    w = cp.Variable(n)
    weights = cp.Parameter(m, nonneg=True)
    prob = cp.Problem(
        cp.Minimize(cp.sum(cp.multiply(weights, cp.logistic(-cp.multiply(labels, X @ w)))) / m
                    + 0.1 * cp.sum_squares(w))
    )  # fmt: skip

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(0.5, 1.5, m)]

    return Problem("logistic", f"n={n}, m={m}", prob, [weights], w, _batch(draw, batch, seed))


def sdp(batch: int, *, n: int = 4, p: int = 3, seed: int = 0) -> Problem:
    rng = np.random.default_rng(7)
    mats = [(lambda M: M + M.T)(rng.standard_normal((n, n))) for _ in range(p)]
    X = cp.Variable((n, n), symmetric=True)
    C, b = cp.Parameter((n, n), symmetric=True), cp.Parameter(p)
    cons = [X >> 0] + [cp.trace(mats[i] @ X) == b[i] for i in range(p)] + [cp.trace(X) <= 10]
    prob = cp.Problem(cp.Minimize(cp.trace(C @ X)), cons)

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        G = rng.standard_normal((n, n))
        x0 = G @ G.T / n + np.eye(n)
        Cv = rng.standard_normal((n, n))
        return [Cv @ Cv.T / n + np.eye(n), np.array([np.trace(M @ x0) for M in mats])]

    return Problem("sdp", f"n={n}, p={p}", prob, [C, b], X, _batch(draw, batch, seed))


def log_penalty(batch: int, *, seed: int = 0) -> Problem:
    x = cp.Variable(1)
    lam = cp.Parameter(1, nonneg=True)
    prob = cp.Problem(cp.Maximize(cp.sum(x + lam * cp.log(1 - x) + lam * cp.log(1 + x))))

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(0.5, 2.0, 1)]

    return Problem("log_penalty", "n=1", prob, [lam], x, _batch(draw, batch, seed))


def log_trading(batch: int, *, days: int = 10, seed: int = 0) -> Problem:
    prices = np.random.default_rng(1234).standard_normal(days)
    q = cp.Variable(days)
    lam = cp.Parameter(1, nonneg=True)
    pnl = (prices[-1] - prices) @ q
    barrier = cp.sum(cp.log(1 - q) + cp.log(1 + q))
    prob = cp.Problem(cp.Maximize(pnl + lam * barrier), [cp.abs(cp.cumsum(q)) <= 10])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(0.05, 0.5, 1)]

    return Problem("log_trading", f"D={days}", prob, [lam], q, _batch(draw, batch, seed))


def monotone(batch: int, *, n: int = 12, seed: int = 0) -> Problem:
    x, y = cp.Variable(n), cp.Parameter(n)
    prob = cp.Problem(cp.Minimize(cp.norm(x - y, 2)), [cp.diff(x) >= 0])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [np.linspace(-1.0, 1.0, n) + 0.3 * rng.standard_normal(n)]

    return Problem("monotone", f"n={n}", prob, [y], x, _batch(draw, batch, seed))


def transport(batch: int, *, n: int = 4, eps: float = 0.1, seed: int = 0) -> Problem:
    C = cp.Parameter((n, n))
    T = cp.Variable((n, n))
    a = np.full(n, 1.0 / n)
    prob = cp.Problem(
        cp.Minimize(cp.sum(cp.multiply(C, T)) - eps * cp.sum(cp.entr(T))),
        [cp.sum(T, axis=1) == a, cp.sum(T, axis=0) == a],
    )

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(0.0, 1.0, (n, n))]

    return Problem("transport", f"n={n}", prob, [C], T, _batch(draw, batch, seed))


def resource(batch: int, *, n: int = 6, seed: int = 0) -> Problem:
    w, x = cp.Parameter(n, nonneg=True), cp.Variable(n)
    prob = cp.Problem(cp.Minimize(w @ cp.exp(-x)), [cp.sum(x) == 1, x >= 0])

    def draw(rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(0.5, 2.0, n)]

    return Problem("resource", f"n={n}", prob, [w], x, _batch(draw, batch, seed))


PROBLEMS = {
    "socp": socp,
    "portfolio": portfolio,
    "logistic": logistic,
    "sdp": sdp,
    "log_penalty": log_penalty,
    "log_trading": log_trading,
    "monotone": monotone,
    "transport": transport,
    "resource": resource,
}


def cone_data(prob: Problem) -> list[ConeData]:
    """Each sample's cone program, from CVXPY's canonicalisation for Clarabel."""
    out = []
    batch = prob.values[0].shape[0]
    for i in range(batch):
        for par, val in zip(prob.parameters, prob.values, strict=True):
            par.value = val[i].numpy()
        data, _, _ = prob.problem.get_problem_data(cp.CLARABEL)
        dims = data["dims"]
        out.append(
            ConeData(
                P=data.get("P"),
                q=data["c"],
                A=data["A"],
                b=data["b"],
                zero=dims.zero,
                nonneg=dims.nonneg,
                soc=tuple(dims.soc),
                exp=dims.exp,
                power=tuple(dims.p3d),
                psd=tuple(dims.psd),
            )
        )
    return out
