"""Decision quality: regret and PyEPO's normalised regret.

For a prediction :math:`\\hat c` of the true cost :math:`c` with optimum :math:`z^* = c^\\top
x(c)`, the regret (the SPO loss, Elmachtoub & Grigas 2022) is
:math:`s\\,(c^\\top x(\\hat c) - z^*) \\ge 0` (:math:`s = +1` for minimisation, :math:`-1` for
maximisation), and PyEPO's normalised regret (Tang & Khalil, arXiv 2206.14234, eq. (9)) over a
data set is :math:`\\sum_i \\text{regret}_i / \\sum_i |z^*_i|`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dxopt._core import check_tensor

__all__ = ["RegretReport", "normalized_regret", "regret", "regret_report"]


def _optimum(oracle: Any, c: Tensor, z_true: Tensor | None) -> Tensor:
    if z_true is None:
        return oracle.objective(c, oracle(c))
    return z_true.reshape(c.shape[:-1]).to(c.dtype)


def regret(oracle: Any, c_hat: Tensor, c: Tensor, *, z_true: Tensor | None = None) -> Tensor:
    """Per-sample regret :math:`s\\,(c^\\top x(\\hat c) - z^*)` (``(B,)``; no gradient).

    ``z_true`` (the true optima, ``(B,)``) saves an oracle call on ``c``. With an exact oracle
    the regret is :math:`\\ge 0`; with a heuristic one (TSP) it can be slightly negative.
    """
    check_tensor("c_hat", c_hat, floating=True)
    check_tensor("c", c, floating=True)
    if c_hat.shape != c.shape:
        raise ValueError(
            f"c: expected the shape of c_hat {tuple(c_hat.shape)}, got {tuple(c.shape)}."
        )
    with torch.no_grad():
        x_hat = oracle(c_hat.detach())
        sign = 1.0 if oracle.sense == "min" else -1.0
        return sign * (oracle.objective(c, x_hat) - _optimum(oracle, c, z_true))


def normalized_regret(
    oracle: Any, c_hat: Tensor, c: Tensor, *, z_true: Tensor | None = None
) -> Tensor:
    """PyEPO's normalised regret :math:`\\sum_i \\text{regret}_i / \\sum_i |z^*_i|` (a 0-D
    tensor); raises when every optimum is 0 (the ratio is undefined)."""
    z = _optimum(oracle, c, z_true)
    total = z.abs().sum()
    if not bool(total > 0):
        raise ValueError("c: every true optimum is 0, so the normalised regret is undefined.")
    return regret(oracle, c_hat, c, z_true=z).sum() / total


@dataclass(frozen=True)
class RegretReport:
    """What :func:`regret_report` measured: ``normalized`` (PyEPO's figure), ``mean`` regret,
    the per-sample ``regrets`` and their ``count``."""

    normalized: float
    mean: float
    count: int
    regrets: Tensor


def regret_report(model: nn.Module | Any, loader: Any, oracle: Any) -> RegretReport:
    """Evaluate ``model`` (features -> predicted costs) on every batch of ``loader`` (yielding
    ``(features, costs[, solutions, objectives])``, e.g. ``DataLoader(data.dataset())``) and
    return the normalised regret as PyEPO reports it (``pyepo.metric.regret``). The model is
    put in eval mode and restored."""
    was_training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    regrets, optima = [], []
    try:
        with torch.no_grad():
            for batch in loader:
                features, c = batch[0], batch[1]
                z = batch[3] if len(batch) > 3 else None
                c_hat = model(features).to(c.dtype)
                z_true = _optimum(oracle, c, z)
                regrets.append(regret(oracle, c_hat, c, z_true=z_true))
                optima.append(z_true.abs())
    finally:
        if isinstance(model, nn.Module):
            model.train(was_training)
    if not regrets:
        raise ValueError("loader: it yielded no batch.")
    r, z = torch.cat(regrets), torch.cat(optima)
    return RegretReport(
        normalized=float(r.sum() / z.sum()), mean=float(r.mean()), count=int(r.numel()), regrets=r
    )
