r"""Per-point parameter Jacobians of linear differential operators of a tanh MLP, in closed form.

For a tanh MLP :math:`u_\theta` the forward recursion of :func:`~dxopt.natgrad.input_derivatives`
carries, per point, the value :math:`h`, the input Jacobian :math:`G_j = \partial_j h` and the
Hessian diagonal :math:`D_j = \partial_{jj} h` of every layer. A residual row

.. math::

    \rho(\theta, x) = a\,u + \sum_j b_j \partial_j u + \sum_j c_j \partial_{jj} u - f(x)

is linear in the last layer's :math:`(h, G, D)`, so its gradient in :math:`\theta` follows by
one reverse sweep through that recursion, done for all points at once with batched tensor
operations (no per-point autodiff transforms). Per layer :math:`z = W h + b` the per-point
weight gradient is :math:`\bar z h^\top + \sum_j \bar G_j G_j^\top + \sum_j \bar D_j D_j^\top`;
through :math:`t = \tanh z` with :math:`s_1 = 1 - t^2`, :math:`s_2 = -2 t s_1`:

.. math::

    \bar D^z = s_1 \bar D, \quad \bar G^z = s_1 \bar G + 2 s_2 G^z \bar D, \quad
    \bar z = s_1\Big(\bar t - 2t \sum_j(\bar G_j G^z_j + \bar D_j D^z_j)
             + (6t^2 - 2)\sum_j \bar D_j (G^z_j)^2\Big).

Tested against ``vmap(grad(...))`` of the same residual.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dxopt.natgrad._jacobian import Params

__all__ = ["layer_param", "mlp_operator_jacobian"]


def layer_param(params: Params, module: nn.Module, name: str, attr: str) -> torch.Tensor:
    """``params["<name>.<attr>"]``, or the module's own tensor when it is not in ``params``
    (a frozen parameter, ``requires_grad=False``, which the optimizers do not pass)."""
    key = f"{name}.{attr}"
    if key in params:
        return params[key]
    return getattr(module, attr).detach()


def mlp_operator_jacobian(
    model: nn.Sequential,
    params: Params,
    x: torch.Tensor,
    *,
    value_coef: float,
    grad_coef: torch.Tensor,
    diag_coef: torch.Tensor,
    names: Sequence[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Operator rows :math:`a u + b\\cdot\\nabla u + c\\cdot\\mathrm{diag}\\nabla^2 u` and Jacobian.

    Args:
        model: an ``nn.Sequential`` of ``Linear`` and ``Tanh`` layers ending in ``Linear``
            with one output.
        params: its parameters by name.
        x: ``(n, d)`` points.
        value_coef: :math:`a`.
        grad_coef: :math:`b`, shape ``(d,)``.
        diag_coef: :math:`c`, shape ``(d,)``.
        names: the parameters to differentiate, in column order (default: all of
            ``model.named_parameters()``); the others (e.g. frozen ones) are read from
            ``params`` or, when absent, from the model.

    Returns:
        ``(values, jacobian)`` with shapes ``(n,)`` and ``(n, P)``, columns in ``names``
        order (source term not included).
    """
    n, d = x.shape
    need_derivs = bool(grad_coef.abs().sum() > 0 or diag_coef.abs().sum() > 0)
    h = x
    grad = torch.eye(d, dtype=x.dtype, device=x.device).expand(n, d, d)
    diag = torch.zeros_like(grad)
    tape: list[tuple[str, str, tuple[torch.Tensor, ...]]] = []
    modules = dict(model.named_children())
    module_has_bias = {n: getattr(m, "bias", None) is not None for n, m in modules.items()}
    for name, module in model.named_children():
        if isinstance(module, nn.Linear):
            tape.append(("linear", name, (h, grad, diag)))
            weight_t = layer_param(params, module, name, "weight").T
            h = h @ weight_t
            if module.bias is not None:
                h = h + layer_param(params, module, name, "bias")
            if need_derivs:
                grad, diag = grad @ weight_t, diag @ weight_t
        else:
            t = torch.tanh(h)
            s1 = (1 - t * t).unsqueeze(1)
            s2 = -2 * t.unsqueeze(1) * s1
            tape.append(("tanh", name, (t, grad, diag, s1, s2)))
            if need_derivs:
                diag = s1 * diag + s2 * grad * grad
                grad = s1 * grad
            h = t
    value = value_coef * h[:, 0]
    if need_derivs:
        value = value + grad[:, :, 0] @ grad_coef + diag[:, :, 0] @ diag_coef
    # Reverse sweep: cotangents of (h, G, D) of the network output.
    h_bar = torch.full((n, 1), value_coef, dtype=x.dtype, device=x.device)
    g_bar = grad_coef.expand(n, d).unsqueeze(-1).clone()
    d_bar = diag_coef.expand(n, d).unsqueeze(-1).clone()
    blocks: dict[str, torch.Tensor] = {}
    for kind, name, saved in reversed(tape):
        if kind == "linear":
            h_in, g_in, d_in = saved
            w_grad = h_bar.unsqueeze(-1) * h_in.unsqueeze(1)
            if need_derivs:
                w_grad = w_grad + g_bar.transpose(1, 2) @ g_in + d_bar.transpose(1, 2) @ d_in
            blocks[f"{name}.weight"] = w_grad
            if module_has_bias[name]:
                blocks[f"{name}.bias"] = h_bar
            weight = layer_param(params, modules[name], name, "weight")
            h_bar = h_bar @ weight
            if need_derivs:
                g_bar, d_bar = g_bar @ weight, d_bar @ weight
        else:
            t, g_z, d_z, s1, s2 = saved
            if need_derivs:
                s1_bar = (g_bar * g_z + d_bar * d_z).sum(1)
                s2_bar = (d_bar * g_z * g_z).sum(1)
                t_bar = h_bar - 2 * t * s1_bar + (6 * t * t - 2) * s2_bar
                g_bar, d_bar = s1 * g_bar + 2 * s2 * g_z * d_bar, s1 * d_bar
            else:
                t_bar = h_bar
            h_bar = t_bar * s1.squeeze(1)
    if names is None:
        names = [name for name, _ in model.named_parameters()]
    jac = torch.cat([blocks[name].reshape(n, -1) for name in names], dim=1)
    return value, jac
