"""Zeroth-order gradients: SPSA / MeZO with in-place seed replay, and LOZO.

Two-sided SPSA with :math:`n` directions (Spall 1992; MeZO, Malladi et al., arXiv 2305.17333):

.. math:: \\hat g = \\frac1n\\sum_{i=1}^n c_i z_i,\\qquad
          c_i = \\frac{\\ell(\\theta+\\epsilon z_i) - \\ell(\\theta-\\epsilon z_i)}{2\\epsilon}.

The perturbations are applied *in place* and undone (:math:`+\\epsilon z`, :math:`-2\\epsilon
z`, :math:`+\\epsilon z`), each :math:`z_i` regenerated from its seed, so memory stays at the
inference level; the estimate is just the pairs :math:`(\\text{seed}_i, c_i)`. On a quadratic
the central difference is exact, :math:`c_i = \\nabla\\ell^\\top z_i`, so for Gaussian
:math:`z` the estimate is unbiased.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from dxopt._core import Status
from dxopt._core.replay import replayed_forwards
from dxopt.estimators._accounting import ProbesOnce, flop_scope
from dxopt.estimators._api import (
    Cost,
    Estimate,
    LossFn,
    check_count,
    check_failure_policy,
    check_keep_fraction,
    check_positive,
    check_scalar_loss,
    nonfinite_status,
    split_trainable,
    write_grads,
)
from dxopt.estimators._directions import (
    Distribution,
    check_distribution,
    draw_seeds,
    iter_direction,
    top_magnitude_masks,
)


class SPSA(ProbesOnce):
    """Two-sided SPSA / MeZO with ``n_directions`` directions and in-place seed replay.

    Args:
        eps: perturbation size :math:`\\epsilon > 0`.
        n_directions: number of directions :math:`n` averaged per estimate.
        distribution: ``"gaussian"`` or ``"rademacher"`` directions.
        keep_fraction: if set, perturb only each parameter's top ``keep_fraction``
            largest-magnitude entries (sparse ZO). With the 0/1 mask :math:`m` of those
            entries (chosen from :math:`|\\theta|` at the start of the estimate, so fixed given
            :math:`\\theta`) the directions are :math:`m \\odot z` and the estimate is unbiased
            (on a quadratic; up to :math:`O(\\epsilon^2)` otherwise) for the *masked*
            gradient :math:`m \\odot \\nabla\\ell`, not for :math:`\\nabla\\ell`: the other
            entries get 0.
        seed: seed of the estimator's generator of direction seeds. Two estimators built with
            the same seed (the default 0 included) draw identical directions, call after
            call; give each run or worker its own seed for independent draws.
        validate: run the scalar-loss / unused-parameter probe on the first call.
        on_failure: a non-finite central difference (the loss is NaN or inf at
            :math:`\\theta \\pm \\epsilon z`): ``"raise"``
            (:class:`~dxopt.estimators.EstimateError`; nothing is written to ``.grad`` and
            :meth:`step_` leaves the parameters as they were), ``"warn"``
            (:class:`dxopt.DxoptWarning`) or ``"ignore"``; under the last two the estimate
            averages the finite differences only (``info["nonfinite"]`` counts the others),
            is all NaN when none is finite, and has ``status`` ``FAILED``.

    The :math:`2n` forwards of one estimate see the same RNG state (same dropout mask) and
    update module buffers (BatchNorm statistics) once, see :mod:`dxopt._core.replay`.

    :meth:`estimate` adds :math:`\\hat g` to ``.grad`` (one gradient-sized buffer);
    :meth:`step_` instead applies :math:`\\theta \\leftarrow \\theta - \\eta\\hat g` in place,
    regenerating each :math:`z_i`, and never materialises a gradient. Parameters with
    ``requires_grad=False`` are frozen (:func:`~dxopt.estimators._api.split_trainable`).
    """

    def __init__(
        self,
        *,
        eps: float = 1e-3,
        n_directions: int = 1,
        distribution: Distribution = "gaussian",
        keep_fraction: float | None = None,
        seed: int = 0,
        validate: bool = True,
        on_failure: str = "raise",
    ) -> None:
        check_positive("eps", eps)
        check_count("n_directions", n_directions)
        check_distribution(distribution)
        check_keep_fraction(keep_fraction)
        self.eps, self.n_directions, self.distribution = eps, n_directions, distribution
        self.keep_fraction, self.validate = keep_fraction, validate
        self.on_failure = check_failure_policy(on_failure)
        self.generator = torch.Generator().manual_seed(seed)
        self._masks: dict[str, Tensor] | None = None

    # -- directions (overridden by LOZO) ------------------------------------------------
    def _begin(self, params: dict[str, Tensor]) -> None:
        """Per-estimate setup (masks of the sparse variant)."""
        self._masks = (
            top_magnitude_masks(params, self.keep_fraction) if self.keep_fraction else None
        )

    def _directions(self, params: Mapping[str, Tensor], seed: int) -> Iterator[tuple[str, Tensor]]:
        return iter_direction(params, seed, self.distribution, self._masks)

    def _grad_scale(self, name: str) -> float:
        return 1.0

    # -- the estimate --------------------------------------------------------------------
    def perturb_(self, params: Mapping[str, Tensor], seed: int, scale: float) -> None:
        """:math:`\\theta \\leftarrow \\theta + \\text{scale}\\cdot z(\\text{seed})`, in place."""
        with torch.no_grad():
            for name, z in self._directions(params, seed):
                params[name].add_(z, alpha=scale)

    def projected_grads(
        self, loss_fn: LossFn, params: dict[str, Tensor], batch: Any, seeds: list[int]
    ) -> tuple[list[float], list[float]]:
        """Return ``(c_i, mean losses)`` for each seed; parameters are restored afterwards."""
        coeffs, losses = [], []
        with torch.no_grad():
            for seed in seeds:
                self.perturb_(params, seed, self.eps)
                plus = float(check_scalar_loss(loss_fn(params, batch)))
                self.perturb_(params, seed, -2.0 * self.eps)
                minus = float(check_scalar_loss(loss_fn(params, batch)))
                self.perturb_(params, seed, self.eps)
                coeffs.append((plus - minus) / (2.0 * self.eps))
                losses.append(0.5 * (plus + minus))
        return coeffs, losses

    def _run(
        self, loss_fn: LossFn, params: Mapping[str, Tensor], batch: Any, count_flops: bool
    ) -> tuple[dict[str, Tensor], list[int], list[float], list[float], int | None]:
        trainable, loss_of = split_trainable(loss_fn, params)
        with replayed_forwards(loss_of) as forward:
            checked = self._checked_params(forward, trainable, batch)
            self._begin(checked)
            seeds = draw_seeds(self.generator, self.n_directions)
            with flop_scope(count_flops) as tally:
                coeffs, losses = self.projected_grads(forward, checked, batch, seeds)
        return checked, seeds, coeffs, losses, tally.flops

    def _finish(
        self, seeds: list[int], coeffs: list[float], losses: list[float], flops: int | None
    ) -> tuple[Cost, dict[str, Any], float, Status, float]:
        """Cost, info, mean loss, status (``on_failure`` applied) and the scale ``1 / n``
        over the ``n`` finite differences (NaN when there is none)."""
        bad = _nonfinite(coeffs)
        status = nonfinite_status(
            self.on_failure, type(self).__name__, bad, len(coeffs), what="central differences"
        )
        info = {"seeds": seeds, "projected_grads": coeffs, "nonfinite": bad}
        cost = Cost(forwards=2 * len(seeds), flops=flops)
        finite = len(coeffs) - bad
        return cost, info, sum(losses) / len(losses), status, 1.0 / finite if finite else math.nan

    def estimate(
        self,
        loss_fn: LossFn,
        params: Mapping[str, Tensor],
        batch: Any,
        *,
        count_flops: bool = False,
    ) -> Estimate:
        """Estimate the gradient with ``2 n`` forwards, write it to ``.grad`` and return it."""
        checked, seeds, coeffs, losses, flops = self._run(loss_fn, params, batch, count_flops)
        cost, info, loss, status, scale = self._finish(seeds, coeffs, losses, flops)
        if math.isnan(scale):  # no finite difference: no estimate
            grads = {n: torch.full_like(p, math.nan) for n, p in checked.items()}
        else:
            grads = {n: torch.zeros_like(p) for n, p in checked.items()}
            self.accumulate_(grads, seeds, coeffs, scale=scale)
        write_grads(checked, grads)
        return Estimate(grads=grads, loss=loss, cost=cost, info=info, status=status)

    def step_(
        self,
        loss_fn: LossFn,
        params: Mapping[str, Tensor],
        batch: Any,
        *,
        lr: float,
        weight_decay: float = 0.0,
        count_flops: bool = False,
    ) -> Estimate:
        """Fused MeZO step :math:`\\theta \\leftarrow \\theta - \\eta(\\hat g + \\lambda\\theta)`,
        in place, without materialising the gradient (``Estimate.grads`` is ``None``). When no
        central difference is finite (and ``on_failure`` is not ``"raise"``) there is no
        estimate and the parameters are left as they were (``status`` ``FAILED``)."""
        check_positive("lr", lr)
        checked, seeds, coeffs, losses, flops = self._run(loss_fn, params, batch, count_flops)
        cost, info, loss, status, scale = self._finish(seeds, coeffs, losses, flops)
        if math.isnan(scale):  # no estimate (status FAILED): no step
            return Estimate(grads=None, loss=loss, cost=cost, info=info, status=status)
        with torch.no_grad():
            if weight_decay:
                for p in checked.values():
                    p.mul_(1.0 - lr * weight_decay)
        self.accumulate_(checked, seeds, coeffs, scale=-lr * scale)
        return Estimate(grads=None, loss=loss, cost=cost, info=info, status=status)

    def accumulate_(
        self, out: Mapping[str, Tensor], seeds: list[int], coeffs: list[float], *, scale: float
    ) -> None:
        """``out += scale * sum_i c_i z_i`` (non-finite :math:`c_i` skipped), replaying seeds."""
        with torch.no_grad():
            for seed, c in zip(seeds, coeffs):
                if c != c or abs(c) == float("inf"):
                    continue
                for name, z in self._directions(out, seed):
                    out[name].add_(z, alpha=scale * c * self._grad_scale(name))


class LOZO(SPSA):
    """Low-rank ZO (LOZO, Chen et al., ICLR 2025, arXiv 2410.07698).

    Each matrix parameter :math:`X\\in\\mathbb R^{m\\times n}` is perturbed by
    :math:`UV^\\top` with :math:`U\\in\\mathbb R^{m\\times r}` drawn fresh from each seed and
    :math:`V\\in\\mathbb R^{n\\times r}` redrawn only every ``lazy_steps`` estimates;
    other parameters get Gaussian perturbations. The estimate is
    :math:`\\hat g_X = c\\,UV^\\top / r`, unbiased over :math:`U` and :math:`V`
    (:math:`\\mathbb E[UV^\\top\\langle G, UV^\\top\\rangle] = rG`).

    Args:
        eps: perturbation size.
        rank: :math:`r`.
        lazy_steps: :math:`\\nu`, estimates between redraws of :math:`V`.
        n_directions: directions averaged per estimate.
        seed: generator seed (the same seed gives the same draws, see :class:`SPSA`).
        validate: run the first-call probe.
        on_failure: non-finite differences, as for :class:`SPSA`.
    """

    def __init__(
        self,
        *,
        eps: float = 1e-3,
        rank: int = 2,
        lazy_steps: int = 50,
        n_directions: int = 1,
        seed: int = 0,
        validate: bool = True,
        on_failure: str = "raise",
    ) -> None:
        super().__init__(
            eps=eps,
            n_directions=n_directions,
            seed=seed,
            validate=validate,
            on_failure=on_failure,
        )
        check_count("rank", rank)
        check_count("lazy_steps", lazy_steps)
        self.rank, self.lazy_steps = rank, lazy_steps
        self._v: dict[str, Tensor] = {}
        self._calls = 0

    def _begin(self, params: dict[str, Tensor]) -> None:
        if self._calls % self.lazy_steps == 0 or set(self._v) != {
            n for n, p in params.items() if p.ndim == 2
        }:
            gen = torch.Generator().manual_seed(draw_seeds(self.generator, 1)[0])
            self._v = {
                n: torch.randn(p.shape[1], self.rank, generator=gen, dtype=p.dtype).to(p.device)
                for n, p in params.items()
                if p.ndim == 2
            }
        self._calls += 1

    def _directions(self, params: Mapping[str, Tensor], seed: int) -> Iterator[tuple[str, Tensor]]:
        device = next(iter(params.values())).device
        gen = torch.Generator(device=device).manual_seed(seed)
        for name, p in params.items():
            if name in self._v:
                u = torch.randn(p.shape[0], self.rank, generator=gen, dtype=p.dtype, device=device)
                yield name, u @ self._v[name].T
            else:
                yield name, torch.randn(p.shape, generator=gen, dtype=p.dtype, device=device)

    def _grad_scale(self, name: str) -> float:
        return 1.0 / self.rank if name in self._v else 1.0


def _nonfinite(values: list[float]) -> int:
    return sum(1 for v in values if v != v or abs(v) == float("inf"))
