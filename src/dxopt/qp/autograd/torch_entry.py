"""The torch solver's entry points: :func:`torch_qp_solve` and the CPU route's
:func:`torch_points`.

They sit above both the detached solver (:mod:`dxopt.qp.solvers.torch_driver`) and its autograd
Function (:mod:`dxopt.qp.autograd.torch_function`): :func:`torch_qp_solve` sends inputs that carry
derivatives (or run under torch.func) through the Function and the others straight to
:func:`dxopt.qp.solvers.torch_driver.solve_detached`, so neither of those imports upward.

May import: ``qp.solvers.torch_*``, ``qp.autograd.torch_function``, ``qp.problem``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dxopt.qp.autograd.torch_function import torch_qp_differentiable
from dxopt.qp.problem.functorch import forward_ad_dual, functorch_active
from dxopt.qp.solvers.torch_driver import _check_inputs, solve_detached
from dxopt.qp.solvers.torch_types import TorchQPResult

if TYPE_CHECKING:
    from dxopt.qp.problem.canonical import QPProblem

__all__ = ["TORCH_OPTIONS", "torch_options", "torch_points", "torch_qp_solve"]

TORCH_OPTIONS = ("eps_inf", "max_iter", "check_every", "refine_steps")
"""The ``solver_options`` the torch solver takes (see :func:`torch_qp_solve`)."""


def torch_options(solver_options: dict[str, Any] | None) -> dict[str, Any]:
    opts = dict(solver_options or {})
    unknown = sorted(set(opts) - set(TORCH_OPTIONS))
    if unknown:
        raise ValueError(
            f"solver_options: the torch solver takes {list(TORCH_OPTIONS)}, got the unknown "
            f"options {unknown}. Remove them (tolerances go through eps_abs/eps_rel)."
        )
    full = {"eps_inf": 1e-7, "max_iter": 50, "check_every": 4, "refine_steps": None}
    full.update(opts)
    return full


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
    refine_steps: int | None = None,
) -> TorchQPResult:
    """Solve a batch of dense QPs on the inputs' device (see the module docstring).

    Args:
        P: ``(n, n)`` or ``(B, n, n)`` positive semidefinite (symmetric) cost matrix.
        q: ``(n,)`` or ``(B, n)``.
        A, b: equality constraints ``(p, n)``/``(B, p, n)`` and ``(p,)``/``(B, p)``, or None.
        G, h: inequality constraints ``(m, n)``/``(B, m, n)`` and ``(m,)``/``(B, m)``, or None.
        eps_abs, eps_rel: interior-point stopping tolerance on the primal residual, the dual
            residual and the mean complementarity :math:`s^\\top z/m`. In float32 ``eps_abs`` is
            raised to at least ``1e-5`` (see the module docstring).
        eps_inf: tolerance of the infeasibility certificates.
        max_iter: interior-point iteration limit (samples not done get ``MAX_ITER``).
        check_every: iterations between convergence checks (each check is one host sync).
        polish: move the solution onto the identified active set by the refined KKT solve.
        refine_steps: the most refinement passes of each KKT solve (default
            :data:`~dxopt.qp.solvers.torch_kkt.REFINE_STEPS`; a solve stops as soon as every
            sample is at round-off).

    Inputs with a batch dimension of the same size ``B`` are solved together; unbatched
    inputs are shared by every sample. Gradients flow to every input through
    :class:`dxopt.qp.autograd.torch_function.TorchQPFunction` when any input requires grad.

    Returns:
        :class:`TorchQPResult` with ``(B, ...)`` tensors (``B = 1`` when nothing is batched).
    """
    for name, val in (("max_iter", max_iter), ("check_every", check_every)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"torch_qp_solve: {name} must be a positive int, got {val!r}")
    for name, fval in (("eps_abs", eps_abs), ("eps_rel", eps_rel), ("eps_inf", eps_inf)):
        if not isinstance(fval, (int, float)) or not fval >= 0:
            raise ValueError(f"torch_qp_solve: {name} must be a float >= 0, got {fval!r}")
    if functorch_active() or any(  # derivatives (torch.func, forward mode) via the Function
        isinstance(t, Tensor) and (t.requires_grad or forward_ad_dual(t))
        for t in (P, q, A, b, G, h)
    ):
        return torch_qp_differentiable(
            P,
            q,
            A,
            b,
            G,
            h,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            eps_inf=eps_inf,
            max_iter=max_iter,
            check_every=check_every,
            polish=polish,
            refine_steps=refine_steps,
        )
    return solve_detached(
        *_check_inputs(P, q, A, b, G, h),
        eps_abs=eps_abs,
        eps_rel=eps_rel,
        eps_inf=eps_inf,
        max_iter=max_iter,
        check_every=check_every,
        polish=polish,
        refine_steps=refine_steps,
    )


def torch_points(
    problem: QPProblem, *, eps_abs: float, eps_rel: float, solver_options: dict[str, Any] | None
) -> list[tuple[Any, ...] | None]:
    """``solver="torch"`` on the float64 CPU route of :func:`dxopt.qp.solve` (sparse inputs,
    densified, or a custom backward object): the canonical problem through
    :func:`torch_qp_solve` in one batch, as the first attempt's points ``(None, x, y, z)``
    of :func:`dxopt.qp.solvers.forward.solve_forward` (``None`` where ``x`` is not finite), which
    polishes and certifies them as any backend's and sends the samples that do not certify
    on through its fallback chain. Dense inputs with a named backward take the device path
    of :mod:`dxopt.qp.api.device`."""
    P = problem.dense("P")
    assert P is not None
    r = torch_qp_solve(
        P,
        problem.dense_vec("q"),
        problem.dense("A"),
        problem.dense("b"),
        problem.dense("G"),
        problem.dense("h"),
        eps_abs=eps_abs,
        eps_rel=eps_rel,
        **torch_options(solver_options),
    )
    X, Y, Z = (t.numpy() for t in (r.x, r.eq_duals, r.ineq_duals))
    finite = torch.isfinite(r.x).all(-1).tolist()
    return [(None, X[i], Y[i], Z[i]) if finite[i] else None for i in range(len(finite))]
