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
from torch import Tensor, nn

from dxopt._core import (
    Cost,
    DxoptError,
    Status,
    check_int,
    check_on_failure,
    check_range,
    handle_failure,
)
from dxopt._core import check_positive as _core_positive

LossFn = Callable[[Mapping[str, Tensor], Any], Tensor]
"""``loss_fn(params, batch) -> scalar Tensor``, pure in ``params``."""


class EstimateError(DxoptError):
    """An estimate failed (a non-finite directional derivative) and ``on_failure="raise"``;
    ``.status`` is :attr:`dxopt.Status.FAILED`. Nothing was written to ``.grad``."""


ON_FAILURE = ("raise", "warn", "ignore")
"""The ``on_failure`` policies the estimators accept (:func:`dxopt._core.check_on_failure`)."""


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
        status: ``SOLVED``, or ``FAILED`` when a directional derivative was not finite (only
            returned under ``on_failure="warn"`` / ``"ignore"``; the estimate then averages
            the finite ones, and is all NaN when none was finite).

    Only the trainable parameters get an estimate (see :func:`split_trainable`).
    """

    grads: dict[str, Tensor] | None
    loss: float
    cost: Cost
    info: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.SOLVED


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
        raise ValueError(
            "params: expected at least one trainable parameter, got none (an empty mapping, "
            "or every parameter has requires_grad=False); pass the parameters to train."
        )
    for name, p in params.items():
        if not isinstance(p, Tensor):
            raise TypeError(f"params[{name!r}]: expected a torch.Tensor, got {type(p).__name__}.")
        if not p.is_floating_point():
            raise TypeError(
                f"params[{name!r}]: expected a floating dtype (float32/float64/...), got "
                f"{p.dtype}; gradients need real floating parameters, cast it with .float()."
            )
    return dict(params)


def split_trainable(
    loss_fn: LossFn, params: Mapping[str, Tensor]
) -> tuple[dict[str, Tensor], LossFn]:
    """Validate ``params`` and split off the frozen ones.

    Frozen: an ``nn.Parameter`` with ``requires_grad=False``, and any tensor with
    ``requires_grad=False`` when some tensor of ``params`` requires grad (so plain tensors,
    none of which requires grad, are all trainable, as in the examples). Frozen tensors get no
    estimate, no perturbation and no ``.grad`` (a torch optimiser then leaves them alone, as
    :mod:`dxopt.natgrad` does); they reach ``loss_fn`` unchanged.

    Returns:
        ``(trainable, loss)``: the trainable parameters and ``loss(trainable, batch)``, which
        calls ``loss_fn`` with the frozen tensors put back (in the original order).

    Raises:
        ValueError: when every parameter is frozen.
    """
    if not isinstance(params, Mapping):
        check_params(params)  # raises the TypeError
    any_grad = any(isinstance(p, Tensor) and p.requires_grad for p in params.values())
    frozen = {
        n: p
        for n, p in params.items()
        if isinstance(p, Tensor)
        and not p.requires_grad
        and (any_grad or isinstance(p, nn.Parameter))
    }
    trainable = check_params({n: p for n, p in params.items() if n not in frozen})
    if not frozen:
        return trainable, loss_fn
    names = tuple(params)

    def loss(p: Mapping[str, Tensor], batch: Any) -> Tensor:
        return loss_fn({n: frozen[n] if n in frozen else p[n] for n in names}, batch)

    return trainable, loss


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


def check_failure_policy(on_failure: object) -> str:
    """``on_failure`` of an estimator (:data:`ON_FAILURE`)."""
    return check_on_failure(on_failure, ON_FAILURE)


def nonfinite_status(
    on_failure: str, owner: str, skipped: int, total: int, *, what: str = "directional derivatives"
) -> Status:
    """Apply ``on_failure`` when ``skipped`` of ``total`` values were not finite (call it before
    anything is written to ``.grad`` or the parameters); returns the estimate's status."""
    if skipped == 0:
        return Status.SOLVED
    outcome = (
        "the estimate is NaN"
        if skipped == total
        else "they are left out and the estimate averages the others"
    )
    handle_failure(
        on_failure,
        f"{owner}: {skipped} of {total} {what} are not finite (NaN or inf: the loss is not "
        f"finite at the evaluated points); {outcome}. Check the loss and the data for NaN, "
        "lower the learning rate (or eps), or pass on_failure='ignore' to get the estimate "
        "with status FAILED.",
        error=EstimateError,
        status=Status.FAILED,
        stacklevel=4,
    )
    return Status.FAILED
