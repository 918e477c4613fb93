"""``dxopt.qp.solve(..., solver="torch")`` on the inputs' device and dtype.

The inputs are validated by :func:`dxopt.qp._problem.canonical_problem` with
``keep_device=True`` (the same checks, no copy to a float64 CPU form), solved by
:func:`dxopt.qp._torch_solver.torch_qp_solve` where they live (CUDA tensors stay on the GPU,
float32 stays float32) and differentiated by :class:`dxopt.qp._torch_backward.TorchQPFunction`,
whose backward reuses the forward polish's penalty factorization and refines against the exact
reduced KKT system: the same exact active-set adjoint as ``backward="kkt"`` and the refined
``"penalty"`` backward, so both names select it (a custom :class:`dxopt.qp.BackwardBase`
object takes the float64 CPU route instead). The host sees only scalars: the validation's
few checks (finite values, the PSD test's Cholesky flags), the solver's convergence tests,
and at the end the per-sample status, polish flags and residuals (``4B`` numbers), never
the data.

``on_failure="nan"``: failed samples get NaN ``x`` and duals through a ``torch.where``, so
their cotangents are zero and the backward skips them (it refuses only a sample that was not
solved yet receives a nonzero cotangent).

**torch.func** (``grad``, ``jvp``, ``jacrev``, ``jacfwd``, ``vmap``) and forward-mode AD run
through the same Function (its ``jvp`` and ``vmap`` rules, :mod:`dxopt.qp._torch_backward`):
under a transform :func:`solve_torch` gets ``problem=None`` and a ``validate`` callable that
the Function runs on the plain inputs, reads the statuses and residuals off the plain result
(:class:`dxopt.qp._torch_backward.TorchCall`; under ``vmap`` those of the folded solve, one
entry per sample, the vmapped index outermost) and masks failed samples with the
``status`` output, which the transforms batch like ``x``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dxopt.qp._problem import QPProblem
from dxopt.qp._tangent import BASES, forward_ad_dual
from dxopt.qp._torch_backward import TorchCall, torch_qp_differentiable
from dxopt.qp._torch_solver import TorchQPStatus, _check_inputs, solve_detached
from dxopt.qp._types import BackwardDiagnostics, QPInfo, QPSolution, QPSolveError, QPStatus

__all__ = ["TORCH_OPTIONS", "solve_torch"]

TORCH_OPTIONS = ("eps_inf", "max_iter", "check_every", "refine_steps")
"""The ``solver_options`` the torch solver takes (see :func:`torch_qp_solve`)."""

_TO_STATUS = {
    int(TorchQPStatus.SOLVED): QPStatus.SOLVED,
    int(TorchQPStatus.PRIMAL_INFEASIBLE): QPStatus.INFEASIBLE,
    int(TorchQPStatus.DUAL_INFEASIBLE): QPStatus.UNBOUNDED,
}


def _options(solver_options: dict[str, Any] | None) -> dict[str, Any]:
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


def solve_torch(
    problem: QPProblem | None,
    inputs: tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None],
    *,
    eps_abs: float,
    eps_rel: float,
    on_failure: str,
    solver_options: dict[str, Any] | None,
    polish: bool,
    m_user: int | None,
    bounds: tuple[int, int, bool, bool] | None = None,
    validate: Callable[..., Any] | None = None,
) -> QPSolution:
    """Solve and differentiate a dense batch with the torch solver, on the inputs' device.

    Args:
        problem: the validated problem (``canonical_problem(..., keep_device=True)``); it
            gives the batch layout. ``None`` under torch.func, with ``validate``: the
            validation runs inside the Function on the plain inputs (module docstring).
        inputs: the user's ``(P, q, A, b, G, h)`` (bounds already appended to ``G, h``),
            carrying autograd.
        m_user: the number of rows of the user's ``G`` (``None`` without ``G``).
        bounds: ``(k_lb, k_ub, has_lb, has_ub)`` when ``lb``/``ub`` were given: the
            multipliers of the appended bound rows are split off into ``lb_duals``/``ub_duals``.

    The other arguments are those of :func:`dxopt.qp.solve`.
    """
    if problem is not None and problem.any_sparse:
        raise ValueError("solve_torch: sparse inputs take the float64 CPU route")
    opts = _options(solver_options)
    P, q, A, b, G, h = inputs
    diagnostics = BackwardDiagnostics()
    start = time.perf_counter()
    carried = any(t is not None and (t.requires_grad or forward_ad_dual(t)) for t in inputs)
    if problem is None or carried:  # derivatives (or torch.func) go through the Function
        call = TorchCall(validate=validate)
        r = torch_qp_differentiable(
            P, q, A, b, G, h, eps_abs=eps_abs, eps_rel=eps_rel, polish=polish,
            diagnostics=diagnostics, call=call, **opts,
        )  # fmt: skip
        plain = call.result
        assert plain is not None
    else:
        r = plain = solve_detached(
            *_check_inputs(P, q, A, b, G, h), eps_abs=eps_abs, eps_rel=eps_rel, polish=polish,
            **opts,
        )  # fmt: skip
    codes = plain.status.tolist()  # the one transfer to the host: statuses and residuals
    elapsed = time.perf_counter() - start
    status = tuple(_TO_STATUS.get(c, QPStatus.FAILED) for c in codes)
    failed = tuple(i for i, s in enumerate(status) if not s.ok)
    if failed and on_failure == "raise":
        kinds = {i: status[i].value for i in failed}
        raise QPSolveError(
            f"{len(failed)} of {len(codes)} QPs not solved by 'torch' (batch index: status) "
            f"{kinds}. Fix the data, or pass on_failure='nan' to get NaN for those samples.",
            failed,
            status,
        )
    ok = r.status == TorchQPStatus.SOLVED  # batched by a transform like x
    x, mu, nu = (torch.where(ok[:, None], t, float("nan")) for t in (r.x, r.eq_duals, r.ineq_duals))
    okp = plain.status == TorchQPStatus.SOLVED
    nan = torch.full_like(plain.primal_residual, float("nan"))
    residuals = torch.stack(
        [torch.where(okp, plain.primal_residual, nan), torch.where(okp, plain.dual_residual, nan)]
    ).tolist()
    if problem is not None:
        batched = problem.batch is not None
    else:
        batched = any(t is not None and t.ndim > k for t, k in zip(inputs, BASES))
    if not batched:
        x, mu, nu = x[0], mu[0], nu[0]
    info = QPInfo(
        solver="torch",
        solve_time=elapsed,
        primal_residual=tuple(residuals[0]),
        dual_residual=tuple(residuals[1]),
        backward=diagnostics,
        sample_solvers=tuple("torch" if s.ok else "" for s in status),
        sample_tolerances=tuple(eps_abs if s.ok else float("nan") for s in status),
        polished=tuple(bool(v) for v in plain.polished.tolist()),
    )
    lb_duals = ub_duals = None
    if bounds is not None:
        m0, (k_lb, k_ub, has_lb, has_ub) = m_user or 0, bounds
        lb_duals = nu[..., m0 : m0 + k_lb] if has_lb else None
        ub_duals = nu[..., m0 + k_lb : m0 + k_lb + k_ub] if has_ub else None
        nu = nu[..., :m0]
    return QPSolution(
        x=x,
        eq_duals=mu if A is not None else None,
        ineq_duals=nu if m_user is not None else None,
        status=status,
        info=info,
        lb_duals=lb_duals,
        ub_duals=ub_duals,
    )
