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

from dxopt._core import check_on_failure, check_tensor, handle_failure
from dxopt.dfl._checks import check_not_negative, uncertified
from dxopt.dfl.oracles import OracleError

__all__ = ["RegretReport", "normalized_regret", "regret", "regret_report"]


def _refuse_uncertified(oracle: Any, samples: list[int], total: int, on_failure: str) -> None:
    handle_failure(
        on_failure,
        f"regret: {len(samples)} of {total} answers of {type(oracle).__name__} are not certified "
        f"optima (first: sample {samples[0]}, {oracle.last_status[samples[0]].value}); a "
        "heuristic's or a time-limited solver's gap is not a regret. Use an exact method "
        "(TSPOracle(method='exact') up to 16 nodes; MILPOracle without limits) or pass "
        "on_failure='warn' / 'ignore' to report the gap anyway.",
        error=OracleError,
        status=oracle.last_status[samples[0]],
        stacklevel=4,
    )


def _optimum(oracle: Any, c: Tensor, z_true: Tensor | None, on_failure: str = "raise") -> Tensor:
    if z_true is None:
        z = oracle.objective(c, oracle(c))
        bad = uncertified(oracle)
        if bad:
            _refuse_uncertified(oracle, bad, int(z.numel()), on_failure)
        return z
    if z_true.numel() != c.numel() // c.shape[-1]:
        raise ValueError(
            f"z_true: expected one optimum per cost vector, {c.numel() // c.shape[-1]} values "
            f"(shape {tuple(c.shape[:-1])}), got shape {tuple(z_true.shape)}."
        )
    return z_true.reshape(c.shape[:-1]).to(c.dtype)


def regret(
    oracle: Any,
    c_hat: Tensor,
    c: Tensor,
    *,
    z_true: Tensor | None = None,
    on_failure: str = "raise",
) -> Tensor:
    """Per-sample regret :math:`s\\,(c^\\top x(\\hat c) - z^*)` (``(B,)``; no gradient).

    ``z_true`` (the true optima, ``(B,)``) saves an oracle call on ``c``. The regret is only a
    regret when :math:`x(\\hat c)` and :math:`z^*` are optima: where the oracle reports an
    uncertified answer (:attr:`~dxopt.dfl.OracleBase.last_status`: a heuristic's tour, a
    time-limited MILP), ``on_failure="raise"`` (default) raises an
    :class:`~dxopt.dfl.OracleError`; ``"warn"`` / ``"ignore"`` return the gap anyway. With
    certified answers the regret is :math:`\\ge 0`, so a negative one (beyond rounding) raises
    a ``ValueError``: the oracle's ``sense`` is wrong (e.g. a ``CallableOracle`` that
    maximises, built with the default ``sense="min"``) or ``z_true`` is not its optimum.
    """
    on_failure = check_on_failure(on_failure)
    check_tensor("c_hat", c_hat, floating=True)
    check_tensor("c", c, floating=True)
    if c_hat.shape != c.shape:
        raise ValueError(
            f"c: expected the shape of c_hat {tuple(c_hat.shape)}, got {tuple(c.shape)}."
        )
    with torch.no_grad():
        x_hat = oracle(c_hat.detach())
        bad = uncertified(oracle)
        if bad:
            _refuse_uncertified(oracle, bad, len(oracle.last_status), on_failure)
        z = _optimum(oracle, c, z_true, on_failure)
        sign = 1.0 if oracle.sense == "min" else -1.0
        r: Tensor = sign * (oracle.objective(c, x_hat) - z)
        if not bad and not uncertified(oracle):
            scale = oracle.objective(c.abs(), x_hat.abs()) + z.abs()
            check_not_negative(
                "regret", r, scale, oracle, "z_true is not this oracle's optimum of c"
            )
        return r


def normalized_regret(
    oracle: Any,
    c_hat: Tensor,
    c: Tensor,
    *,
    z_true: Tensor | None = None,
    on_failure: str = "raise",
) -> Tensor:
    """PyEPO's normalised regret :math:`\\sum_i \\text{regret}_i / \\sum_i |z^*_i|` (a 0-D
    tensor); raises when every optimum is 0 (the ratio is undefined). ``on_failure``: as in
    :func:`regret`."""
    z = _optimum(oracle, c, z_true, on_failure)
    total = z.abs().sum()
    if not bool(total > 0):
        raise ValueError("c: every true optimum is 0, so the normalised regret is undefined.")
    return regret(oracle, c_hat, c, z_true=z, on_failure=on_failure).sum() / total


@dataclass(frozen=True)
class RegretReport:
    """What :func:`regret_report` measured: ``normalized`` (PyEPO's figure), ``mean`` regret,
    the per-sample ``regrets`` and their ``count``."""

    normalized: float
    mean: float
    count: int
    regrets: Tensor


def _is_oracle(obj: Any) -> bool:
    return callable(obj) and all(hasattr(obj, a) for a in ("sense", "dim", "objective"))


def regret_report(
    model: nn.Module | Any, loader: Any, oracle: Any, *, on_failure: str = "raise"
) -> RegretReport:
    """Evaluate ``model`` (features -> predicted costs) on every batch of ``loader`` (yielding
    ``(features, costs[, solutions, objectives])``, e.g. ``DataLoader(data.dataset())``) and
    return the normalised regret as PyEPO reports it (``pyepo.metric.regret``). The model is
    put in eval mode and restored. ``on_failure``: as in :func:`regret` (uncertified answers).

    The argument order is ``(model, loader, oracle)``; PyEPO's ``regret(predmodel, optmodel,
    dataloader)`` order is refused with a ``TypeError`` saying so."""
    if _is_oracle(loader) and not _is_oracle(oracle):
        raise TypeError(
            "regret_report: loader is an oracle and oracle is not: this is PyEPO's order "
            "regret(predmodel, optmodel, dataloader); dxopt's is regret_report(model, loader, "
            "oracle)."
        )
    if not _is_oracle(oracle):
        raise TypeError(
            f"oracle: expected a dxopt.dfl oracle (callable with .sense, .dim, .objective), got "
            f"{type(oracle).__name__}."
        )
    on_failure = check_on_failure(on_failure)
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
                z_true = _optimum(oracle, c, z, on_failure)
                regrets.append(regret(oracle, c_hat, c, z_true=z_true, on_failure=on_failure))
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
