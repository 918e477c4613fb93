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

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from dxopt.estimators._accounting import ProbesOnce, flop_scope
from dxopt.estimators._api import (
    Cost,
    Estimate,
    LossFn,
    check_count,
    check_keep_fraction,
    check_positive,
    check_scalar_loss,
    write_grads,
)
from dxopt.estimators._directions import (
    Distribution,
    check_distribution,
    draw_seeds,
    iter_direction,
    top_magnitude_masks,
)
from dxopt.estimators._replay import replayed_forwards


class SPSA(ProbesOnce):
    """Two-sided SPSA / MeZO with ``n_directions`` directions and in-place seed replay.

    Args:
        eps: perturbation size :math:`\\epsilon > 0`.
        n_directions: number of directions :math:`n` averaged per estimate.
        distribution: ``"gaussian"`` or ``"rademacher"`` directions.
        keep_fraction: if set, perturb only each parameter's top ``keep_fraction``
            largest-magnitude entries (sparse ZO).
        seed: seed of the estimator's generator of direction seeds.
        validate: run the scalar-loss / unused-parameter probe on the first call.

    The :math:`2n` forwards of one estimate see the same RNG state (same dropout mask) and
    update module buffers (BatchNorm statistics) once, see :mod:`dxopt.estimators._replay`.

    :meth:`estimate` adds :math:`\\hat g` to ``.grad`` (one gradient-sized buffer);
    :meth:`step_` instead applies :math:`\\theta \\leftarrow \\theta - \\eta\\hat g` in place,
    regenerating each :math:`z_i`, and never materialises a gradient.
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
    ) -> None:
        check_positive("eps", eps)
        check_count("n_directions", n_directions)
        check_distribution(distribution)
        check_keep_fraction(keep_fraction)
        self.eps, self.n_directions, self.distribution = eps, n_directions, distribution
        self.keep_fraction, self.validate = keep_fraction, validate
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
        with replayed_forwards(loss_fn) as forward:
            checked = self._checked_params(forward, params, batch)
            self._begin(checked)
            seeds = draw_seeds(self.generator, self.n_directions)
            with flop_scope(count_flops) as tally:
                coeffs, losses = self.projected_grads(forward, checked, batch, seeds)
        return checked, seeds, coeffs, losses, tally.flops

    def _finish(
        self, seeds: list[int], coeffs: list[float], losses: list[float], flops: int | None
    ) -> tuple[Cost, dict[str, Any], float]:
        info = {"seeds": seeds, "projected_grads": coeffs, "nonfinite": _nonfinite(coeffs)}
        cost = Cost(forwards=2 * len(seeds), flops=flops)
        return cost, info, sum(losses) / len(losses)

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
        grads = {n: torch.zeros_like(p) for n, p in checked.items()}
        self.accumulate_(grads, seeds, coeffs, scale=1.0 / len(seeds))
        write_grads(checked, grads)
        cost, info, loss = self._finish(seeds, coeffs, losses, flops)
        return Estimate(grads=grads, loss=loss, cost=cost, info=info)

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
        in place, without materialising the gradient (``Estimate.grads`` is ``None``)."""
        check_positive("lr", lr)
        checked, seeds, coeffs, losses, flops = self._run(loss_fn, params, batch, count_flops)
        with torch.no_grad():
            if weight_decay:
                for p in checked.values():
                    p.mul_(1.0 - lr * weight_decay)
        self.accumulate_(checked, seeds, coeffs, scale=-lr / len(seeds))
        cost, info, loss = self._finish(seeds, coeffs, losses, flops)
        return Estimate(grads=None, loss=loss, cost=cost, info=info)

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
        seed: generator seed.
        validate: run the first-call probe.
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
    ) -> None:
        super().__init__(eps=eps, n_directions=n_directions, seed=seed, validate=validate)
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
