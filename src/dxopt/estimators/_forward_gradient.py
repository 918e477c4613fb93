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

from dxopt._core import check_choice
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
    raise_unused,
    split_trainable,
    write_grads,
)
from dxopt.estimators._directions import (
    Distribution,
    check_distribution,
    direction,
    draw_seeds,
    iter_direction,
    top_magnitude_masks,
)

Combine = Literal["mean", "projection"]


def jvp_loss(
    loss_fn: LossFn, primals: Mapping[str, Tensor], tangents: Mapping[str, Tensor], batch: Any
) -> tuple[Tensor, Tensor]:
    """``(loss, grad·tangent)`` by one dual forward pass (:mod:`torch.autograd.forward_ad`,
    the mechanism behind :func:`torch.func.jvp`); no graph is recorded.

    Raises:
        ValueError: if no tangent reaches the loss (it does not read ``primals``), rather
            than returning a zero directional derivative.
    """
    with torch.no_grad(), fwAD.dual_level():
        duals = {n: fwAD.make_dual(p, tangents[n]) for n, p in primals.items()}
        out = fwAD.unpack_dual(check_scalar_loss(loss_fn(duals, batch)))
    if out.tangent is None:
        raise_unused(list(primals))
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
        seed: seed of the estimator's generator of tangent seeds. Two estimators built with
            the same seed (the default 0 included) draw identical tangents, call after call;
            give each run or worker its own seed for independent draws.
        validate: run the scalar-loss / unused-parameter probe on the first call.
        on_failure: a non-finite JVP: ``"raise"`` (:class:`~dxopt.estimators.EstimateError`,
            nothing written to ``.grad``), ``"warn"`` (:class:`dxopt.DxoptWarning`) or
            ``"ignore"``; under the last two the estimate leaves the non-finite JVPs out
            (``info["nan_jvps"]`` counts them), is all NaN when none is finite, and has
            ``status`` ``FAILED``.

    Sparse tangents (``keep_fraction``): with the 0/1 mask :math:`m` of the kept entries
    (chosen from :math:`|\\theta|` at the start of the estimate, so fixed given
    :math:`\\theta`), ``"mean"`` is unbiased for the *masked* gradient
    :math:`m \\odot \\nabla\\ell`, not for :math:`\\nabla\\ell` (the other entries get 0);
    ``"projection"`` has mean :math:`\\frac{k}{|m|} m \\odot \\nabla\\ell` (Gaussian tangents,
    :math:`k \\le |m|`, the number of kept entries).

    Tangents are never stored: each is regenerated from its seed (one
    :class:`torch.Generator` per direction) when it is needed, so an estimate holds at most
    one tangent and the gradient buffer, i.e. two parameter-sized tensors, for any ``k``.
    ``"projection"`` regenerates tangents :math:`k(k+1)/2` times for the Gram matrix
    :math:`V^\\top V` (random-number generation traded for memory).

    Non-finite JVPs follow ``on_failure``. The ``k`` forwards see the same RNG state (same
    dropout mask) and update module buffers once (see :mod:`dxopt._core.replay`).
    Parameters with ``requires_grad=False`` are frozen
    (:func:`~dxopt.estimators._api.split_trainable`).
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
        on_failure: str = "raise",
    ) -> None:
        check_count("k", k)
        check_choice("combine", combine, ("mean", "projection"))
        check_distribution(distribution)
        check_keep_fraction(keep_fraction)
        if jvp_clip is not None:
            check_positive("jvp_clip", jvp_clip)
        self.k, self.combine, self.distribution = k, combine, distribution
        self.keep_fraction, self.jvp_clip, self.validate = keep_fraction, jvp_clip, validate
        self.on_failure = check_failure_policy(on_failure)
        self.generator = torch.Generator().manual_seed(seed)

    def estimate(
        self,
        loss_fn: LossFn,
        params: Mapping[str, Tensor],
        batch: Any,
        *,
        count_flops: bool = False,
    ) -> Estimate:
        """Estimate the gradient with ``k`` JVPs, add it to ``.grad`` and return it."""
        trainable, loss_of = split_trainable(loss_fn, params)
        with replayed_forwards(loss_of) as forward:
            params = self._checked_params(forward, trainable, batch)
            primals = {n: p.detach() for n, p in params.items()}
            masks = top_magnitude_masks(primals, self.keep_fraction) if self.keep_fraction else None
            seeds = draw_seeds(self.generator, self.k)
            jvps: list[float] = []
            kept: list[tuple[float, int]] = []  # (clipped derivative, seed)
            losses: list[float] = []
            with flop_scope(count_flops) as tally:
                for seed in seeds:
                    tangent = direction(primals, seed, self.distribution, masks)
                    loss, dd = jvp_loss(forward, primals, tangent, batch)
                    del tangent
                    losses.append(float(loss))
                    value = float(dd)
                    jvps.append(value)
                    if not math.isfinite(value):
                        continue
                    if self.jvp_clip is not None:
                        value = max(-self.jvp_clip, min(self.jvp_clip, value))
                    kept.append((value, seed))
                status = nonfinite_status(
                    self.on_failure,
                    "ForwardGradient",
                    len(seeds) - len(kept),
                    len(seeds),
                    what="JVPs",
                )
                grads = self._combine(primals, kept, masks)
        write_grads(params, grads)
        info = {"jvps": jvps, "nan_jvps": len(seeds) - len(kept), "seeds": seeds}
        cost = Cost(jvps=self.k, flops=tally.flops)
        return Estimate(grads=grads, loss=_mean(losses), cost=cost, info=info, status=status)

    def _combine(
        self,
        primals: dict[str, Tensor],
        kept: list[tuple[float, int]],
        masks: dict[str, Tensor] | None,
    ) -> dict[str, Tensor]:
        if self.combine == "mean":
            coeffs = [dd / len(kept) for dd, _ in kept]
        else:
            coeffs = self._projection_coefficients(primals, kept, masks) if kept else []
        if not kept:  # every JVP was non-finite: there is no estimate
            return {n: torch.full_like(p, math.nan) for n, p in primals.items()}
        grads = {n: torch.zeros_like(p) for n, p in primals.items()}
        with torch.no_grad():
            for c, (_, seed) in zip(coeffs, kept):
                for n, v in iter_direction(primals, seed, self.distribution, masks):
                    grads[n].add_(v, alpha=c)
        return grads

    def _projection_coefficients(
        self,
        primals: dict[str, Tensor],
        kept: list[tuple[float, int]],
        masks: dict[str, Tensor] | None,
    ) -> list[float]:
        """Solve :math:`(V^\\top V) c = V^\\top\\nabla\\ell` for the projection coefficients.

        Row ``i`` of the Gram matrix is built with tangent ``i`` materialised and tangents
        ``j <= i`` regenerated one parameter at a time (each inner product as a ``(1, n) @
        (n, 1)`` product in the parameters' dtype: :math:`2n` FLOPs, :math:`k(k+1)/2` of
        them), so at most two parameter-sized tensors are alive.
        """
        k = len(kept)
        gram = torch.zeros(k, k, dtype=torch.float64)
        for i, (_, seed_i) in enumerate(kept):
            v_i = direction(primals, seed_i, self.distribution, masks)
            for j, (_, seed_j) in enumerate(kept[: i + 1]):
                dot = 0.0
                for n, v_j in iter_direction(primals, seed_j, self.distribution, masks):
                    dot += float((v_i[n].reshape(1, -1) @ v_j.reshape(-1, 1))[0, 0])
                gram[i, j] = gram[j, i] = dot
            del v_i
        rhs = torch.tensor([dd for dd, _ in kept], dtype=torch.float64)
        # pinv keeps the orthogonal projection well defined when k > d or tangents repeat.
        coeffs = torch.linalg.pinv(gram, hermitian=True) @ rhs
        return [float(c) for c in coeffs]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
