"""Forward gradients: directional derivatives by forward-mode AD, no backward pass.

For tangents :math:`v_1,\\dots,v_k` and :math:`d_i = \\nabla\\ell(\\theta)^\\top v_i` (one JVP
each, forward-mode AD):

- mean (Baydin et al., arXiv 2202.08587): :math:`g = \\frac1k\\sum_i d_i v_i`, unbiased for
  tangents with :math:`\\mathbb E[vv^\\top] = I`. For Gaussian tangents
  :math:`\\mathbb E\\|g\\|^2 = \\frac{d+1+k}{k}\\|\\nabla\\ell\\|^2`, i.e. a variance
  :math:`\\frac{d+1}{k}\\|\\nabla\\ell\\|^2 \\approx \\frac{d+2}{k}\\|\\nabla\\ell\\|^2`;
- projection (Flügel et al., arXiv 2410.17764):
  :math:`g = V(V^\\top V)^{-1}V^\\top\\nabla\\ell`, the orthogonal projection of the gradient
  onto the span of the tangents. For isotropic tangents :math:`\\mathbb E[g] =
  \\frac kd\\nabla\\ell` (shrunk, not unbiased), with a much smaller error per direction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from dxopt.estimators._accounting import ProbesOnce, flop_scope
from dxopt.estimators._api import (
    Cost,
    Estimate,
    LossFn,
    check_count,
    check_positive,
    check_scalar_loss,
    write_grads,
)
from dxopt.estimators._directions import (
    Distribution,
    check_distribution,
    direction,
    draw_seeds,
    top_magnitude_masks,
)

Combine = Literal["mean", "projection"]


def jvp_loss(
    loss_fn: LossFn, primals: Mapping[str, Tensor], tangents: Mapping[str, Tensor], batch: Any
) -> tuple[Tensor, Tensor]:
    """``(loss, grad·tangent)`` by one dual forward pass (:mod:`torch.autograd.forward_ad`,
    the mechanism behind :func:`torch.func.jvp`); no graph is recorded."""
    with torch.no_grad(), fwAD.dual_level():
        duals = {n: fwAD.make_dual(p, tangents[n]) for n, p in primals.items()}
        out = fwAD.unpack_dual(check_scalar_loss(loss_fn(duals, batch)))
    if out.tangent is None:  # the loss does not depend on any tangent
        return out.primal, torch.zeros((), dtype=out.primal.dtype)
    return out.primal, out.tangent.reshape(())


class ForwardGradient(ProbesOnce):
    """Forward gradient with ``k`` tangents, combined by mean or orthogonal projection.

    Args:
        k: number of tangents (JVPs) per estimate.
        combine: ``"mean"`` or ``"projection"`` (see the module docstring).
        distribution: ``"gaussian"`` or ``"rademacher"`` tangents.
        keep_fraction: if set, tangents are zero except on each parameter's top
            ``keep_fraction`` largest-magnitude entries (sparse variant).
        jvp_clip: if set, each directional derivative is clipped to ``[-jvp_clip, jvp_clip]``.
        seed: seed of the estimator's generator of tangent seeds.
        validate: run the scalar-loss / unused-parameter probe on the first call.

    Non-finite JVPs are skipped and counted in ``info["nan_jvps"]`` (the estimate is zero
    when all are non-finite).
    """

    def __init__(
        self,
        *,
        k: int = 1,
        combine: Combine = "mean",
        distribution: Distribution = "gaussian",
        keep_fraction: float | None = None,
        jvp_clip: float | None = None,
        seed: int = 0,
        validate: bool = True,
    ) -> None:
        check_count("k", k)
        if combine not in ("mean", "projection"):
            raise ValueError(f"combine: expected 'mean' or 'projection', got {combine!r}.")
        check_distribution(distribution)
        if keep_fraction is not None and not 0 < keep_fraction <= 1:
            raise ValueError(f"keep_fraction: expected a number in (0, 1], got {keep_fraction!r}.")
        if jvp_clip is not None:
            check_positive("jvp_clip", jvp_clip)
        self.k, self.combine, self.distribution = k, combine, distribution
        self.keep_fraction, self.jvp_clip, self.validate = keep_fraction, jvp_clip, validate
        self.generator = torch.Generator().manual_seed(seed)

    def estimate(
        self,
        loss_fn: LossFn,
        params: Mapping[str, Tensor],
        batch: Any,
        *,
        count_flops: bool = False,
    ) -> Estimate:
        """Estimate the gradient with ``k`` JVPs, write it to ``.grad`` and return it."""
        params = self._checked_params(loss_fn, params, batch)
        primals = {n: p.detach() for n, p in params.items()}
        masks = top_magnitude_masks(primals, self.keep_fraction) if self.keep_fraction else None
        seeds = draw_seeds(self.generator, self.k)
        jvps: list[float] = []
        kept: list[tuple[float, dict[str, Tensor]]] = []
        losses: list[float] = []
        with flop_scope(count_flops) as tally:
            for seed in seeds:
                tangent = direction(primals, seed, self.distribution, masks)
                loss, dd = jvp_loss(loss_fn, primals, tangent, batch)
                losses.append(float(loss))
                value = float(dd)
                jvps.append(value)
                if not math.isfinite(value):
                    continue
                if self.jvp_clip is not None:
                    value = max(-self.jvp_clip, min(self.jvp_clip, value))
                kept.append((value, tangent))
            grads = self._combine(primals, kept)
        write_grads(params, grads)
        info = {"jvps": jvps, "nan_jvps": len(seeds) - len(kept), "seeds": seeds}
        cost = Cost(jvps=self.k, flops=tally.flops)
        return Estimate(grads=grads, loss=_mean(losses), cost=cost, info=info)

    def _combine(
        self, primals: dict[str, Tensor], kept: list[tuple[float, dict[str, Tensor]]]
    ) -> dict[str, Tensor]:
        grads = {n: torch.zeros_like(p) for n, p in primals.items()}
        if not kept:
            return grads
        if self.combine == "mean":
            coeffs = [dd / len(kept) for dd, _ in kept]
        else:
            coeffs = _projection_coefficients(kept)
        for c, (_, tangent) in zip(coeffs, kept):
            for n, v in tangent.items():
                grads[n].add_(v, alpha=c)
        return grads


def _projection_coefficients(kept: list[tuple[float, dict[str, Tensor]]]) -> list[float]:
    """Solve :math:`(V^\\top V) c = V^\\top\\nabla\\ell` for the projection coefficients."""
    names = list(kept[0][1])
    gram = sum(
        torch.stack([t[n].reshape(-1).double() for _, t in kept])
        @ torch.stack([t[n].reshape(-1).double() for _, t in kept]).T
        for n in names
    )
    assert isinstance(gram, Tensor)
    rhs = torch.tensor([dd for dd, _ in kept], dtype=torch.float64)
    # pinv keeps the orthogonal projection well defined when k > d or tangents repeat.
    coeffs = torch.linalg.pinv(gram, hermitian=True) @ rhs
    return [float(c) for c in coeffs]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
