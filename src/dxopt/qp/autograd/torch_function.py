"""Differentiating :func:`~.torch_entry.torch_qp_solve`: the exact active-set adjoint.

At a solution with active inequality rows :math:`\\mathcal A`, the solution map satisfies the
reduced KKT system (Amos & Kolter, arXiv 1703.00443, with the multipliers of inactive rows held
at zero)

.. math::
    K\\begin{bmatrix} dx \\\\ dy \\\\ dz_{\\mathcal A}\\end{bmatrix} =
    \\begin{bmatrix} -dP\\,x - dq - dA^\\top y - dG^\\top z \\\\ db - dA\\,x \\\\
    dh_{\\mathcal A} - dG_{\\mathcal A} x\\end{bmatrix},\\qquad
    K = \\begin{bmatrix} P & A^\\top & G_{\\mathcal A}^\\top \\\\ A & 0 & 0 \\\\
    G_{\\mathcal A} & 0 & 0\\end{bmatrix}.

:math:`K` is symmetric, so the adjoint :math:`K[u; v; w] = [\\bar x; \\bar y; \\bar z_{\\mathcal
A}]` gives

.. math::
    \\bar q = -u,\\ \\bar P = -\\tfrac12(ux^\\top + xu^\\top),\\ \\bar A = -(yu^\\top + vx^\\top),
    \\ \\bar b = v,\\ \\bar G = -(zu^\\top + wx^\\top),\\ \\bar h = w

(:math:`w = 0` off :math:`\\mathcal A`). The adjoint is solved with the penalty Cholesky factor
the forward polish computed (:class:`dxopt.qp.solvers.torch_types.PenaltyFactor`) and refined
against :math:`K` (:func:`dxopt.qp.solvers.torch_kkt.kkt_solve`): no new factorization, one
batched pair of triangular solves per refinement pass. Inputs shared by the batch get gradients
summed over the batch. A sample with a nonzero cotangent that was not solved, not polished (its
active set unconfirmed, e.g. with ``polish=False``) or whose adjoint residual stays above
tolerance makes the backward raise :class:`dxopt.qp.QPBackwardError` instead of returning a
wrong gradient.

**Forward mode and torch.func.** :math:`K` is symmetric, so the tangent
:math:`[dx; dy; dz_{\\mathcal A}]` is the same refined solve applied to the right-hand side
above (:meth:`TorchQPFunction.jvp`): the jvp is the transpose of the vjp, with the same
refusals (an unpolished sample with a nonzero tangent raises; a sample that was not solved has
no derivative and gets a NaN tangent, which :func:`dxopt.qp.solve` masks like its ``x``). Both
directions go through one Function, :class:`TorchKKTSolve`, which checks the residual on plain
tensors; its ``vmap`` rule and the one of :class:`TorchQPFunction` fold a vmapped dimension
into the batch (:func:`dxopt.qp.autograd.tangent.fold`): ``vmap`` is one batched solve, and the
cotangents of ``jacrev`` / the tangents of ``jacfwd`` one batched KKT solve. The solve takes
the QP's inputs as anchors and refuses to be differentiated again
(:class:`dxopt.qp.autograd.vjp.FirstOrderOnly`), so second derivatives raise instead of
dropping
the QP's second-order term. The forward stores its plain result on a :class:`TorchCall`
(statuses and residuals for :class:`dxopt.qp.QPInfo`, which must not be read off tensors that
a transform wraps) and, under torch.func, validates its inputs there (``validate``): inside
``vmap`` no check may branch on the values of a batched tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dxopt._core import Status
from dxopt.qp.autograd.vjp import FirstOrderOnly
from dxopt.qp.certify.tolerances import TORCH_REFINE_STEPS
from dxopt.qp.problem.functorch import BASES, fold, functorch_active, logical_batch, unfold
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError
from dxopt.qp.solvers.torch_driver import batch_inputs, solve_detached
from dxopt.qp.solvers.torch_kkt import kkt_solve, small_threads
from dxopt.qp.solvers.torch_types import PenaltyFactor, TorchOptions, TorchQPResult, code, decode

__all__ = ["TorchCall", "TorchKKTSolve", "TorchQPFunction", "torch_qp_differentiable"]

_N_OUT = 14  # outputs of TorchQPFunction (TorchQPResult.outputs)
_REPEAT_BUDGET = 1 << 25
"""Entries (256 MiB in float64) of the factor and data a vmapped KKT solve may repeat at once."""


@dataclass
class TorchCall:
    """Side channel of one :class:`TorchQPFunction` call: ``validate`` (or ``None``) checks
    the plain inputs inside ``forward``; ``forward`` stores its plain :class:`TorchQPResult`
    in ``result`` (under vmap: the folded solve, vmapped index outermost); ``diagnostics`` (or
    ``None``) is filled by the backward; ``reroute``: the caller
    (:func:`dxopt.qp.api.device.solve_torch`) replaces the samples that are not regular by the
    CPU path's (:class:`_How`)."""

    validate: Callable[..., Any] | None = None
    result: TorchQPResult | None = None
    diagnostics: BackwardDiagnostics | None = None
    reroute: bool = False


@dataclass(frozen=True)
class _How:
    """Non-tensor settings of one :class:`TorchKKTSolve`: ``"vjp"`` or ``"jvp"``, the
    refinement steps, float64 or not, the diagnostics to fill (vjp only), and ``reroute``:
    the caller (:func:`dxopt.qp.api.device.solve_torch`) replaces the samples that are not
    regular by the CPU path's, so they are treated as not solved here."""

    mode: str
    max_refine: int
    f64: bool
    diagnostics: BackwardDiagnostics | None = None
    reroute: bool = False


def _reduce(g: Tensor, like: Tensor | None, base: int) -> Tensor | None:
    """Sum a ``(B, ...)`` gradient down to the shape of the input it belongs to."""
    if like is None:
        return None
    if like.ndim == base:
        return g.sum(0)
    if like.shape[0] == 1 and g.shape[0] != 1:
        return g.sum(0, keepdim=True)
    return g


def _bmv(M: Tensor, v: Tensor) -> Tensor:
    """``M @ v`` per sample, ``M`` ``(k, n)`` or ``(B, k, n)``, ``v`` ``(B, n)``."""
    return (M @ v.unsqueeze(-1)).squeeze(-1)


class TorchQPFunction(torch.autograd.Function):
    """``(P, q, A, b, G, h, options, call) -> (x, y, z, ...)`` of a batch of QPs solved by the
    torch solver, with the exact active-set derivative (``backward``), its tangent (``jvp``)
    and a ``vmap`` rule (module docstring).

    ``forward`` returns ``x, y, z`` (differentiable) followed by the solver's non-differentiable
    outputs (status, iterations, residuals, polish flags, slacks and the penalty factorization:
    :meth:`TorchQPResult.outputs`) so that ``setup_context`` saves everything through
    ``save_for_backward``. ``options``: the solver's :class:`TorchOptions` (``max_refinement``
    resolved); ``call``: a :class:`TorchCall`, or ``None``.
    """

    @staticmethod
    def forward(
        P: Tensor,
        q: Tensor,
        A: Tensor | None,
        b: Tensor | None,
        G: Tensor | None,
        h: Tensor | None,
        options: TorchOptions,
        call: TorchCall | None,
    ) -> tuple[Tensor, ...]:
        if call is not None and call.validate is not None:
            call.validate(P, q, A, b, G, h)
        Pd, qd, Ad, bd, Gd, hd = (t.detach() for t in batch_inputs(P, q, A, b, G, h))
        r = solve_detached(Pd, qd, Ad, bd, Gd, hd, options)
        if call is not None:
            call.result = r
        return r.outputs()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        P, q, A, b, G, h, options, call = inputs
        x, y, z, _, status = output[:5]
        polished, regular = output[8], output[9]
        L, w_ineq, w_eq, active = output[-4:]
        ctx.mark_non_differentiable(*output[3:])
        ctx.max_refine = options.max_refinement
        ctx.reroute = call is not None and call.reroute
        ctx.diagnostics = None if call is None else call.diagnostics
        ctx.present = tuple(t is not None for t in (A, G))
        ctx.f64 = P.dtype == torch.float64
        saved = [t for t in (P, q, A, b, G, h) if t is not None]
        saved += [x, y, z, status, polished, regular, L, w_ineq, w_eq, active]
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)

    @staticmethod
    def backward(
        ctx: Any, gx: Tensor | None, gy: Tensor | None, gz: Tensor | None, *_unused: Any
    ) -> tuple[Tensor | None, ...]:
        inputs, (x, y, z), rest = _unpack(ctx)
        Pf, _, Af, _, Gf, _ = batch_inputs(*inputs)
        gx = torch.zeros_like(x) if gx is None else gx
        gy = torch.zeros_like(y) if gy is None else gy
        gz = torch.zeros_like(z) if gz is None else gz
        how = _How("vjp", ctx.max_refine, ctx.f64, ctx.diagnostics, ctx.reroute)
        anchors = [t for t in inputs if t is not None]
        if torch.is_grad_enabled() or functorch_active():  # anchored: second order refused
            u, v, w = TorchKKTSolve.apply(gx, gy, gz, Pf, Af, Gf, *rest, how, *anchors)
        else:  # plain backward (no create_graph): nothing can differentiate the result
            u, v, w = TorchKKTSolve.forward(gx, gy, gz, Pf, Af, Gf, *rest, how)
        need = ctx.needs_input_grad
        grads: list[Tensor | None] = [None] * 6

        def outer(left: Tensor, right: Tensor) -> Tensor:
            return left.unsqueeze(-1) * right.unsqueeze(-2)

        if need[0]:
            ux = outer(u, x)
            grads[0] = -0.5 * (ux + ux.mT)
        if need[1]:
            grads[1] = -u
        if inputs[2] is not None:
            grads[2] = -(outer(y, u) + outer(v, x)) if need[2] else None
            grads[3] = v if need[3] else None
        if inputs[4] is not None:
            grads[4] = -(outer(z, u) + outer(w, x)) if need[4] else None
            grads[5] = w if need[5] else None
        out = [None if g is None else _reduce(g, inputs[k], BASES[k]) for k, g in enumerate(grads)]
        return (*out, None, None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> tuple[Tensor | None, ...]:
        inputs, (x, y, z), rest = _unpack(ctx)
        Pf, _, Af, _, Gf, _ = batch_inputs(*inputs)
        dP, dq, dA, db, dG, dh = tangents[:6]
        r1, r2, r3 = torch.zeros_like(x), torch.zeros_like(y), torch.zeros_like(z)
        if dP is not None:
            r1 = r1 - 0.5 * (_bmv(dP, x) + _bmv(dP.mT, x))
        if dq is not None:
            r1 = r1 - dq
        if dA is not None:
            r1, r2 = r1 - _bmv(dA.mT, y), r2 - _bmv(dA, x)
        if db is not None:
            r2 = r2 + db
        if dG is not None:
            r1, r3 = r1 - _bmv(dG.mT, z), r3 - _bmv(dG, x)
        if dh is not None:
            r3 = r3 + dh
        how = _How("jvp", ctx.max_refine, ctx.f64, reroute=ctx.reroute)
        anchors = [t for t in inputs if t is not None]
        dx, dy, dz = TorchKKTSolve.apply(r1, r2, r3, Pf, Af, Gf, *rest, how, *anchors)
        return (dx, dy, dz, *([None] * (_N_OUT - 3)))

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
        """Fold the vmapped dimension into the batch: one solve of ``V * B`` samples."""
        V = info.batch_size
        B = logical_batch(args[:6], in_dims[:6], BASES)
        folded = [fold(V, t, d, k, B) for t, d, k in zip(args[:6], in_dims[:6], BASES)]
        outs = TorchQPFunction.apply(*folded, args[6], args[7])
        return tuple(unfold(V, t, B or 1) for t in outs), (0,) * _N_OUT


_Inputs = tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]


def _unpack(ctx: Any) -> tuple[_Inputs, tuple[Tensor, ...], tuple[Tensor, ...]]:
    """``(P, q, A, b, G, h)``, ``(x, y, z)`` and ``(status, polished, regular, L, w_ineq,
    w_eq, active)`` from the saved tensors."""
    saved = list(ctx.saved_tensors)
    ins = iter(saved[:-10])
    P, q = next(ins), next(ins)
    A, b = (next(ins), next(ins)) if ctx.present[0] else (None, None)
    G, h = (next(ins), next(ins)) if ctx.present[1] else (None, None)
    return (P, q, A, b, G, h), tuple(saved[-10:-7]), tuple(saved[-7:])


class TorchKKTSolve(FirstOrderOnly):
    """``(r1, r2, r3, P, A, G, status, polished, regular, L, w_ineq, w_eq, active, how,
    *anchors) ->
    (u, v, w)``: the refined reduced-KKT solve of the module docstring for the adjoint
    (``how.mode == "vjp"``) or the tangent (``"jvp"``), on ``(B, ...)`` tensors, with the
    refusals checked on plain tensors. ``w`` is zero off the active set."""

    @staticmethod
    def forward(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
        r1, r2, r3, P, A, G, status, polished, regular, L, w_ineq, w_eq, active = args[:13]
        how: _How = args[13]
        with small_threads(L.shape[-1], w_ineq.shape[-1], L.device):
            solved = status == code(Status.SOLVED)
            if how.reroute:  # the caller differentiates the other samples on the CPU path
                solved = solved & regular
            if how.mode == "jvp":  # no derivative where nothing was solved: NaN, below
                r1, r2, r3 = (torch.where(solved[:, None], r, 0.0) for r in (r1, r2, r3))
            used = (r1 != 0).any(-1) | (r2 != 0).any(-1) | (r3 != 0).any(-1)
            # an unpolished sample's active set is not confirmed by an exact KKT solve
            failed = used & (~solved | ~polished)
            factor = PenaltyFactor(
                L=L, w_ineq=w_ineq, w_eq=w_eq, active=active, max_refine=how.max_refine
            )
            u, v, w, res = kkt_solve(factor, P, A, G, r1, r2, r3)
            tol = 1e-10 if how.f64 else 1e-4
            bad = used & ~failed & ~(res <= tol)
            if bool((failed | bad).any()):
                raise _refusal(how.mode, failed, bad, status, polished, res, tol)
            diag = how.diagnostics
            if diag is not None:  # dxopt.qp.solve's BackwardDiagnostics: what the backward did
                diag.method, diag.linear_solver = "torch", "cholesky (the forward polish's factor)"
                diag.residual = float(torch.where(used, res, 0.0).amax()) if res.numel() else 0.0
                diag.refinement_steps = how.max_refine
                diag.n_active = tuple(active.sum(-1).tolist())
            w = w * active
            # a zero right-hand side has the exact solution 0 (whatever a failed factor holds)
            u, v, w = (torch.where(used[:, None], t, 0.0) for t in (u, v, w))
            if how.mode == "jvp":
                u, v, w = (torch.where(solved[:, None], t, float("nan")) for t in (u, v, w))
            return u, v, w

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
        """Every tensor argument has the batch dimension ``B``: fold ``V`` into it. Arguments
        not vmapped over (the factor, when only the (co)tangents are, as in ``jacrev`` and
        ``jacfwd``) are repeated ``V`` times, so ``V`` is taken in chunks of at most
        :data:`_REPEAT_BUDGET` repeated entries (one batched solve per chunk)."""
        V = info.batch_size
        status, d = args[6], in_dims[6]
        B = int(status.shape[0] if d is None else status.movedim(d, 0).shape[1])
        tensors, dims = args[:13], in_dims[:13]
        repeated = sum(t.numel() for t, d in zip(tensors, dims) if d is None)
        step = V if repeated == 0 else max(1, min(V, _REPEAT_BUDGET // repeated))
        parts = []
        for lo in range(0, V, step):
            c = min(step, V - lo)
            part = [t if d is None else t.narrow(d, lo, c) for t, d in zip(tensors, dims)]
            folded = [fold(c, t, d, t.ndim - 1 - (d is not None), B) for t, d in zip(part, dims)]
            outs = TorchKKTSolve.apply(*folded, *args[13:])
            parts.append([unfold(c, t, B) for t in outs])
        return tuple(torch.cat(ts, 0) for ts in zip(*parts)), (0, 0, 0)


def _refusal(
    mode: str,
    failed: Tensor,
    bad: Tensor,
    status: Tensor,
    polished: Tensor,
    res: Tensor,
    tol: float,
) -> QPBackwardError:
    idx_f = failed.nonzero().flatten().tolist()
    idx_b = bad.nonzero().flatten().tolist()
    what = "backward" if mode == "vjp" else "forward-mode derivative (jvp)"
    seed = "cotangent" if mode == "vjp" else "tangent"
    return QPBackwardError(
        f"torch QP {what} refused: "
        + (
            f"samples {idx_f} were not solved or not polished onto a verified active "
            f"set (statuses {[s.value for s in decode(status[failed])]}; "
            f"polished {polished[failed].tolist()}); "
            if idx_f
            else ""
        )
        + (
            f"samples {idx_b} have {'adjoint' if mode == 'vjp' else 'tangent'} residual "
            f"{res[bad].tolist()} > {tol} "
            "(degenerate or ill-conditioned KKT system); "
            if idx_b
            else ""
        )
        + f"give those samples a zero {seed}, or call dxopt.qp.solve(..., solver='torch'), "
        "which differentiates such samples by the CPU path's degenerate rules"
    )


def torch_qp_differentiable(
    P: Tensor,
    q: Tensor,
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    options: TorchOptions,
    call: TorchCall | None = None,
) -> TorchQPResult:
    """:func:`dxopt.qp.autograd.torch_entry.torch_qp_solve` with derivatives through ``x, y, z``
    (``options``, ``call``: see :class:`TorchQPFunction`)."""
    steps = TORCH_REFINE_STEPS if options.max_refinement is None else options.max_refinement
    if options.max_refinement is None:
        options = replace(options, max_refinement=steps)
    out: tuple[Tensor, ...] = TorchQPFunction.apply(P, q, A, b, G, h, options, call)
    return TorchQPResult.from_outputs(out, steps)
