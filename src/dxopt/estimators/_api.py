"""Shared types of the estimators: the loss signature, the cost record, the estimate.

Every estimator takes a loss function that is *pure in named parameters*,

.. math:: \\ell = \\mathrm{loss\\_fn}(\\theta, \\mathrm{batch}),\\qquad
          \\theta = \\{\\mathrm{name}: \\mathrm{Tensor}\\},

(the shape of :func:`torch.func.functional_call`), the parameters and a batch, and returns an
:class:`Estimate` holding the gradient estimate, the loss and a :class:`Cost`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from dxopt._core import Cost, check_int, check_range
from dxopt._core import check_positive as _core_positive

LossFn = Callable[[Mapping[str, Tensor], Any], Tensor]
"""``loss_fn(params, batch) -> scalar Tensor``, pure in ``params``."""


@dataclass(frozen=True)
class Estimate:
    """The result of one gradient estimate.

    Attributes:
        grads: gradient estimate per parameter name, also written to each parameter's
            ``.grad``; ``None`` when the estimator was fused and already updated the
            parameters in place.
        loss: the loss at the unperturbed parameters when it was evaluated, else the mean of
            the perturbed losses (zeroth order).
        cost: the :class:`~dxopt._core.Cost` record (``forwards``, ``backwards``, ``jvps``,
            ``recomputed_forwards``, ``flops``).
        info: method-specific extras, e.g. ``{"jvps": [...], "nan_jvps": 0}`` or the
            ``(seed, projected_grad)`` pairs of a zeroth-order estimate.
    """

    grads: dict[str, Tensor] | None
    loss: float
    cost: Cost
    info: dict[str, Any] = field(default_factory=dict)


class GradientEstimator(Protocol):
    """Anything with ``estimate(loss_fn, params, batch, *, count_flops=False) -> Estimate``."""

    def estimate(
        self,
        loss_fn: LossFn,
        params: Mapping[str, Tensor],
        batch: Any,
        *,
        count_flops: bool = False,
    ) -> Estimate: ...


def check_params(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Validate ``params`` (a non-empty mapping of floating tensors) and return it as a dict."""
    if not isinstance(params, Mapping):
        raise TypeError(
            "params: expected a mapping {name: Tensor} (e.g. dict(model.named_parameters())), "
            f"got {type(params).__name__}."
        )
    if len(params) == 0:
        raise ValueError("params: expected at least one parameter, got an empty mapping.")
    for name, p in params.items():
        if not isinstance(p, Tensor):
            raise TypeError(f"params[{name!r}]: expected a torch.Tensor, got {type(p).__name__}.")
        if not p.is_floating_point():
            raise TypeError(
                f"params[{name!r}]: expected a floating dtype (float32/float64/...), got "
                f"{p.dtype}; gradients need real floating parameters, cast it with .float()."
            )
    return dict(params)


def check_scalar_loss(loss: Any) -> Tensor:
    """Raise unless ``loss`` is a real scalar tensor."""
    if not isinstance(loss, Tensor):
        raise TypeError(
            f"loss_fn: expected it to return a scalar Tensor, got {type(loss).__name__}."
        )
    if loss.numel() != 1 or loss.ndim > 1:
        raise ValueError(
            f"loss_fn: expected a scalar loss, got shape {tuple(loss.shape)}; reduce it "
            "(e.g. .mean() or .sum()) inside loss_fn."
        )
    if not loss.is_floating_point():
        raise TypeError(f"loss_fn: expected a floating loss, got dtype {loss.dtype}.")
    return loss.reshape(())


def raise_unused(names: list[str]) -> None:
    """Raise the error for parameters that the loss does not depend on."""
    if names:
        raise ValueError(
            f"params: the loss does not use {sorted(names)}; loss_fn must read the tensors it "
            "is given (e.g. torch.func.functional_call(model, params, x), not model(x)), and "
            "params must hold only the parameters it reads."
        )


def check_positive(name: str, value: float) -> None:
    """A positive finite number (:func:`dxopt._core.check_positive`)."""
    _core_positive(name, value)


def check_count(name: str, value: int) -> None:
    """An integer ``>= 1`` (:func:`dxopt._core.check_int`)."""
    check_int(name, value)


def check_keep_fraction(value: float | None) -> None:
    """``None`` or a number in ``(0, 1]``."""
    if value is not None:
        check_range("keep_fraction", value, 0, 1, closed=(False, True))


def write_grads(params: Mapping[str, Tensor], grads: Mapping[str, Tensor]) -> None:
    """Add ``grads`` to each parameter's ``.grad`` (set it when it is ``None``), as
    :meth:`torch.Tensor.backward` does, so gradient accumulation and torch optimisers work;
    call ``optimizer.zero_grad()`` between steps."""
    with torch.no_grad():
        for name, p in params.items():
            g = grads[name]
            if p.grad is None:
                p.grad = g.detach().clone()
            else:
                p.grad.add_(g)
