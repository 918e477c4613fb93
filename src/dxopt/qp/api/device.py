"""``dxopt.qp.solve(..., solver="torch")`` on the inputs' device and dtype.

The inputs are validated by :func:`dxopt.qp.problem.canonical.canonical_problem` with
``keep_device=True`` (the same checks, no copy to a float64 CPU form), solved by
:func:`dxopt.qp.autograd.torch_entry.torch_qp_solve` where they live (CUDA tensors stay on the GPU,
float32 stays float32) and differentiated by
:class:`dxopt.qp.autograd.torch_function.TorchQPFunction`,
whose backward reuses the forward polish's penalty factorization and refines against the exact
reduced KKT system: the same exact active-set adjoint as ``backward="kkt"`` and the refined
``"penalty"`` backward, so both names select it (a custom :class:`dxopt.qp.BackwardBase`
object takes the float64 CPU route instead). The host sees only scalars: the validation's
few checks (finite values, the PSD test's Cholesky flags), the solver's convergence tests,
and at the end the per-sample status, polish flags and residuals (``4B`` numbers), never
the data.

**The CPU path for what the device cannot do.** The solver certifies and polishes every
sample by the CPU path's rules (:mod:`dxopt.qp.certify.torch_certify`) and flags the *regular*
samples (strictly complementary, independent active rows, ``P`` positive definite), where its
exact active-set backward is the derivative. Every other sample (``fallback=True``: also one
it does not certify) is solved again by :func:`dxopt.qp.solve` with ``solver="auto"`` on the
CPU in float64 (:func:`_cpu_solve`: the fallback chain, the certificate, the polish and the
degenerate rules of every CPU backend, the same ``backward``), and its ``x`` and duals are
written back into the device outputs with ``index_copy``: autograd carries the derivatives
through the dtype/device conversions both ways, and the device backward sees a zero
cotangent (a NaN tangent it never returns) on those samples. Infeasible and unbounded verdicts
of the interior point go to the CPU path too (even with ``fallback=False``), which claims them
only with a checked certificate (:mod:`dxopt.qp.certify.certificates`). Under torch.func the batch
of a
transform is not indexable by sample, so when any sample needs the CPU path the whole call
takes it. ``info.sample_solvers`` names the backend of each sample. With ``polish=False`` no
sample is regular (its active set is not confirmed), so the whole batch takes the CPU path
and its ``polish=False`` rules.

``on_failure="nan"``: failed samples get NaN ``x`` and duals through a ``torch.where``, so
their cotangents are zero and the backward skips them (it refuses only a sample that was not
solved yet receives a nonzero cotangent).

**torch.func** (``grad``, ``jvp``, ``jacrev``, ``jacfwd``, ``vmap``) and forward-mode AD run
through the same Function (its ``jvp`` and ``vmap`` rules, :mod:`dxopt.qp.autograd.torch_function`):
under a transform :func:`solve_torch` gets ``problem=None`` and a ``validate`` callable that
the Function runs on the plain inputs, reads the statuses and residuals off the plain result
(:class:`dxopt.qp.autograd.torch_function.TorchCall`; under ``vmap`` those of the folded solve, one
entry per sample, the vmapped index outermost) and masks failed samples with the
``status`` output, which the transforms batch like ``x``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dxopt.qp.autograd.torch_function import TorchCall, torch_qp_differentiable
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import BackwardMethod
from dxopt.qp.problem.functorch import BASES, forward_ad_dual
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import BackwardDiagnostics, QPInfo, QPSolution, QPSolveError, QPStatus
from dxopt.qp.solvers.torch_driver import batch_inputs, solve_detached
from dxopt.qp.solvers.torch_types import TorchOptions, code, decode

__all__ = ["solve_torch"]

_Inputs = tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]


_VERDICTS = (QPStatus.INFEASIBLE, QPStatus.UNBOUNDED)


def solve_torch(
    problem: QPProblem | None,
    inputs: _Inputs,
    options: QPOptions,
    *,
    m_user: int | None,
    bounds: tuple[int, int, bool, bool] | None = None,
    validate: Callable[..., Any] | None = None,
    cpu_solve: Callable[..., QPSolution],
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
        options: the call's options: the tolerances, ``polish``, ``on_failure`` and
            ``solver_options`` (:class:`~dxopt.qp.solvers.torch_types.TorchOptions`) of the
            torch solver; ``backward``, the backward's name (``"penalty"`` or ``"kkt"``), and
            ``fallback`` for the samples sent to the CPU path (``fallback=True``: the samples
            the torch solver does not certify go through the CPU path's fallback chain, module
            docstring; ``False``: they stay failed, while the samples it certifies but cannot
            differentiate on the device still go to the CPU path).
        cpu_solve: :func:`dxopt.qp.solve` itself, passed down by the api layer (this module
            sits below it and never imports it) for the samples sent to the CPU path.
    """
    if problem is not None and problem.any_sparse:
        raise ValueError("solve_torch: sparse inputs take the float64 CPU route")
    eps_abs, eps_rel, polish = options.eps_abs, options.eps_rel, options.polish
    backward, fallback, on_failure = options.backward, options.fallback, options.on_failure
    opts = TorchOptions.of(options.solver_options, eps_abs=eps_abs, eps_rel=eps_rel, polish=polish)
    P, q, A, b, G, h = inputs
    diagnostics = BackwardDiagnostics()
    start = time.perf_counter()
    carried = any(t is not None and (t.requires_grad or forward_ad_dual(t)) for t in inputs)
    if problem is None or carried:  # derivatives (or torch.func) go through the Function
        call = TorchCall(validate=validate, diagnostics=diagnostics, reroute=True)
        r = torch_qp_differentiable(P, q, A, b, G, h, opts, call)
        plain = call.result
        assert plain is not None
    else:
        r = plain = solve_detached(*batch_inputs(P, q, A, b, G, h), opts)
    # the one transfer to the host: statuses, flags and residuals (4B numbers), never the data
    status, regular = list(decode(plain.status)), plain.regular.tolist()
    okp = plain.status == code(QPStatus.SOLVED)
    nan = torch.full_like(plain.primal_residual, float("nan"))
    residuals = torch.stack(
        [torch.where(okp, plain.primal_residual, nan), torch.where(okp, plain.dual_residual, nan)]
    ).tolist()
    # the CPU path also re-decides infeasible/unbounded verdicts: the interior point's test
    # is absolute and unchecked, the CPU path claims one only with a checked certificate
    moved = [
        i
        for i, reg in enumerate(regular)
        if not reg and (fallback or status[i].ok or status[i] in _VERDICTS)
    ]
    if moved and problem is None:  # [func] one solve for the whole transformed call
        cpu = _cpu_solve(cpu_solve, inputs, None, eps_abs, eps_rel, polish, backward, fallback)
        dev, dt = q.device, q.dtype
        x = cpu.x.to(device=dev, dtype=dt)
        mu = None if cpu.eq_duals is None else cpu.eq_duals.to(device=dev, dtype=dt)
        nu = None if cpu.ineq_duals is None else cpu.ineq_duals.to(device=dev, dtype=dt)
        info = cpu.info
        status = list(cpu.status)
        info = QPInfo(
            solver="torch", solve_time=time.perf_counter() - start,
            primal_residual=info.primal_residual, dual_residual=info.dual_residual,
            backward=info.backward, sample_solvers=info.sample_solvers,
            sample_tolerances=info.sample_tolerances, polished=info.polished,
        )  # fmt: skip
    else:
        x, mu, nu = r.x, r.eq_duals, r.ineq_duals
        solvers = ["torch" if s.ok else "" for s in status]
        tolerances = [eps_abs if s.ok else float("nan") for s in status]
        polished = [bool(v) for v in plain.polished.tolist()]
        if moved:
            cpu = _cpu_solve(cpu_solve, inputs, moved, eps_abs, eps_rel, polish, backward, fallback)
            idx = torch.tensor(moved, device=x.device)
            n = x.shape[-1]
            x = x.index_copy(0, idx, cpu.x.reshape(len(moved), n).to(x))
            if cpu.eq_duals is not None:
                mu = mu.index_copy(0, idx, cpu.eq_duals.reshape(len(moved), -1).to(mu))
            if cpu.ineq_duals is not None:
                nu = nu.index_copy(0, idx, cpu.ineq_duals.reshape(len(moved), -1).to(nu))
            for k, i in enumerate(moved):
                status[i] = cpu.status[k]
                solvers[i] = cpu.info.sample_solvers[k]
                tolerances[i] = cpu.info.sample_tolerances[k]
                polished[i] = cpu.info.polished[k]
                residuals[0][i] = cpu.info.primal_residual[k]
                residuals[1][i] = cpu.info.dual_residual[k]
            if len(moved) == len(regular):  # every sample's backward is the CPU path's
                diagnostics = cpu.info.backward
        info = QPInfo(
            solver="torch", solve_time=time.perf_counter() - start,
            primal_residual=tuple(residuals[0]), dual_residual=tuple(residuals[1]),
            backward=diagnostics, sample_solvers=tuple(solvers),
            sample_tolerances=tuple(tolerances), polished=tuple(polished),
        )  # fmt: skip
    failed = tuple(i for i, s in enumerate(status) if not s.ok)
    if failed and on_failure == "raise":
        kinds = {i: status[i].value for i in failed}
        raise QPSolveError(
            f"{len(failed)} of {len(status)} QPs not solved by 'torch' nor by the CPU fallback "
            f"chain (batch index: status) {kinds}. Fix the data, or pass on_failure='nan' to "
            "get NaN for those samples.",
            failed,
            tuple(status),
        )
    if failed and problem is None and not moved:  # [func] status is batched like x
        ok = (r.status == code(QPStatus.SOLVED))[:, None]
    elif failed and problem is not None:  # the CPU path's samples are NaN already
        ok = torch.tensor([s.ok for s in status], device=q.device)[:, None]
    if failed and (problem is not None or not moved):
        x = torch.where(ok, x, float("nan"))
        mu, nu = (t if t is None else torch.where(ok, t, float("nan")) for t in (mu, nu))
    if problem is not None:
        batched = problem.batch is not None
    else:
        batched = any(t is not None and t.ndim > k for t, k in zip(inputs, BASES))
    if not batched:
        x = x if x.ndim == 1 else x[0]
        mu, nu = (t if t is None or t.ndim == 1 else t[0] for t in (mu, nu))
    lb_duals = ub_duals = None
    if bounds is not None and nu is not None:
        m0, (k_lb, k_ub, has_lb, has_ub) = m_user or 0, bounds
        lb_duals = nu[..., m0 : m0 + k_lb] if has_lb else None
        ub_duals = nu[..., m0 + k_lb : m0 + k_lb + k_ub] if has_ub else None
        nu = nu[..., :m0]
    return QPSolution(
        x=x,
        eq_duals=mu if A is not None else None,
        ineq_duals=nu if m_user is not None else None,
        status=tuple(status),
        info=info,
        lb_duals=lb_duals,
        ub_duals=ub_duals,
    )


def _cpu_solve(
    solve: Callable[..., QPSolution],
    inputs: _Inputs,
    samples: list[int] | None,
    eps_abs: float,
    eps_rel: float,
    polish: bool,
    backward: str | BackwardMethod,
    fallback: bool,
) -> QPSolution:
    """The CPU path (:func:`dxopt.qp.solve` with ``solver="auto"``: the fallback chain, the
    certificate, the polish and the degenerate rules of every CPU backend) on ``samples`` of
    the batch (``None``: all), in float64; autograd carries the derivatives through the
    device/dtype conversions both ways. ``on_failure="nan"``: the caller raises. ``solve`` is
    :func:`dxopt.qp.solve`, handed down by :mod:`dxopt.qp.api.solve`.

    ``check_psd=False``: ``P`` was checked already, at the inputs' own dtype (the shift
    :func:`dxopt.qp.problem.canonical.psd_shift` scales with that dtype's epsilon, as on the
    CPU route); a second check of the float64 copy would hold a float32 ``P`` to float64's
    tolerance and refuse its round-off (a smallest eigenvalue of -1.9e-9 at unit norm) that
    every CPU solver takes."""
    idx = None if samples is None else torch.tensor(samples, device=inputs[1].device)
    cpu: list[Tensor | None] = []
    for t, base in zip(inputs, BASES):
        if t is not None and idx is not None and t.ndim > base:
            t = t.index_select(0, idx)
        cpu.append(None if t is None else t.to(device="cpu", dtype=torch.float64))
    P, q, A, b, G, h = cpu
    assert P is not None and q is not None
    return solve(
        P, q, A=A, b=b, G=G, h=h, backward=backward, solver="auto", eps_abs=eps_abs,
        eps_rel=eps_rel, on_failure="nan", fallback=fallback, polish=polish, check_psd=False,
    )  # fmt: skip
