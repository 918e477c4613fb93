"""Variance-reduced forward-mode and zeroth-order gradients (SVRG control variates).

Every ``refresh_every`` estimates, the anchor :math:`\\bar\\theta \\leftarrow \\theta` and its
estimate :math:`\\mu = \\hat g(\\bar\\theta; B_{\\text{anchor}})` (``anchor_directions``
directions on the anchor batch) are refreshed. In between, with shared directions
:math:`z_i` and the minibatch :math:`B`,

.. math:: g = \\frac1n\\sum_i \\bigl(d_i(\\theta) - d_i(\\bar\\theta)\\bigr) z_i + \\mu,

where :math:`d_i` is the directional derivative along :math:`z_i`: a JVP (FmAD-SVRG) or a
central difference (ZO-SVRG; MeZO-SVRG, Gautam et al., arXiv 2404.08080). References for the
comparison: Panchal et al., arXiv 2506.21833.

At the anchor itself (:math:`\\theta = \\bar\\theta`) the two differences, both taken on the
current batch along the same directions, cancel exactly and :math:`g = \\mu`: successive estimates
at fixed parameters *repeat* :math:`\\mu` until the next refresh, so averaging them does not
reduce the variance (the estimator's randomness is spent on :math:`\\mu`; it is unbiased over
the anchor's directions, not over the repeats).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import Tensor

from dxopt._core.replay import replayed_forwards
from dxopt.estimators._accounting import ProbesOnce, flop_scope
from dxopt.estimators._api import (
    Cost,
    Estimate,
    LossFn,
    check_count,
    check_failure_policy,
    check_positive,
    nonfinite_status,
    split_trainable,
    write_grads,
)
from dxopt.estimators._directions import Distribution, check_distribution, direction, draw_seeds
from dxopt.estimators._forward_gradient import jvp_loss
from dxopt.estimators._zeroth_order import SPSA

Kind = Literal["zo", "fmad"]


class _SVRG(ProbesOnce):
    kind: Kind = "zo"

    def __init__(
        self,
        *,
        refresh_every: int = 20,
        n_directions: int = 1,
        anchor_directions: int = 16,
        anchor_batch: Any = None,
        eps: float = 1e-3,
        distribution: Distribution = "gaussian",
        seed: int = 0,
        validate: bool = True,
        on_failure: str = "raise",
    ) -> None:
        check_count("refresh_every", refresh_every)
        check_count("n_directions", n_directions)
        check_count("anchor_directions", anchor_directions)
        check_positive("eps", eps)
        check_distribution(distribution)
        self.refresh_every, self.n_directions = refresh_every, n_directions
        self.anchor_directions, self.anchor_batch = anchor_directions, anchor_batch
        self.eps, self.distribution, self.validate = eps, distribution, validate
        self.on_failure = check_failure_policy(on_failure)
        self.generator = torch.Generator().manual_seed(seed)
        self._spsa = SPSA(eps=eps, distribution=distribution, validate=False)
        self._anchor: dict[str, Tensor] | None = None
        self._mu: dict[str, Tensor] | None = None
        self._calls = 0

    @property
    def anchor_estimate(self) -> dict[str, Tensor] | None:
        """The anchor's estimate :math:`\\mu` (``None`` before the first call)."""
        return self._mu

    def _derivatives(
        self, loss_fn: LossFn, params: dict[str, Tensor], batch: Any, seeds: list[int]
    ) -> tuple[list[float], list[float]]:
        """Directional derivatives ``d_i`` along the seeded directions, and the losses."""
        if self.kind == "zo":
            return self._spsa.projected_grads(loss_fn, params, batch, seeds)
        dds, losses = [], []
        for seed in seeds:
            loss, dd = jvp_loss(loss_fn, params, direction(params, seed, self.distribution), batch)
            dds.append(float(dd))
            losses.append(float(loss))
        return dds, losses

    def _accumulate(
        self, out: dict[str, Tensor], seeds: list[int], coeffs: list[float], scale: float
    ) -> None:
        for seed, c in zip(seeds, coeffs):
            if c != c or abs(c) == float("inf"):
                continue
            for name, z in direction(out, seed, self.distribution).items():
                out[name].add_(z, alpha=scale * c)

    def estimate(
        self,
        loss_fn: LossFn,
        params: Mapping[str, Tensor],
        batch: Any,
        *,
        count_flops: bool = False,
    ) -> Estimate:
        """Refresh the anchor if due, then return the control-variate estimate (added to
        ``.grad``); all forwards of the estimate see one RNG state
        (:mod:`dxopt._core.replay`)."""
        trainable, loss_of = split_trainable(loss_fn, params)
        with replayed_forwards(loss_of) as forward:
            return self._estimate(forward, trainable, batch, count_flops)

    def _estimate(
        self, loss_fn: LossFn, params: Mapping[str, Tensor], batch: Any, count_flops: bool
    ) -> Estimate:
        checked = self._checked_params(loss_fn, params, batch)
        current = {n: p.detach() for n, p in checked.items()}
        passes = 0
        nonfinite = 0
        values = 0  # directional derivatives (or differences of them) combined
        refreshed = self._calls % self.refresh_every == 0 or self._anchor is None
        with flop_scope(count_flops) as tally, torch.no_grad():
            if refreshed:
                anchor_batch = batch if self.anchor_batch is None else self.anchor_batch
                self._anchor = {n: p.clone() for n, p in current.items()}
                seeds = draw_seeds(self.generator, self.anchor_directions)
                dds, _ = self._derivatives(loss_fn, self._anchor, anchor_batch, seeds)
                bad = _count_nonfinite(dds)
                nonfinite, values = nonfinite + bad, values + len(dds)
                self._mu = {
                    n: torch.zeros_like(p) if bad < len(dds) else torch.full_like(p, math.nan)
                    for n, p in current.items()
                }
                if bad < len(dds):
                    self._accumulate(self._mu, seeds, dds, 1.0 / (len(dds) - bad))
                passes += len(seeds)
            assert self._anchor is not None and self._mu is not None
            seeds = draw_seeds(self.generator, self.n_directions)
            here, losses = self._derivatives(loss_fn, current, batch, seeds)
            there, _ = self._derivatives(loss_fn, self._anchor, batch, seeds)
            passes += 2 * len(seeds)
            diffs = [a - b for a, b in zip(here, there)]
            bad = _count_nonfinite(diffs)
            nonfinite, values = nonfinite + bad, values + len(diffs)
            status = nonfinite_status(self.on_failure, type(self).__name__, nonfinite, values)
            grads = {n: m.clone() for n, m in self._mu.items()}
            if bad == len(diffs):
                grads = {n: torch.full_like(g, math.nan) for n, g in grads.items()}
            else:
                self._accumulate(grads, seeds, diffs, 1.0 / (len(diffs) - bad))
        self._calls += 1
        write_grads(checked, grads)
        if self.kind == "zo":
            cost = Cost(forwards=2 * passes, flops=tally.flops)
        else:
            cost = Cost(jvps=passes, flops=tally.flops)
        info = {"refreshed": refreshed, "nonfinite": nonfinite, "seeds": seeds}
        loss = sum(losses) / len(losses)
        return Estimate(grads=grads, loss=loss, cost=cost, info=info, status=status)


class ZOSVRG(_SVRG):
    """ZO-SVRG (MeZO-SVRG): central differences with an SVRG control variate.

    Args:
        refresh_every: estimates between anchor refreshes.
        n_directions: shared directions per estimate (2 forwards each at θ and at the anchor).
        anchor_directions: directions of the anchor estimate :math:`\\mu`.
        anchor_batch: batch for :math:`\\mu` (e.g. a large batch); ``None`` uses the current one.
        eps: perturbation size.
        distribution: ``"gaussian"`` or ``"rademacher"``.
        seed: generator seed; two estimators built with the same seed (the default 0
            included) draw identical directions.
        validate: run the first-call probe.
        on_failure: non-finite differences (at the anchor or the current point), as for
            :class:`SPSA`: ``"raise"`` (:class:`~dxopt.estimators.EstimateError`, nothing
            written to ``.grad``), ``"warn"`` or ``"ignore"`` (the finite ones averaged, NaN
            when none is finite, ``status`` ``FAILED``).

    At fixed parameters successive estimates repeat the anchor estimate :math:`\\mu` until the
    next refresh (module docstring). Parameters with ``requires_grad=False`` are frozen.
    """

    kind: Kind = "zo"


class FmADSVRG(_SVRG):
    """FmAD-SVRG: JVP directional derivatives with an SVRG control variate.

    Same arguments as :class:`ZOSVRG` (``eps`` unused).
    """

    kind: Kind = "fmad"


def _count_nonfinite(values: list[float]) -> int:
    return sum(1 for v in values if v != v or abs(v) == float("inf"))
