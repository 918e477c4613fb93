"""The torch solver's entry points: :func:`torch_qp_solve` and the CPU route's
:func:`torch_points`.

They sit above both the detached solver (:mod:`dxopt.qp.solvers.torch_driver`) and its autograd
Function (:mod:`dxopt.qp.autograd.torch_function`): :func:`torch_qp_solve` validates its inputs
with the validator of every route (:func:`dxopt.qp.problem.canonical.canonical_problem`) and
sends inputs that carry derivatives (or run under torch.func) through the Function and the
others straight to :func:`dxopt.qp.solvers.torch_driver.solve_detached`, so neither of those
imports upward. The torch solver's options are one record,
:class:`dxopt.qp.solvers.torch_types.TorchOptions` (:data:`TORCH_OPTIONS`: the names
``solver_options`` takes; the old names ``max_refine`` and ``refine_steps`` of
``max_refinement`` warn for one release).

May import: ``qp.solvers.torch_*``, ``qp.autograd.torch_function``, ``qp.problem``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dxopt._core import renamed_kwargs
from dxopt.qp.autograd.torch_function import TorchCall, torch_qp_differentiable
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.functorch import forward_ad_dual, functorch_active
from dxopt.qp.solvers.torch_driver import batch_inputs, solve_detached
from dxopt.qp.solvers.torch_types import RENAMED_OPTIONS, TorchOptions, TorchQPResult

if TYPE_CHECKING:
    from dxopt.qp.problem.canonical import QPProblem

__all__ = ["TORCH_OPTIONS", "torch_points", "torch_qp_solve"]

TORCH_OPTIONS = TorchOptions.SOLVER_OPTIONS
"""The ``solver_options`` the torch solver takes (see :func:`torch_qp_solve`; ``max_refine`` and
``refine_steps`` are the deprecated names of ``max_refinement``, the name
:class:`dxopt.qp.PenaltyBackward` uses too)."""


@renamed_kwargs(**RENAMED_OPTIONS)
def torch_qp_solve(
    P: Tensor,
    q: Tensor,
    A: Tensor | None = None,
    b: Tensor | None = None,
    G: Tensor | None = None,
    h: Tensor | None = None,
    *,
    eps_abs: float = 1e-9,
    eps_rel: float = 0.0,
    eps_inf: float = 1e-7,
    max_iter: int = 50,
    check_every: int = 4,
    polish: bool = True,
    max_refinement: int | None = None,
    check_psd: bool = True,
) -> TorchQPResult:
    """Solve a batch of dense QPs on the inputs' device (:mod:`dxopt.qp.solvers.torch_driver`).

    Args:
        P: ``(n, n)`` or ``(B, n, n)`` positive semidefinite (symmetric) cost matrix.
        q: ``(n,)`` or ``(B, n)``.
        A, b: equality constraints ``(p, n)``/``(B, p, n)`` and ``(p,)``/``(B, p)``, or None.
        G, h: inequality constraints ``(m, n)``/``(B, m, n)`` and ``(m,)``/``(B, m)``, or None.
        eps_abs, eps_rel: interior-point stopping tolerance on the primal residual, the dual
            residual and the mean complementarity :math:`s^\\top z/m`. In float32 ``eps_abs`` is
            raised to at least ``1e-5`` (see :mod:`dxopt.qp.solvers.torch_driver`).
        eps_inf: tolerance of the infeasibility certificates.
        max_iter: interior-point iteration limit (samples not done get ``MAX_ITER``).
        check_every: iterations between convergence checks (each check is one host sync).
        polish: move the solution onto the identified active set by the refined KKT solve.
        max_refinement: the most refinement passes of each KKT solve (default
            :data:`~dxopt.qp.certify.tolerances.TORCH_REFINE_STEPS`; a solve stops as soon as
            every sample is at round-off). ``max_refine`` and ``refine_steps`` are its
            deprecated names (a DeprecationWarning, for one release).
        check_psd: check that ``P`` is symmetric positive semidefinite (one batched
            Cholesky), as :func:`dxopt.qp.solve` does.

    The inputs are validated by :func:`dxopt.qp.problem.canonical.canonical_problem` (the
    checks, error types and messages of :func:`dxopt.qp.solve`; the data stay on their device
    and dtype). Inputs with a batch dimension of the same size ``B`` are solved together;
    unbatched inputs are shared by every sample. Gradients flow to every input through
    :class:`dxopt.qp.autograd.torch_function.TorchQPFunction` when any input requires grad.

    Returns:
        :class:`~dxopt.qp.solvers.torch_types.TorchQPResult` with ``(B, ...)`` tensors
        (``B = 1`` when nothing is batched); ``result.statuses`` are
        :class:`dxopt.qp.QPStatus` values.
    """
    opts = TorchOptions(
        eps_abs=eps_abs, eps_rel=eps_rel, eps_inf=eps_inf, max_iter=max_iter,
        check_every=check_every, polish=polish, max_refinement=max_refinement,
    )  # fmt: skip
    validate = functools.partial(canonical_problem, check_psd=check_psd, keep_device=True)
    if functorch_active():  # values are batched tensors: the Function validates the plain ones
        return torch_qp_differentiable(P, q, A, b, G, h, opts, TorchCall(validate=validate))
    problem = validate(P, q, A, b, G, h)
    if problem.any_sparse:
        raise ValueError(
            "torch_qp_solve: expected dense tensors, got a sparse P, A or G. Use .to_dense(), "
            "or dxopt.qp.solve(..., solver='torch'), which densifies them on the CPU route."
        )
    if any(  # derivatives (forward mode too) via the Function
        isinstance(t, Tensor) and (t.requires_grad or forward_ad_dual(t))
        for t in (P, q, A, b, G, h)
    ):
        return torch_qp_differentiable(P, q, A, b, G, h, opts)
    return solve_detached(*batch_inputs(P, q, A, b, G, h), opts)


def torch_points(
    problem: QPProblem, *, eps_abs: float, eps_rel: float, solver_options: dict[str, Any] | None
) -> list[tuple[Any, ...] | None]:
    """``solver="torch"`` on the float64 CPU route of :func:`dxopt.qp.solve` (sparse inputs,
    densified, or a custom backward object): the canonical (validated) problem through
    :func:`dxopt.qp.solvers.torch_driver.solve_detached` in one batch, as the first attempt's
    points ``(None, x, y, z)`` of :func:`dxopt.qp.solvers.forward.solve_forward` (``None``
    where ``x`` is not finite), which polishes and certifies them as any backend's and sends
    the samples that do not certify on through its fallback chain. Dense inputs with a named
    backward take the device path of :mod:`dxopt.qp.api.device`."""
    P = problem.dense("P")
    assert P is not None
    data = batch_inputs(  # the problem is validated: no second validation
        P, problem.dense_vec("q"), problem.dense("A"), problem.dense("b"), problem.dense("G"),
        problem.dense("h"),
    )  # fmt: skip
    r = solve_detached(
        *data, TorchOptions.of(solver_options, eps_abs=eps_abs, eps_rel=eps_rel, polish=True)
    )
    X, Y, Z = (t.numpy() for t in (r.x, r.eq_duals, r.ineq_duals))
    finite = torch.isfinite(r.x).all(-1).tolist()
    return [(None, X[i], Y[i], Z[i]) if finite[i] else None for i in range(len(finite))]
