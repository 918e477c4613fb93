r"""Implicit differentiation of an ``nn.Module``'s inner minimizer, as an autograd layer.

For an inner problem :math:`w^*(\lambda) = \arg\min_w L(w, \lambda)` over a network's
parameters :math:`w` with hyperparameters :math:`\lambda`, the implicit function theorem at a
stationary point (:math:`\nabla_w L = 0`, :math:`\nabla^2_{ww} L \succ 0`) gives

.. math::

    \frac{\partial w^*}{\partial \lambda}^\top \bar w
        = -\nabla^2_{\lambda w} L\, [\nabla^2_{ww} L]^{-1} \bar w ,

so the backward pass of :func:`implicit_argmin` solves :math:`\nabla^2_{ww} L\, u = \bar w`
by conjugate gradients (:func:`dxopt.linalg.conjugate_gradient`) on Hessian-vector products
and returns :math:`-\nabla^2_{\lambda w} L\, u`, one mixed product (Pedregosa, "Hyperparameter
optimization with approximate gradient", ICML 2016; Lorraine, Vicol and Duvenaud,
arXiv 1911.02590). Nothing of size :math:`|w|^2` is built.

Solving is kept apart from differentiating: :func:`implicit_argmin` takes parameters that the
caller already optimized and only attaches the implicit derivative (it refuses, by default,
parameters that are not stationary, since the formula would then be wrong);
:class:`ImplicitArgmin` is the ``nn.Module`` that does both, solving with
:class:`torch.optim.LBFGS` warm-started from the module's current parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from dxopt._core import (
    DxoptError,
    Status,
    check_callable,
    check_int,
    check_on_failure,
    check_positive,
    handle_failure,
)
from dxopt.linalg import conjugate_gradient

__all__ = ["ImplicitArgmin", "ImplicitSolveError", "implicit_argmin"]

InnerLoss = Callable[..., Tensor]


class ImplicitSolveError(DxoptError):
    """The inner solution is not stationary, or the backward CG solve did not converge."""


@dataclass(frozen=True)
class _Spec:
    inner_loss: InnerLoss
    names: tuple[str, ...]
    cg_rtol: float
    cg_max_iter: int | None
    on_failure: str


def _flat(tensors: tuple[Tensor | None, ...], like: tuple[Tensor, ...]) -> Tensor:
    return torch.cat(
        [(torch.zeros_like(p) if t is None else t).reshape(-1) for t, p in zip(tensors, like)]
    )


def _unflat(vector: Tensor, like: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    out, offset = [], 0
    for p in like:
        out.append(vector[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return tuple(out)


class _InnerGradient:
    r"""The inner gradient :math:`\nabla_w L(w, \lambda)` at one point, with its graph kept
    for the products :math:`\nabla^2_{ww} L\, u` (:meth:`hvp`) and
    :math:`\nabla^2_{\lambda w} L\, u` (:meth:`mixed`) on flat vectors ``u``."""

    def __init__(
        self,
        inner_loss: InnerLoss,
        names: tuple[str, ...],
        params: tuple[Tensor, ...],
        hparams: tuple[Tensor, ...],
    ) -> None:
        self.params = tuple(t.detach().requires_grad_(True) for t in params)
        self.hparams = tuple(t.detach().requires_grad_(True) for t in hparams)
        with torch.enable_grad():
            loss = inner_loss(dict(zip(names, self.params)), *self.hparams)
            grads = torch.autograd.grad(loss, self.params, create_graph=True, allow_unused=True)
        self.flat = _flat(tuple(None if g is None else g.detach() for g in grads), self.params)
        self.live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        self._grads = [grads[i] for i in self.live]

    def _vjp(self, u: Tensor, wrt: tuple[Tensor, ...]) -> tuple[Tensor | None, ...]:
        if not self.live or not wrt:
            return (None,) * len(wrt)
        parts = _unflat(u, self.params)
        with torch.enable_grad():
            return torch.autograd.grad(
                self._grads,
                wrt,
                grad_outputs=[parts[i] for i in self.live],
                retain_graph=True,
                allow_unused=True,
            )

    def hvp(self, u: Tensor) -> Tensor:
        return _flat(self._vjp(u, self.params), self.params)

    def mixed(self, u: Tensor) -> tuple[Tensor, ...]:
        out = self._vjp(u, self.hparams)
        return tuple(torch.zeros_like(h) if m is None else m for m, h in zip(out, self.hparams))


class _ImplicitArgminFunction(torch.autograd.Function):
    """Identity on the solved parameters forward; implicit-function-theorem VJP backward."""

    @staticmethod
    def forward(ctx: Any, spec: _Spec, n_params: int, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.spec, ctx.n_params = spec, n_params
        # copies, so a later in-place solve (a warm start) cannot change this point
        solution = tuple(t.detach().clone() for t in tensors[:n_params])
        ctx.save_for_backward(*solution, *tensors[n_params:])
        return solution

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grad_w: Tensor) -> tuple[Tensor | None, ...]:
        spec: _Spec = ctx.spec
        saved = ctx.saved_tensors
        n = ctx.n_params
        inner = _InnerGradient(spec.inner_loss, spec.names, saved[:n], saved[n:])
        result = conjugate_gradient(
            inner.hvp,
            _flat(grad_w, inner.params),
            rtol=spec.cg_rtol,
            max_iter=spec.cg_max_iter,
            check_residual=True,
        )
        if result.status is not Status.SOLVED:
            handle_failure(
                spec.on_failure,
                f"implicit_argmin: the backward CG solve with the inner Hessian stopped with "
                f"status {result.status.value} ({result.status.message}; residual "
                f"{result.residual_norm:.3e} after {result.iterations} iterations). The inner "
                "Hessian must be positive definite at the solution (add weight decay) or raise "
                "cg_max_iter.",
                error=ImplicitSolveError,
                status=result.status,
            )
        return (None, None, *([None] * n), *inner.mixed(-result.x))


def _stationarity(
    inner_loss: InnerLoss, params: Mapping[str, Tensor], hparams: tuple[Tensor, ...]
) -> float:
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    with torch.enable_grad():
        loss = inner_loss(leaves, *(h.detach() for h in hparams))
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise ValueError(
                f"inner_loss: expected a scalar tensor, got {shape}; reduce it with .mean()."
            )
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    norms = [float(g.abs().max()) for g in grads if g is not None and g.numel()]
    return max(norms, default=0.0)


def _newton_polish(
    inner_loss: InnerLoss,
    params: Mapping[str, nn.Parameter],
    hparams: tuple[Tensor, ...],
    tol: float,
    max_steps: int = 5,
) -> float:
    """Newton-CG steps on the parameters in place until the largest gradient entry is at most
    ``tol``; L-BFGS's line search works on loss values, which stop changing in floating point
    before the gradient is small. A step is kept only if it lowers the gradient. Returns the
    final largest gradient entry."""
    names, plist = tuple(params), list(params.values())
    worst = _stationarity(inner_loss, params, hparams)
    for _ in range(max_steps):
        if worst <= tol:
            break
        inner = _InnerGradient(inner_loss, names, tuple(plist), hparams)
        step = conjugate_gradient(inner.hvp, inner.flat, rtol=1e-10, max_iter=None)
        if step.status is not Status.SOLVED:
            break  # not positive definite here: leave the point to the stationarity check
        before = [p.detach().clone() for p in plist]
        with torch.no_grad():
            for p, d in zip(plist, _unflat(step.x, inner.params)):
                p.sub_(d)
        new = _stationarity(inner_loss, params, hparams)
        if not new < worst:
            with torch.no_grad():
                for p, b in zip(plist, before):
                    p.copy_(b)
            break
        worst = new
    return worst


def implicit_argmin(
    inner_loss: InnerLoss,
    params: Mapping[str, Tensor],
    *hparams: Tensor,
    tol: float | None = 1e-5,
    cg_rtol: float | None = None,
    cg_max_iter: int | None = None,
    on_failure: str = "raise",
) -> dict[str, Tensor]:
    r"""Attach the implicit derivative :math:`\partial w^* / \partial \lambda` to solved
    parameters.

    Args:
        inner_loss: ``inner_loss(params, *hparams) -> scalar``, e.g. with
            :func:`torch.func.functional_call` on a module; it must read the parameters from
            ``params``.
        params: the inner solution :math:`w^*` by name (e.g.
            ``dict(model.named_parameters())`` after training); their values are used, not
            their graph.
        hparams: the hyperparameter tensors :math:`\lambda` (those with ``requires_grad``
            receive gradients).
        tol: refuse parameters whose inner gradient has a largest entry above ``tol`` (the
            formula holds only at a stationary point); ``None`` skips the check.
        cg_rtol, cg_max_iter: tolerance and cap of the backward CG solve (default tolerance
            :math:`\sqrt{\epsilon}` of the parameters' dtype, about 1.5e-8 in float64 and
            3.5e-4 in float32; default cap ``10 * |w|``).
        on_failure: ``"raise"`` (:class:`ImplicitSolveError`), ``"warn"`` or ``"ignore"`` when
            the parameters are not stationary or the backward solve does not converge.

    Returns:
        The parameters by name, as tensors whose gradient flows to ``hparams``; use them with
        :func:`torch.func.functional_call` in the outer loss.

    Raises:
        TypeError, ValueError: for bad arguments; ImplicitSolveError: see ``on_failure``.
    """
    check_callable("inner_loss", inner_loss, signature="(params, *hparams) -> scalar tensor")
    if not isinstance(params, Mapping) or not params:
        raise TypeError(
            "params: expected a non-empty mapping name -> tensor, e.g. "
            f"dict(model.named_parameters()), got {type(params).__name__}."
        )
    for name, value in [*params.items(), *((f"hparams[{i}]", h) for i, h in enumerate(hparams))]:
        if not isinstance(value, Tensor) or not value.dtype.is_floating_point:
            raise TypeError(
                f"{name}: expected a floating-point tensor, got {type(value).__name__}."
            )
    if tol is not None:
        check_positive("tol", tol)
    if cg_rtol is None:
        cg_rtol = torch.finfo(next(iter(params.values())).dtype).eps ** 0.5
    check_positive("cg_rtol", cg_rtol)
    if cg_max_iter is not None:
        check_int("cg_max_iter", cg_max_iter)
    check_on_failure(on_failure)
    if tol is not None:
        worst = _stationarity(inner_loss, params, hparams)
        if worst > tol:
            handle_failure(
                on_failure,
                f"implicit_argmin: params are not a stationary point of inner_loss (largest "
                f"gradient entry {worst:.3e} > tol = {tol:.1e}), so the implicit derivative "
                "would be wrong; solve the inner problem further (more iterations, float64) "
                "or loosen tol.",
                error=ImplicitSolveError,
                status=Status.INACCURATE,
            )
    spec = _Spec(inner_loss, tuple(params), cg_rtol, cg_max_iter, on_failure)
    out = _ImplicitArgminFunction.apply(spec, len(params), *params.values(), *hparams)
    return dict(zip(spec.names, out))


class ImplicitArgmin(nn.Module):
    r"""Solve :math:`\min_w L(w, \lambda)` over ``model``'s trainable parameters and return
    the minimizer, differentiable with respect to :math:`\lambda` by :func:`implicit_argmin`.

    Each call runs :class:`torch.optim.LBFGS` (strong Wolfe line search) from the model's
    current parameters (a warm start across outer steps), then at most five Newton-CG steps
    (Hessian-vector products) if the gradient is still above ``tol``, leaves the solution in
    the model and returns it by name.

    Args:
        model: the inner network; its trainable parameters are :math:`w`.
        inner_loss: ``inner_loss(params, *hparams) -> scalar``, typically
            ``lambda p, lam: mse(functional_call(model, p, (X,)), Y) + lam.exp() * l2(p)``.
        max_iter: L-BFGS iterations per call at most.
        tol: stationarity required (largest gradient entry), see :func:`implicit_argmin`.
        lr: L-BFGS step scale (1 with the line search).
        cg_rtol, cg_max_iter, on_failure: see :func:`implicit_argmin`.

    Attributes:
        status: ``SOLVED`` or ``INACCURATE`` after the last call; ``grad_max``: its largest
            inner gradient entry.
    """

    def __init__(
        self,
        model: nn.Module,
        inner_loss: InnerLoss,
        *,
        max_iter: int = 500,
        tol: float = 1e-5,
        lr: float = 1.0,
        cg_rtol: float | None = None,
        cg_max_iter: int | None = None,
        on_failure: str = "raise",
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}.")
        check_callable("inner_loss", inner_loss, signature="(params, *hparams) -> scalar tensor")
        self.model = model
        self.inner_loss = inner_loss
        self.max_iter = check_int("max_iter", max_iter)
        self.tol = check_positive("tol", tol)
        self.lr = check_positive("lr", lr)
        self.cg_rtol, self.cg_max_iter = cg_rtol, cg_max_iter
        self.on_failure = check_on_failure(on_failure)
        self.status = Status.MAX_ITER
        self.grad_max = float("inf")

    def _trainable(self) -> dict[str, nn.Parameter]:
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        if not params:
            raise ValueError("model: has no trainable parameters (requires_grad=True).")
        return params

    def forward(self, *hparams: Tensor) -> dict[str, Tensor]:
        params = self._trainable()
        fixed = tuple(h.detach() for h in hparams)
        opt = torch.optim.LBFGS(
            list(params.values()),
            lr=self.lr,
            max_iter=self.max_iter,
            tolerance_grad=0.1 * self.tol,
            tolerance_change=0.0,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure() -> Tensor:
            opt.zero_grad()
            with torch.enable_grad():
                loss = self.inner_loss(params, *fixed)
                loss.backward()
            return loss

        opt.step(closure)
        for p in params.values():
            p.grad = None
        self.grad_max = _newton_polish(self.inner_loss, params, fixed, self.tol)
        self.status = Status.SOLVED if self.grad_max <= self.tol else Status.INACCURATE
        return implicit_argmin(
            self.inner_loss,
            params,
            *hparams,
            tol=self.tol,
            cg_rtol=self.cg_rtol,
            cg_max_iter=self.cg_max_iter,
            on_failure=self.on_failure,
        )
