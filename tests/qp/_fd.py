"""Kink-aware one-sided finite differences for the gradient tests of dxopt.qp.

A QP's solution map is piecewise smooth: at a kink the forward and the backward difference
quotients differ and either one is a valid directional derivative of a piece. Each side is
taken at three steps; a side whose quotients move by more than ``rtol`` across the steps is
unstable (no verdict), and a check with no stable side is no verdict, never a pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

STEPS = (1e-5, 1e-6, 1e-7)


def one_sided(
    f: Callable[[np.ndarray], float], x0: np.ndarray, direction: np.ndarray, *, rtol: float = 1e-5
) -> list[float]:
    """The stable one-sided difference quotients of ``f`` at ``x0`` along ``direction`` (the
    smallest step's quotient of each stable side: none, one or two values)."""
    f0 = f(x0)
    out = []
    for sign in (1.0, -1.0):
        quotients = [sign * (f(x0 + sign * t * direction) - f0) / t for t in STEPS]
        if max(quotients) - min(quotients) <= rtol * (1 + max(abs(v) for v in quotients)):
            out.append(quotients[-1])
    return out


def directional_verdicts(
    data: dict[str, Any],
    grads: dict[str, Any],
    loss: Callable[[dict[str, Any]], float],
    *,
    seed: int = 11,
    rtol: float = 1e-5,
    hull: bool = False,
) -> int:
    """Check ``grads`` (tensors like ``data``'s) along one random direction per input against
    :func:`one_sided` differences of ``loss(data with that input moved)`` (a symmetric
    direction for ``P``); assert each verdict and return their number. ``hull``: where both
    sides are stable, anything between them passes too (an element of Clarke's generalized
    gradient, e.g. the minimum-norm split of the multipliers of dependent rows, projects into
    that interval at a kink of two pieces)."""
    rng = np.random.default_rng(seed)
    verdicts = 0
    for key, value in data.items():
        if value is None or grads.get(key) is None:
            continue
        direction = rng.standard_normal(tuple(value.shape))
        if key == "P":
            direction = direction + np.swapaxes(direction, -1, -2)
        base = value.numpy()

        def moved(x: np.ndarray, key: str = key) -> float:
            return loss({**data, key: torch.tensor(x)})

        quotients = one_sided(moved, base, direction)
        if not quotients:
            continue
        analytic = float((grads[key] * torch.tensor(direction)).sum())
        tol = rtol * (1 + abs(analytic))
        if hull and len(quotients) == 2:
            assert min(quotients) - tol <= analytic <= max(quotients) + tol, key
        else:
            assert min(abs(analytic - q) for q in quotients) <= tol, key
        verdicts += 1
    return verdicts
