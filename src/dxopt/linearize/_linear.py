r"""The linearized (tangent-space) model: the first-order Taylor expansion of a network.

For a network :math:`f(x;\theta)` and its pretrained weights :math:`\theta_0`,

.. math::

    f_{\mathrm{lin}}(x;\theta_0+\delta) = f(x;\theta_0) + J_\theta f(x;\theta_0)\,\delta ,

affine in the trainable displacement :math:`\delta`. One forward is one Jacobian-vector
product, ``torch.func.jvp`` of ``torch.func.functional_call`` at :math:`\theta_0` with
tangent :math:`\delta`, which returns :math:`f(x;\theta_0)` and :math:`J\delta` together
(about the cost of two to three forwards); reverse mode through it gives
:math:`\partial/\partial\delta = J^\top(\cdot)`, so any :mod:`torch.optim` optimiser trains
:math:`\delta` (Ortiz-Jimenez et al., "Task Arithmetic in the Tangent Space", arXiv
2305.12827).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp

from dxopt._core.torch_compat import BatchNormBase, tree_map


def _key(name: str) -> str:
    # nn.ParameterDict keys may not contain dots.
    return name.replace(".", "__")


class LinearizedModel(nn.Module):
    r"""The first-order Taylor model of ``model`` around its current weights.

    Construction deep-copies ``model`` (the copy, ``self.base``, holds :math:`\theta_0` and is
    frozen) and creates one zero displacement :math:`\delta_n` per linearized parameter in
    ``self.deltas``; calling the wrapper with the model's own arguments returns
    :math:`f(x;\theta_0) + J f(x;\theta_0)\,\delta`, with the same output structure (a tensor
    or a tuple/dict of tensors).

    Args:
        model: any :class:`torch.nn.Module` with floating-point outputs.
        names: keyword-only; the parameters to linearize. Default: those with
            ``requires_grad=True``, so for a model with LoRA-style adapters (base weights
            frozen, adapters trainable) only the adapters are linearized and the frozen
            weights stay at their values.

    Buffers are held at their values at construction (the expansion point) and passed to
    every call. Train/eval mode follows the wrapper (``.train()``/``.eval()``), so dropout
    and batch-statistics normalisation work; a BatchNorm that would update its running
    statistics (training mode with ``track_running_stats=True``) is refused, because that
    side effect is not part of the Taylor model: put those layers in eval mode.
    """

    def __init__(self, model: nn.Module, *, names: Iterable[str] | None = None) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model: expected a torch.nn.Module, got {type(model).__name__}; "
                "wrap your function in an nn.Module."
            )
        base = copy.deepcopy(model)
        all_params = dict(base.named_parameters())
        if names is None:
            chosen = [n for n, p in model.named_parameters() if p.requires_grad]
        else:
            if isinstance(names, str):
                raise TypeError(
                    f"names: expected an iterable of parameter names, got the string {names!r}; "
                    f"pass [{names!r}]."
                )
            chosen = list(names)
            unknown = [n for n in chosen if n not in all_params]
            if unknown:
                raise ValueError(
                    f"names: {unknown} are not parameters of the model; "
                    f"expected some of {sorted(all_params)}."
                )
        if not chosen:
            raise ValueError(
                "names: nothing to linearize: the model has no trainable parameter "
                "(requires_grad=True); pass names=[...] or unfreeze some parameters."
            )
        for n in chosen:
            if not all_params[n].is_floating_point():
                raise TypeError(f"names: parameter {n!r} is not floating point.")
        for p in base.parameters():
            p.requires_grad_(False)
        self.base = base
        self.names: tuple[str, ...] = tuple(chosen)
        self.deltas = nn.ParameterDict(
            {_key(n): nn.Parameter(torch.zeros_like(all_params[n])) for n in chosen}
        )

    # -- the parts ---------------------------------------------------------------------------
    def pretrained_params(self) -> dict[str, Tensor]:
        r""":math:`\theta_0` of the linearized parameters (frozen tensors, not copies)."""
        params = dict(self.base.named_parameters())
        return {n: params[n] for n in self.names}

    def delta_params(self) -> dict[str, nn.Parameter]:
        r"""The trainable displacements :math:`\delta`, keyed by parameter name."""
        return {n: self.deltas[_key(n)] for n in self.names}

    def _check_buffers(self) -> None:
        for name, mod in self.base.named_modules():
            if isinstance(mod, BatchNormBase) and mod.training and mod.track_running_stats:
                raise ValueError(
                    f"LinearizedModel: BatchNorm {name!r} is in training mode with "
                    "track_running_stats=True and would update its running statistics, which "
                    "is not part of the Taylor model; call .eval() on it (or on the wrapper), "
                    "or build it with track_running_stats=False."
                )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._check_buffers()
        primals = self.pretrained_params()
        tangents = self.delta_params()
        fixed: dict[str, Tensor] = {
            n: p for n, p in self.base.named_parameters() if n not in primals
        }
        fixed.update(dict(self.base.named_buffers()))

        def f(params: dict[str, Tensor]) -> Any:
            return functional_call(self.base, {**fixed, **params}, args, kwargs)

        res = jvp(f, (primals,), (tangents,))
        out, tangent_out = res[0], res[1]
        return tree_map(lambda a, b: a + b, out, tangent_out)

    def pretrained_forward(self, *args: Any, **kwargs: Any) -> Any:
        r""":math:`f(x;\theta_0)`: the base model's ordinary forward."""
        return self.base(*args, **kwargs)

    def nonlinear_model(self) -> nn.Module:
        r"""A copy of the base network at :math:`\theta_0+\delta` (ordinary, non-linear forward)."""
        model = copy.deepcopy(self.base)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n, d in self.delta_params().items():
                params[n].add_(d)
        return model
