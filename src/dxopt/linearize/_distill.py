r"""DELTA's student: activation distillation from a linearized teacher along the task ray.

The student :math:`\theta_S=\theta_0+\tau_S` is fine-tuned normally; at each step a scale
:math:`\alpha` is drawn and its features at :math:`\theta_0+\alpha\tau_S` are pulled toward
the linearized teacher's at :math:`\theta_0+\alpha\tau_T`, which are affine in
:math:`\alpha`:

.. math::

    L_S = \mathrm{CE}\big(h(\varphi(x;\theta_0+\alpha\tau_S)), y\big)
        + w\,\big\|\varphi(x;\theta_0+\alpha\tau_S)
                 - \mathrm{sg}[\varphi(x;\theta_0) + \alpha J\tau_T]\big\|_2^2
        + \lambda R(\tau_S).

**Which layer.** The backbone's output features :math:`\varphi` (the representation the
frozen task heads read), as in the authors' configuration. **Which norm.** The squared
Euclidean distance summed over features and averaged over the batch (their default);
L1 and cosine are offered. Matching an :math:`\alpha`-affine target for
:math:`\alpha\in[0.5,2]` constrains the student to be linear in weight perturbations along
its own task vector, through activation space (Sommariva et al., arXiv 2605.18993).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from dxopt._core import check_choice, check_range

DistillNorm = Literal["squared_l2", "l1", "cosine"]
_NORMS = ("squared_l2", "l1", "cosine")


def distillation_loss(
    student: Tensor, teacher: Tensor, *, norm: DistillNorm = "squared_l2"
) -> Tensor:
    r"""Distance between student and (detached) teacher features, averaged over the batch.

    ``squared_l2``: :math:`\frac1B\sum_b\|s_b-t_b\|_2^2`; ``l1``: :math:`\frac1B\sum_b\|s_b-
    t_b\|_1`; ``cosine``: :math:`1-\frac1B\sum_b\cos(s_b,t_b)`. Features are flattened per
    example (first dimension = batch). No gradient flows into ``teacher``.
    """
    if not isinstance(student, Tensor) or not isinstance(teacher, Tensor):
        raise TypeError(
            f"student, teacher: expected tensors, got {type(student).__name__} and "
            f"{type(teacher).__name__}."
        )
    if student.shape != teacher.shape:
        raise ValueError(
            f"teacher: expected the student's shape {tuple(student.shape)}, got "
            f"{tuple(teacher.shape)}; distil layers of the same width."
        )
    if student.ndim < 1 or student.shape[0] == 0:
        raise ValueError(f"student: expected a non-empty batch, got shape {tuple(student.shape)}.")
    check_choice("norm", norm, _NORMS)
    s = student.reshape(student.shape[0], -1)
    t = teacher.detach().reshape(teacher.shape[0], -1)
    if norm == "squared_l2":
        return (s - t).pow(2).sum(dim=1).mean()
    if norm == "l1":
        return (s - t).abs().sum(dim=1).mean()
    return 1.0 - nn.functional.cosine_similarity(s, t, dim=1).mean()


def call_along_ray(
    model: nn.Module,
    pretrained: Mapping[str, Tensor],
    alpha: float,
    *args: Any,
    **kwargs: Any,
) -> Any:
    r"""``model`` evaluated at :math:`\theta_0+\alpha(\theta-\theta_0)` (differentiable in
    :math:`\theta`), for the parameters named in ``pretrained``; the others keep their values.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}.")
    params = dict(model.named_parameters())
    unknown = [n for n in pretrained if n not in params]
    if unknown:
        raise ValueError(f"pretrained: {unknown} are not parameters of the model.")
    moved = {n: p0 + alpha * (params[n] - p0) for n, p0 in pretrained.items()}
    return functional_call(model, moved, args, kwargs)


def alpha_range(progress: float, *, low: float = 0.5, high: float = 2.0) -> tuple[float, float]:
    r"""DELTA's curriculum for :math:`\alpha`: :math:`[1+(\ell-1)\sqrt\rho,\ 1+(h-1)\sqrt\rho]`
    at training progress :math:`\rho\in[0,1]`: :math:`\alpha=1` at the start, widening to
    :math:`[\ell, h]` at the end."""
    check_range("progress", progress, 0.0, 1.0, closed=(True, True), hint="a training fraction")
    if not (0.0 < low <= 1.0 <= high):
        raise ValueError(f"low, high: expected 0 < low <= 1 <= high, got {low} and {high}.")
    r = math.sqrt(progress)
    return 1.0 + (low - 1.0) * r, 1.0 + (high - 1.0) * r


def sample_alpha(
    progress: float,
    *,
    low: float = 0.5,
    high: float = 2.0,
    generator: torch.Generator | None = None,
) -> float:
    r"""Draw :math:`\alpha\sim U[`:func:`alpha_range`:math:`]`."""
    lo, hi = alpha_range(progress, low=low, high=high)
    u = float(torch.rand((), generator=generator))
    return lo + (hi - lo) * u
