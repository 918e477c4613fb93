""":func:`dxopt.qp.solve` inside :func:`torch.compile` (``fullgraph=True``) as a custom op.

Dynamo cannot trace the backends (numpy and C code), so under compilation the solve is the
opaque operator ``dxopt::qp_solve`` (:func:`torch.library.custom_op`): a fake kernel gives the
output shapes to the compiler, the real kernel runs the eager :func:`dxopt.qp.solve`, and
:func:`torch.library.register_autograd` attaches the backward, itself the opaque operator
``dxopt::qp_solve_backward``. That backward solves the same problem again with the same
options (so the same route, the same certified point and the same backward method as eager)
and returns the eager vector-Jacobian product: the compiled gradients are the eager ones.
The price is one more forward solve per backward pass, paid only under compilation.

What a compiled call returns (:func:`compiled_solve`): a :class:`~dxopt.qp.QPSolution` whose
tensors are the eager ones, with two differences that the compiler's static shapes force:

- ``lb_duals`` / ``ub_duals`` have ``n`` entries, zero where the bound is infinite (eager
  keeps only the finite entries, a data-dependent count), the convention of the vmapped path;
- ``status`` is ``()`` and ``info`` the constant :data:`COMPILED_INFO` (``route="compiled"``,
  ``solver=""``, no timings or residuals): the per-sample outcome is data the graph
  does not carry. With ``on_failure="raise"`` (the default) a returned solution is a
  certified one (a failed sample raises :class:`~dxopt.qp.QPSolveError` from inside the op);
  with ``on_failure="nan"`` a failed sample is a NaN row of ``x``.

The options the op carries are the scalar ones (``backward`` as a name, ``solver``,
``eps_abs``, ``eps_rel``, ``on_failure``, ``check_psd``, ``fallback``, ``polish``); with a
configured backward object, ``solver_options``, ``max_workers`` or ``executor`` the call stays a
graph break (:func:`compiles`), which ``fullgraph=True`` reports.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPInfo, QPSolution

__all__ = [
    "COMPILED_INFO",
    "compiled_solve",
    "compiles",
    "opaque_call",
    "register_opaque",
    "set_eager_solve",
]

COMPILED_INFO = QPInfo("", 0.0, (), (), route="compiled")
"""The ``info`` of every compiled call: built once, outside any graph (the backend that ran
and the residuals are data the graph does not carry)."""

_EAGER: list[Callable[..., QPSolution]] = []  # solve_with, set by dxopt.qp.api.solve


def set_eager_solve(solve_with: Callable[..., QPSolution]) -> None:
    """The eager solve the op's kernels run (:func:`dxopt.qp.api.solve.solve_with`, which
    imports this module: it hands itself over instead of being imported here)."""
    _EAGER[:] = [solve_with]


_BATCHED_NDIM = (3, 2, 3, 2, 3, 2, 2, 2)  # P, q, A, b, G, h, lb, ub with a batch dimension
_INPUTS = ("P", "q", "A", "b", "G", "h", "lb", "ub")


def compiles(options: QPOptions) -> bool:
    """Whether ``options`` fit the custom op (scalar options only, see the module docstring;
    ``infeasible="relax"`` picks samples by their status, so it stays a graph break too)."""
    return (
        isinstance(options.backward, str)
        and options.solver_options is None
        and options.max_workers is None
        and options.executor is None
        and options.infeasible == "fail"
    )


def _options(
    backward: str, solver: str, eps_abs: float, eps_rel: float, on_failure: str,
    check_psd: bool, fallback: bool, polish: bool,
) -> QPOptions:  # fmt: skip
    return QPOptions(
        backward=backward, solver=solver, eps_abs=eps_abs, eps_rel=eps_rel,
        on_failure=on_failure, check_psd=check_psd, fallback=fallback, polish=polish,
    )  # fmt: skip


def _bound_duals(duals: Tensor | None, bound: Tensor | None, like: Tensor) -> Tensor:
    """The multipliers of the finite entries of ``bound`` scattered into ``n`` entries (zero
    where the bound is infinite); an empty ``(..., 0)`` tensor without the bound."""
    if bound is None or duals is None:
        return like.new_zeros((*like.shape[:-1], 0))
    finite = torch.isfinite(bound)
    if finite.ndim > 1:  # the finite pattern is shared by the batch
        finite = finite[0]
    full = like.new_zeros(like.shape)
    return full.index_copy(-1, finite.nonzero().flatten(), duals)


def _eager_outputs(
    inputs: list[Tensor | None], warm: Tensor | None, options: QPOptions
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    P, q, A, b, G, h, lb, ub = inputs
    sol = _EAGER[0](P, q, A, b, G, h, lb, ub, warm, options)
    x = sol.x
    empty = x.new_zeros((*x.shape[:-1], 0))
    mu = empty if sol.eq_duals is None else sol.eq_duals
    nu = empty if sol.ineq_duals is None else sol.ineq_duals
    return (
        x, mu, nu, _bound_duals(sol.lb_duals, lb, x), _bound_duals(sol.ub_duals, ub, x),
    )  # fmt: skip


@torch.library.custom_op("dxopt::qp_solve", mutates_args=())
def _qp_solve(
    P: Tensor, q: Tensor, A: Tensor | None, b: Tensor | None, G: Tensor | None,
    h: Tensor | None, lb: Tensor | None, ub: Tensor | None, warm: Tensor | None,
    backward: str, solver: str, eps_abs: float, eps_rel: float, on_failure: str,
    check_psd: bool, fallback: bool, polish: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    options = _options(backward, solver, eps_abs, eps_rel, on_failure, check_psd, fallback, polish)
    outs = _eager_outputs([P, q, A, b, G, h, lb, ub], warm, options)
    return tuple(o.detach().clone() for o in outs)  # type: ignore[return-value]


def _shapes(inputs: list[Tensor | None]) -> tuple[tuple[int, ...], int, int]:
    """``(batch shape, p, m)`` of the outputs."""
    batch: tuple[int, ...] = ()
    for t, nd in zip(inputs, _BATCHED_NDIM):
        if t is not None and t.ndim == nd:
            batch = (t.shape[0],)
    A, G = inputs[2], inputs[4]
    return batch, 0 if A is None else A.shape[-2], 0 if G is None else G.shape[-2]


@_qp_solve.register_fake
def _qp_solve_fake(
    P: Tensor, q: Tensor, A: Tensor | None, b: Tensor | None, G: Tensor | None,
    h: Tensor | None, lb: Tensor | None, ub: Tensor | None, warm: Tensor | None,
    *args: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    batch, p, m = _shapes([P, q, A, b, G, h, lb, ub])
    n = q.shape[-1]
    new = q.new_empty
    return (
        new((*batch, n)), new((*batch, p)), new((*batch, m)),
        new((*batch, 0 if lb is None else n)), new((*batch, 0 if ub is None else n)),
    )  # fmt: skip


def _vjp(
    inputs: list[Tensor | None], warm: Tensor | None, grads: list[Tensor], needs: list[bool],
    options: QPOptions,
) -> list[Tensor | None]:  # fmt: skip
    """The gradients of the inputs that ``needs`` asks for, in input order."""
    with torch.enable_grad():
        leaves = [
            None if t is None else t.detach().requires_grad_(need) for t, need in zip(inputs, needs)
        ]
        outs = _eager_outputs(leaves, warm, options)
        wrt = [t for t, need in zip(leaves, needs) if t is not None and need]
        return _pull_back(outs, wrt, grads)


def _pull_back(outs: Any, wrt: list[Tensor], grads: list[Tensor]) -> list[Any]:
    """The cotangent ``grads`` of ``outs`` pulled back to ``wrt`` (``None`` where unused)."""
    pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and o.numel() > 0]
    if not (pairs and wrt):
        return [None] * len(wrt)
    return list(
        torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
    )


@torch.library.custom_op("dxopt::qp_solve_backward", mutates_args=())
def _qp_solve_backward(
    inputs: list[Tensor | None], warm: Tensor | None, grads: list[Tensor],
    needs: list[bool], backward: str, solver: str, eps_abs: float, eps_rel: float,
    on_failure: str, check_psd: bool, fallback: bool, polish: bool,
) -> list[Tensor]:  # fmt: skip
    """The eager vector-Jacobian product: the same solve again, differentiated by autograd;
    one tensor per input (empty for an input that is ``None`` or needs no gradient)."""
    options = _options(backward, solver, eps_abs, eps_rel, on_failure, check_psd, fallback, polish)
    # a thread of its own: the dispatcher runs this kernel with thread-local dispatch keys
    # excluded, under which the solve's views would lose their place in the autograd graph
    with ThreadPoolExecutor(max_workers=1) as pool:
        found = pool.submit(_vjp, inputs, warm, grads, needs, options).result()
    it = iter(found)
    result = []
    for t, need in zip(inputs, needs):
        g = next(it) if t is not None and need else None
        if t is not None and need:
            result.append(torch.zeros_like(t) if g is None else g.detach().clone())
        else:
            result.append(torch.empty(0, dtype=grads[0].dtype))
    return result


@_qp_solve_backward.register_fake
def _qp_solve_backward_fake(
    inputs: list[Tensor | None], warm: Tensor | None, grads: list[Tensor],
    needs: list[bool], *args: Any,
) -> list[Tensor]:  # fmt: skip
    return [
        torch.empty_like(t) if t is not None and need else grads[0].new_empty(0)
        for t, need in zip(inputs, needs)
    ]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    tensors = list(inputs[:8])
    ctx.none = tuple(t is None for t in tensors)
    ctx.scalars = inputs[9:]
    ctx.has_warm = inputs[8] is not None
    saved = [t for t in (*tensors, inputs[8]) if t is not None]
    ctx.save_for_backward(*saved)
    ctx.out_shapes = tuple(o.shape for o in output)


def _backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
    saved = iter(ctx.saved_tensors)
    inputs = [None if none else next(saved) for none in ctx.none]
    warm = next(saved) if ctx.has_warm else None
    like = next(t for t in inputs if t is not None)
    filled = [like.new_zeros(shape) if g is None else g for g, shape in zip(grads, ctx.out_shapes)]
    needs = [bool(n) for n in ctx.needs_input_grad[:8]]
    if not any(needs):
        return (None,) * (len(ctx.scalars) + 9)
    out = _qp_solve_backward(inputs, warm, filled, needs, *ctx.scalars)
    result: list[Tensor | None] = [g if need else None for g, need in zip(out, needs)]
    return (*result, None, *([None] * len(ctx.scalars)))


_qp_solve.register_autograd(_backward, setup_context=_setup_context)


def compiled_solve(
    P: Tensor, q: Tensor, A: Tensor | None, b: Tensor | None, G: Tensor | None,
    h: Tensor | None, lb: Tensor | None, ub: Tensor | None, warm: Tensor | None,
    options: QPOptions,
) -> QPSolution:  # fmt: skip
    """The solve as the custom op, for a traced call (the module docstring says what the
    returned :class:`~dxopt.qp.QPSolution` holds)."""
    backward = options.backward
    assert isinstance(backward, str)
    x, mu, nu, lbd, ubd = _qp_solve(
        P, q, A, b, G, h, lb, ub, warm, backward, options.solver, float(options.eps_abs),
        float(options.eps_rel), options.on_failure, options.check_psd, options.fallback,
        options.polish,
    )  # fmt: skip
    return QPSolution(
        x, None if A is None else mu, None if G is None else nu, (), COMPILED_INFO,
        lb_duals=None if lb is None else lbd, ub_duals=None if ub is None else ubd,
    )  # fmt: skip


# -- an eager callable (a layer) as one opaque op: the CVXPY layer's whole forward ----------

_OPAQUE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def register_opaque(layer: Any) -> int:
    """A key under which :func:`opaque_call` finds ``layer``, an object with
    ``_opaque_forward(*values) -> tuple[Tensor, ...]`` (the eager, differentiable forward) and
    ``_opaque_shapes(*values) -> list[tuple[int, ...]]`` (its output shapes, from the input
    shapes alone). Held weakly: the key dies with the layer."""
    key = next(_KEYS)
    _OPAQUE[key] = layer
    return key


def _layer(key: int) -> Any:
    layer = _OPAQUE.get(key)
    if layer is None:  # pragma: no cover - the layer was freed while a graph still ran it
        raise RuntimeError(f"dxopt::opaque_layer: the layer with key {key} no longer exists.")
    return layer


@torch.library.custom_op("dxopt::opaque_layer", mutates_args=())
def _opaque(key: int, values: list[Tensor]) -> list[Tensor]:
    return [o.detach().clone() for o in _layer(key)._opaque_forward(*values)]


@_opaque.register_fake
def _opaque_fake(key: int, values: list[Tensor]) -> list[Tensor]:
    like = values[0]
    return [like.new_empty(shape) for shape in _layer(key)._opaque_shapes(*values)]


def _opaque_vjp(
    key: int, values: list[Tensor], grads: list[Tensor], needs: list[bool]
) -> list[Tensor | None]:
    with torch.enable_grad():
        leaves = [v.detach().requires_grad_(need) for v, need in zip(values, needs)]
        outs = _layer(key)._opaque_forward(*leaves)
        wrt = [t for t, need in zip(leaves, needs) if need]
        return _pull_back(outs, wrt, grads)


@torch.library.custom_op("dxopt::opaque_layer_backward", mutates_args=())
def _opaque_backward(
    key: int, values: list[Tensor], grads: list[Tensor], needs: list[bool]
) -> list[Tensor]:
    """The eager layer run again and differentiated (in a thread of its own, as
    :func:`_qp_solve_backward`); one tensor per value, empty where no gradient is needed."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        found = iter(pool.submit(_opaque_vjp, key, values, grads, needs).result())
    result = []
    for v, need in zip(values, needs):
        g = next(found) if need else None
        if need:
            result.append(torch.zeros_like(v) if g is None else g.detach().clone())
        else:
            result.append(v.new_empty(0))
    return result


@_opaque_backward.register_fake
def _opaque_backward_fake(
    key: int, values: list[Tensor], grads: list[Tensor], needs: list[bool]
) -> list[Tensor]:
    return [torch.empty_like(v) if need else v.new_empty(0) for v, need in zip(values, needs)]


def _opaque_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.key = inputs[0]
    ctx.save_for_backward(*inputs[1])
    ctx.out_shapes = tuple(o.shape for o in output)


def _opaque_grad(ctx: Any, grads: list[Tensor | None]) -> tuple[Any, ...]:
    values = list(ctx.saved_tensors)
    needs = [v.is_floating_point() for v in values]  # (autograd drops what is not needed)
    filled = [
        values[0].new_zeros(shape) if g is None else g for g, shape in zip(grads, ctx.out_shapes)
    ]
    out = _opaque_backward(ctx.key, values, filled, needs)
    return None, [g if need else None for g, need in zip(out, needs)]


def opaque_call(key: int, values: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The layer registered under ``key`` applied to ``values`` as the opaque op (outputs and
    gradients are the eager ones; the backward runs the layer again)."""
    return tuple(_opaque(key, list(values)))


_opaque.register_autograd(_opaque_grad, setup_context=_opaque_setup)
