r"""The curvature regulariser: the Gauss-Newton quadratic form of feature drift.

Fine-tuning by :math:`\tau` moves the (L2-normalised) features of a reference input
:math:`x\sim\rho` by :math:`J(x)\tau` to first order, :math:`J = \partial\hat\varphi/\partial
\theta` at :math:`\theta_0`. The expected squared drift is the quadratic form of the
generalised Gauss-Newton matrix with identity output Hessian,

.. math::

    R(\tau) = \mathbb{E}_{x\sim\rho}\,\|J(x)\tau\|_2^2 = \tau^\top G\,\tau,\qquad
    G = \mathbb{E}_{\rho}[J^\top J],

whose gradient is :math:`2G\tau`. It penalises moving along directions in which the
network's features on task-agnostic data curve away, which keeps task vectors from
interfering (TAK: Porrello et al., arXiv 2602.17385; DELTA, arXiv 2605.18993, uses it on the
teacher and the student). The authors approximate :math:`G` per layer with EK-FAC, because
:math:`J` of a large backbone is too costly to apply at every step; for the small models this
module targets, :math:`J(x)\tau` is one Jacobian-vector product, so :math:`R` is computed
exactly (no Kronecker factorisation, no probe noise) on a minibatch of the reference data
(an unbiased estimate of the full expectation) or on all of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp

from dxopt._core import check_int


class CurvaturePenalty:
    r""":math:`R(\tau)=\frac1B\sum_{b}\|J(x_b)\tau\|_2^2` at the pretrained point.

    Args:
        model: the feature extractor :math:`\varphi` (inputs -> features); its current
            weights are copied as :math:`\theta_0`.
        reference_inputs: task-agnostic inputs :math:`x\sim\rho` (first dimension = examples).
        names: keyword-only; the parameters :math:`\tau` may move (default: the trainable ones).
        normalize: keyword-only; penalise the drift of :math:`\varphi/\|\varphi\|_2` (per
            example, as TAK does) rather than of :math:`\varphi`.
        batch_size: keyword-only; examples drawn (without replacement) per call; ``None``
            uses every reference input.
        generator: keyword-only; the random generator for the minibatches.

    Calling ``penalty(tau)`` with a mapping name -> tensor (a :class:`TaskVector`, or the
    live differences :math:`\theta-\theta_0` of a model being trained) returns a scalar
    tensor, differentiable with respect to the entries of ``tau``. Names not in ``tau`` are
    not moved.
    """

    def __init__(
        self,
        model: nn.Module,
        reference_inputs: Tensor,
        *,
        names: Iterable[str] | None = None,
        normalize: bool = True,
        batch_size: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}.")
        if not isinstance(reference_inputs, Tensor) or reference_inputs.ndim < 1:
            raise TypeError(
                "reference_inputs: expected a tensor whose first dimension indexes examples, "
                f"got {type(reference_inputs).__name__}."
            )
        n_ref = reference_inputs.shape[0]
        if n_ref == 0:
            raise ValueError("reference_inputs: got no examples.")
        if batch_size is not None:
            check_int("batch_size", batch_size, hint="or None for every reference input")
        if batch_size is not None and batch_size > n_ref:
            raise ValueError(
                f"batch_size: expected an integer in [1, {n_ref}] (the number of reference "
                f"inputs) or None, got {batch_size}."
            )
        self.model = model
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        chosen = (
            [n for n, p in model.named_parameters() if p.requires_grad]
            if names is None
            else list(names)
        )
        unknown = [n for n in chosen if n not in params]
        if unknown or not chosen:
            raise ValueError(
                f"names: expected some of the model's parameters {sorted(params)}, got {chosen}."
            )
        self.names = tuple(chosen)
        self.theta0 = params
        self.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        self.reference_inputs = reference_inputs.detach()
        self.normalize = normalize
        self.batch_size = batch_size
        self.generator = generator

    def _features(self, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        out = functional_call(self.model, ({**self.theta0, **params}, self.buffers), (x,))
        if not isinstance(out, Tensor):
            raise TypeError(
                f"model: the feature extractor must return one tensor, got {type(out).__name__}."
            )
        out = out.reshape(out.shape[0], -1)
        return nn.functional.normalize(out, dim=1) if self.normalize else out

    def drift(self, tau: Mapping[str, Tensor], x: Tensor | None = None) -> Tensor:
        r""":math:`J(x)\tau` for each example (rows), on ``x`` or a reference minibatch."""
        if x is None:
            x = self.reference_inputs
            if self.batch_size is not None:
                idx = torch.randperm(x.shape[0], generator=self.generator)[: self.batch_size]
                x = x[idx.to(x.device)]
        extra = [n for n in tau if n not in self.names]
        if extra:
            raise ValueError(
                f"tau: {extra} are not among the penalised parameters {list(self.names)}."
            )
        if not tau:
            raise ValueError("tau: got an empty mapping.")
        primals = {n: self.theta0[n] for n in tau}
        tangents = {n: tau[n] for n in tau}
        for n in tau:
            if tangents[n].shape != primals[n].shape:
                raise ValueError(
                    f"tau[{n!r}]: expected shape {tuple(primals[n].shape)}, "
                    f"got {tuple(tangents[n].shape)}."
                )

        def f(p: dict[str, Tensor]) -> Any:
            return self._features(p, x)

        return jvp(f, (primals,), (tangents,))[1]

    def __call__(self, tau: Mapping[str, Tensor], x: Tensor | None = None) -> Tensor:
        return self.drift(tau, x).pow(2).sum(dim=1).mean()
