""":func:`dxopt.conic.solve` and :class:`~dxopt.conic.ConicLayer` inside
:func:`torch.compile` (``fullgraph=True``) as a custom op.

Dynamo cannot trace the backends (Clarabel, SCS: C and Rust code), so under compilation the
solve is the opaque operator ``dxopt::conic_solve`` (:func:`torch.library.custom_op`): a fake
kernel gives the compiler the output shapes (``x`` ``(..., n)``, ``y`` and ``s``
``(..., m)``), the real kernel runs the eager :func:`dxopt.conic.solve_with`, and
:func:`torch.library.register_autograd` attaches the backward, itself the opaque operator
``dxopt::conic_solve_backward``: it solves the same problem again with the same options (the
same certified point, the same implicit derivative) and returns the eager vector-Jacobian
product, so compiled gradients are the eager ones. The price is one more forward solve per
backward pass, paid only under compilation.

The op's schema carries tensors and scalars only: the cones go as two lists (a class index
and its one parameter, :data:`_CONES`), the options as their scalars (a
:class:`~dxopt.conic.Smoothed` backward as its ``mu`` and ``max_iter``), rebuilt inside the
kernels. What a compiled call returns is a
:class:`~dxopt.conic.ConicSolution` with the eager ``x, y, s``, ``status`` ``()`` and ``info``
the constant :data:`COMPILED_INFO` (the per-sample outcome is data the graph does not carry).
With ``on_failure="raise"`` (the default) a returned solution is a certified one (a failed
sample raises :class:`~dxopt.conic.ConicSolveError` from inside the op); with
``on_failure="nan"`` a failed sample is a NaN row. ``infeasible="relax"`` and
``backward=Smoothed(...)`` run inside the op as in eager mode; ``warm_start`` is refused under
compilation (its acceptance is per-sample data).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from dxopt._core import Cost
from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.exp import ExpCone, ExpDualCone
from dxopt.conic.cones.nonneg import NonnegCone
from dxopt.conic.cones.power import PowerCone
from dxopt.conic.cones.psd import PSDCone
from dxopt.conic.cones.soc import SecondOrderCone
from dxopt.conic.cones.zero import ZeroCone
from dxopt.conic.types import ConicInfo, ConicOptions, ConicSolution, Smoothed

__all__ = ["COMPILED_INFO", "compiled_solve", "set_eager_solve"]

COMPILED_INFO = ConicInfo(
    solvers=(),
    iterations=(),
    primal_residual=(),
    dual_residual=(),
    gap=(),
    kink=(),
    polished=(),
    failures=(),
    cost=Cost(),
)
"""The ``info`` of every compiled call (built once, outside any graph)."""

_EAGER: list[Callable[..., ConicSolution]] = []  # solve_with, handed over by dxopt.conic.api

_CONES: tuple[tuple[type[Cone], str], ...] = (
    (ZeroCone, "n"),
    (NonnegCone, "n"),
    (SecondOrderCone, "n"),
    (PSDCone, "k"),
    (ExpCone, ""),
    (ExpDualCone, ""),
    (PowerCone, "alpha"),
)
"""Every cone class and its one parameter: the op carries ``cones`` as two lists, the index
into this table and the parameter (``0.0`` for the exponential cones)."""


def set_eager_solve(solve_with: Callable[..., ConicSolution]) -> None:
    """The eager solve the op's kernels run (:func:`dxopt.conic.api.solve_with`, which imports
    this module: it hands itself over instead of being imported here)."""
    _EAGER[:] = [solve_with]


def _encode(cones: tuple[Cone, ...]) -> tuple[list[int], list[float]]:
    kinds, params = [], []
    for cone in cones:
        for j, (cls, field) in enumerate(_CONES):
            if type(cone) is cls:
                kinds.append(j)
                params.append(float(getattr(cone, field)) if field else 0.0)
                break
        else:
            raise TypeError(
                f"cones: {type(cone).__name__} has no encoding for torch.compile; use the "
                "cones of dxopt.conic (or call solve outside the compiled region)"
            )
    return kinds, params


def _decode(kinds: list[int], params: list[float]) -> tuple[Cone, ...]:
    cones: list[Cone] = []
    for j, v in zip(kinds, params):
        cls, field = _CONES[j]
        arg = (int(v) if field in ("n", "k") else float(v),) if field else ()
        cones.append(cls(*arg))
    return tuple(cones)


_SCALARS = (
    "atol", "rtol", "infeas_tol", "max_iter", "solver", "fallback", "on_failure", "kink_tol",
    "polish", "check_psd", "infeasible",
)  # fmt: skip
"""The options the op carries as scalars, in its schema's order (then the backward as
``mu`` and ``max_iter`` of a :class:`~dxopt.conic.Smoothed`, ``mu = 0`` for ``"kkt"``)."""


def _options(scalars: tuple[Any, ...]) -> ConicOptions:
    *plain, mu, smooth_iter = scalars
    backward = "kkt" if mu == 0.0 else Smoothed(mu=mu, max_iter=smooth_iter)
    return ConicOptions(**dict(zip(_SCALARS, plain)), backward=backward)


def _eager(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, kinds: list[int], params: list[float],
    scalars: tuple[Any, ...],
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    sol = _EAGER[0](
        None if P.numel() == 0 else P, q, A, b, cones=_decode(kinds, params),
        options=_options(scalars), warm_start=None,
    )  # fmt: skip
    return sol.x, sol.y, sol.s


@torch.library.custom_op("dxopt::conic_solve", mutates_args=())
def _conic_solve(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, kinds: list[int], params: list[float],
    atol: float, rtol: float, infeas_tol: float, max_iter: int, solver: str, fallback: bool,
    on_failure: str, kink_tol: float, polish: bool, check_psd: bool, infeasible: str,
    mu: float, smooth_iter: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    scalars = (atol, rtol, infeas_tol, max_iter, solver, fallback, on_failure, kink_tol,
               polish, check_psd, infeasible, mu, smooth_iter)  # fmt: skip
    x, y, s = _eager(P, q, A, b, kinds, params, scalars)
    return x.detach().clone(), y.detach().clone(), s.detach().clone()


@_conic_solve.register_fake
def _conic_solve_fake(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, *args: Any
) -> tuple[Tensor, Tensor, Tensor]:
    batch: tuple[int, ...] = ()
    for t, nd in ((P, 3), (q, 2), (A, 3), (b, 2)):
        if t.ndim == nd:
            batch = (t.shape[0],)
    n, m = q.shape[-1], b.shape[-1]
    return q.new_empty((*batch, n)), q.new_empty((*batch, m)), q.new_empty((*batch, m))


def _vjp(
    inputs: list[Tensor], grads: list[Tensor], needs: list[bool], kinds: list[int],
    params: list[float], scalars: tuple[Any, ...],
) -> list[Tensor | None]:  # fmt: skip
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) for t, need in zip(inputs, needs)]
        P, q, A, b = leaves
        outs = _eager(P, q, A, b, kinds, params, scalars)
        wrt = [t for t, need in zip(leaves, needs) if need]
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        if not (pairs and wrt):
            return [None] * len(wrt)
        return list(
            torch.autograd.grad(
                [o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True
            )
        )


@torch.library.custom_op("dxopt::conic_solve_backward", mutates_args=())
def _conic_solve_backward(
    inputs: list[Tensor], grads: list[Tensor], needs: list[bool], kinds: list[int],
    params: list[float], atol: float, rtol: float, infeas_tol: float, max_iter: int,
    solver: str, fallback: bool, on_failure: str, kink_tol: float, polish: bool,
    check_psd: bool, infeasible: str, mu: float, smooth_iter: int,
) -> list[Tensor]:  # fmt: skip
    """The eager vector-Jacobian product: the same solve again, differentiated by autograd;
    one tensor per input (empty where no gradient is needed)."""
    # a thread of its own: the dispatcher runs this kernel with thread-local dispatch keys
    # excluded, under which autograd would not record the re-solve
    with ThreadPoolExecutor(max_workers=1) as pool:
        scalars = (atol, rtol, infeas_tol, max_iter, solver, fallback, on_failure, kink_tol,
                   polish, check_psd, infeasible, mu, smooth_iter)  # fmt: skip
        job = pool.submit(_vjp, inputs, grads, needs, kinds, params, scalars)
        found = iter(job.result())
    result = []
    for t, need in zip(inputs, needs):
        if need:
            g = next(found)
            result.append(torch.zeros_like(t) if g is None else g.detach().clone())
        else:
            result.append(t.new_empty(0))
    return result


@_conic_solve_backward.register_fake
def _conic_solve_backward_fake(
    inputs: list[Tensor], grads: list[Tensor], needs: list[bool], *args: Any
) -> list[Tensor]:
    return [torch.empty_like(t) if need else t.new_empty(0) for t, need in zip(inputs, needs)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs[:4])
    ctx.config = inputs[4:]
    ctx.out_shapes = tuple(o.shape for o in output)


def _backward(ctx: Any, gx: Tensor | None, gy: Tensor | None, gs: Tensor | None) -> Any:
    inputs = list(ctx.saved_tensors)
    needs = [bool(n) and t.numel() > 0 for n, t in zip(ctx.needs_input_grad[:4], inputs)]
    rest = (None,) * len(ctx.config)
    if not any(needs):
        return (None,) * 4 + rest
    like = inputs[1]
    grads = [like.new_zeros(sh) if g is None else g for g, sh in zip((gx, gy, gs), ctx.out_shapes)]
    out = _conic_solve_backward(inputs, grads, needs, *ctx.config)
    return (*(g if need else None for g, need in zip(out, needs)), *rest)


_conic_solve.register_autograd(_backward, setup_context=_setup_context)


def compiled_solve(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    cones: tuple[Cone, ...],
    options: ConicOptions,
    warm_start: object,
) -> ConicSolution:
    """The solve as the custom op, for a traced call (module doc)."""
    if warm_start is not None:
        raise TypeError(
            "warm_start: not supported under torch.compile (whether a warm start certifies is "
            "per-sample data the graph does not carry); pass warm_start=None there"
        )
    P_in = q.new_zeros(0) if P is None else P
    kinds, params = _encode(cones)
    smooth = options.backward
    mu, smooth_iter = (smooth.mu, smooth.max_iter) if isinstance(smooth, Smoothed) else (0.0, 1)
    x, y, s = _conic_solve(
        P_in, q, A, b, kinds, params, float(options.atol), float(options.rtol),
        float(options.infeas_tol), options.max_iter, options.solver, options.fallback,
        options.on_failure, float(options.kink_tol), options.polish, options.check_psd,
        options.infeasible, float(mu), smooth_iter,
    )  # fmt: skip
    return ConicSolution(x=x, y=y, s=s, status=(), info=COMPILED_INFO)
