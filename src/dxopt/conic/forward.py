"""The forward: a chain of backend attempts over the batch, every point certified by dxopt.

:func:`solve_forward` runs the attempts of :func:`attempts` in order over the samples still
unsolved (Clarabel at ``atol``; with ``fallback``, Clarabel 100x tighter, then SCS where it
is importable; ``solver="scs"`` puts SCS first, ``solver="torch"`` the batched interior
point of :mod:`dxopt.conic.ipm` where the cones allow). After each attempt the points are cleaned,
polished and certified together (:func:`dxopt.conic.certify.certify_points`); a backend's
infeasibility or unboundedness claim counts only with a checked certificate. What no attempt
solved ends ``MAX_ITER`` (a backend ran out of iterations), ``INACCURATE`` (a finite point
missed the certificate) or ``FAILED``. Certified samples at a cone's kink are ``DEGENERATE``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from dxopt._core import Cost, Status
from dxopt.conic.backends import RawPoints, run_clarabel, run_scs, scs_available
from dxopt.conic.certify import (
    Certified,
    PolishFactor,
    certify_infeasible,
    certify_points,
    certify_unbounded,
)
from dxopt.conic.cones._surface import ProjectionMemo, memo_scope
from dxopt.conic.cones.base import Cone
from dxopt.conic.ipm import run_torch
from dxopt.conic.ipm import supported as ipm_supported
from dxopt.conic.kkt import cone_kink, lu_storage, project_dual
from dxopt.conic.problem import ConicProblem
from dxopt.conic.types import ConicInfo, ConicOptions

__all__ = [
    "Attempt",
    "Chain",
    "ChainProblem",
    "Checks",
    "ForwardState",
    "attempts",
    "run_chain",
    "scale_of",
    "solve_forward",
]


class ChainProblem(Protocol):
    """What the chain needs of a problem: a dense :class:`ConicProblem` or the sparse
    route's (:mod:`dxopt.conic.sparse_problem`)."""

    @property
    def batch(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def m(self) -> int: ...
    @property
    def cones(self) -> tuple[Cone, ...]: ...
    @property
    def slices(self) -> tuple[slice, ...]: ...


Runner = Callable[[Any, list[int], float, int], RawPoints]


@dataclass(frozen=True)
class Attempt:
    """One backend run of the chain: its name, runner and stopping tolerance."""

    name: str
    run: Runner
    tol: float


def attempts(options: ConicOptions, prob: ChainProblem | None = None) -> list[Attempt]:
    """The chain for ``options`` (see the module doc); ``solver="torch"`` puts the batched
    interior point (:mod:`dxopt.conic.ipm`) first where ``prob`` is dense (the sparse route's
    problems go to Clarabel) and its cones are supported."""
    chain = _backends(options)
    if options.solver == "torch" and isinstance(prob, ConicProblem) and ipm_supported(prob.cones):
        chain.insert(0, Attempt("torch", run_torch, options.atol))
    return chain if options.fallback else chain[:1]


def _backends(options: ConicOptions) -> list[Attempt]:
    clarabel = [Attempt("clarabel", run_clarabel, options.atol)]
    if options.fallback:
        clarabel.append(Attempt("clarabel-tight", run_clarabel, options.atol / 100))
    scs = [Attempt("scs", run_scs, options.atol)] if scs_available() else []
    return scs + clarabel if options.solver == "scs" else clarabel + scs


@dataclass(frozen=True)
class Checks:
    """The certificate functions the chain calls: the dense ones of
    :mod:`dxopt.conic.certify` (:data:`DENSE_CHECKS`) or the sparse route's, which run the
    same checks on sparse matrix-vector products."""

    points: Callable[..., Certified]
    infeasible: Callable[[Any, list[int], Tensor, float], Tensor]
    unbounded: Callable[[Any, list[int], Tensor, float], Tensor]
    kink_scale: Callable[[Any, Tensor, Tensor, Tensor], Tensor]


@dataclass
class Chain:
    """What :func:`run_chain` found (float64 CPU tensors; failed samples hold zeros)."""

    x: Tensor
    y: Tensor
    s: Tensor
    w: Tensor
    status: list[Status]
    info: ConicInfo
    kink_scale: Tensor
    factor: PolishFactor | None


@dataclass
class ForwardState:
    """The certified forward of a batch (float64 CPU tensors; failed samples hold zeros)."""

    prob: ConicProblem
    options: ConicOptions
    x: Tensor
    y: Tensor
    s: Tensor
    w: Tensor
    status: list[Status]
    info: ConicInfo
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> Tensor:
        return torch.tensor([st.ok for st in self.status], dtype=torch.bool)


def solve_forward(
    prob: ConicProblem, options: ConicOptions, first: tuple[Attempt, ...] = ()
) -> ForwardState:
    """Solve and certify every sample of ``prob`` (module doc); ``first``: attempts run
    before the chain (the warm start, :mod:`dxopt.conic.warm`; not counted as backend calls)."""
    memo = ProjectionMemo()
    c = run_chain(prob, options, first, DENSE_CHECKS, memo=memo)
    cache: dict[str, Any] = {"kink_scale": c.kink_scale, "projection_memo": memo}
    if c.factor is not None:
        cache["polish_factor"] = c.factor
    return ForwardState(prob, options, c.x, c.y, c.s, c.w, c.status, c.info, cache)


def run_chain(
    prob: ChainProblem,
    options: ConicOptions,
    first: tuple[Attempt, ...],
    checks: Checks,
    *,
    memo: ProjectionMemo | None = None,
) -> Chain:
    """The attempts of the module doc over the pending samples, each point certified by
    ``checks``; then the kink classification. The cones' projections run through ``memo``
    (a fresh one if not given; :class:`~dxopt.conic.cones._surface.ProjectionMemo`)."""
    with memo_scope(ProjectionMemo() if memo is None else memo):
        return _run_chain(prob, options, first, checks)


def _run_chain(
    prob: ChainProblem, options: ConicOptions, first: tuple[Attempt, ...], checks: Checks
) -> Chain:
    start = time.perf_counter()
    B, n, m = prob.batch, prob.n, prob.m
    f64 = torch.float64
    X, Y, S, W = (torch.zeros(B, d, dtype=f64) for d in (n, m, m, m))
    status: list[Status | None] = [None] * B
    solvers, iters = [""] * B, [0] * B
    primal, dual, gap = [float("nan")] * B, [float("nan")] * B, [float("nan")] * B
    polished = [False] * B
    failures: list[list[str]] = [[] for _ in range(B)]
    last_claim = [""] * B
    pending = list(range(B))
    calls = 0
    factors = _Factors()
    for att in (*first, *attempts(options, prob)):
        if not pending:
            break
        raw = att.run(prob, pending, att.tol, options.max_iter)
        calls += len(pending) if att not in first else 0
        rx, ry, rs = (torch.from_numpy(a) for a in (raw.x, raw.y, raw.s))
        pos = {i: j for j, i in enumerate(raw.index)}
        point_idx = [
            i for i, c in zip(raw.index, raw.claims) if c not in ("infeasible", "unbounded")
        ]
        if point_idx:
            rows = [pos[i] for i in point_idx]
            cert = checks.points(prob, point_idx, rx[rows], ry[rows], rs[rows], options)
            ok_j = cert.ok.tolist()
            kept = [j for j, o in enumerate(ok_j) if o]
            if kept:
                jj = torch.as_tensor(kept, dtype=torch.long)
                ii = torch.as_tensor([point_idx[j] for j in kept], dtype=torch.long)
                X[ii], Y[ii], S[ii], W[ii] = cert.x[jj], cert.y[jj], cert.s[jj], cert.w[jj]
                factors.keep(cert.factor, ii, jj, B)
            cp, cd, cg = cert.primal.tolist(), cert.dual.tolist(), cert.gap.tolist()
            cpol = cert.polished.tolist()
            for j, i in enumerate(point_idx):
                if ok_j[j]:
                    status[i] = Status.SOLVED
                    primal[i], dual[i], gap[i], polished[i] = cp[j], cd[j], cg[j], cpol[j]
                    solvers[i], iters[i] = att.name, raw.iterations[pos[i]]
                else:
                    claim = raw.claims[pos[i]]
                    failures[i].append(f"{att.name} ({claim}): {cert.reasons[j]}")
                    last_claim[i] = claim
        for claim, check, st, what in (
            ("infeasible", checks.infeasible, Status.INFEASIBLE, ry),
            ("unbounded", checks.unbounded, Status.UNBOUNDED, rx),
        ):
            idx = [i for i, c in zip(raw.index, raw.claims) if c == claim]
            if not idx:
                continue
            good = check(prob, idx, what[[pos[i] for i in idx]], options.infeas_tol)
            for j, i in enumerate(idx):
                if bool(good[j]):
                    status[i], solvers[i], iters[i] = st, att.name, raw.iterations[pos[i]]
                else:
                    failures[i].append(f"{att.name}: its {claim} certificate did not check")
                    last_claim[i] = claim
        pending = [i for i in pending if status[i] is None]
    for i in pending:
        status[i] = (
            Status.MAX_ITER
            if last_claim[i] == "max_iter"
            else Status.FAILED
            if last_claim[i] == "failed"
            else Status.INACCURATE
        )
    final = [st if st is not None else Status.FAILED for st in status]
    scale = checks.kink_scale(prob, X, W, Y)
    kink = _kinks(prob, W, scale, final, options.kink_tol)
    final = [Status.DEGENERATE if k and st is Status.SOLVED else st for k, st in zip(kink, final)]
    info = ConicInfo(
        solvers=tuple(solvers),
        iterations=tuple(iters),
        primal_residual=tuple(primal),
        dual_residual=tuple(dual),
        gap=tuple(gap),
        kink=tuple(kink),
        polished=tuple(polished),
        failures=tuple(tuple(f) for f in failures),
        cost=Cost(forwards=calls, seconds=time.perf_counter() - start),
    )
    return Chain(X, Y, S, W, final, info, scale, factors.factor)


class _Factors:
    """The polish's LUs of the certified samples, by batch index (for the backward)."""

    def __init__(self) -> None:
        self.factor: PolishFactor | None = None

    def keep(self, cert: PolishFactor | None, ii: Tensor, jj: Tensor, B: int) -> None:
        if cert is None:
            return
        has = cert.has[jj]
        if not bool(has.any()):
            return
        ii, jj = ii[has], jj[has]
        k = cert.LU.shape[0]
        if self.factor is None and ii.numel() == B == k and bool((ii == jj).all()):
            # the whole batch certified in the first attempt, in order: no copy
            self.factor = PolishFactor(has=cert.has[jj], LU=cert.LU, piv=cert.piv, D=cert.D)
            return
        if self.factor is None:
            N, m = cert.LU.shape[-1], cert.D.shape[-1]
            self.factor = PolishFactor(
                has=torch.zeros(B, dtype=torch.bool),
                LU=lu_storage(B, N, cert.LU),
                piv=torch.ones(B, N, dtype=cert.piv.dtype),
                D=cert.D.new_zeros((B, m, m)),
            )
        f = self.factor
        f.has[ii] = True
        f.LU[ii], f.piv[ii], f.D[ii] = cert.LU[jj], cert.piv[jj], cert.D[jj]


def kink_scale(prob: ConicProblem, x: Tensor, w: Tensor, *, y: Tensor | None = None) -> Tensor:
    """The scale the kink tolerance is relative to, per sample: the largest of
    :math:`\\Vert w\\Vert_\\infty` (``w = y - s``) and the scales of the primal and dual
    residuals (:mod:`dxopt.conic.certify`), so that a point whose ``y`` and ``s`` are both
    near zero is judged against the data, not against itself. Every part is a max-norm, so
    the scale does not grow with the number of cones (a 2-norm of ``w`` over ``m`` rows would
    flag a multiplier of ``sqrt(m) * kink_tol`` as a kink). ``y`` is
    :math:`\\Pi_{K^*}(w)` where the caller has it."""
    P, A = prob.P, prob.A
    if y is None:
        y = project_dual(prob.cones, prob.slices, w)
    Ax = (A @ x[..., None])[..., 0]
    Px = (P @ x[..., None])[..., 0]
    Aty = (A.transpose(-1, -2) @ y[..., None])[..., 0]
    return scale_of(w, y, (Ax, Px, Aty), (prob.q, prob.b))


def scale_of(
    w: Tensor, y: Tensor, products: tuple[Tensor, Tensor, Tensor], data: tuple[Tensor, Tensor]
) -> Tensor:
    """:func:`kink_scale` from the products ``(Ax, Px, A'y)`` and ``(q, b)`` (dense or
    sparse matvecs alike)."""
    Ax, Px, Aty = products
    q, b = data
    s = y - w

    def amax(v: Tensor) -> Tensor:
        return v.abs().amax(dim=-1)

    parts = [amax(w), amax(Ax), amax(s), amax(b)]
    parts += [amax(Px), amax(Aty), amax(q)]
    return torch.stack(parts).amax(dim=0)


def _kinks(
    prob: ChainProblem, W: Tensor, scale: Tensor, status: list[Status], tol: float
) -> list[bool]:
    flag = cone_kink(prob.cones, prob.slices, W, tol, scale)
    return [bool(f) and st.ok for f, st in zip(flag.tolist(), status)]


def _dense_kink_scale(prob: ConicProblem, x: Tensor, w: Tensor, y: Tensor) -> Tensor:
    return kink_scale(prob, x, w, y=y)


DENSE_CHECKS = Checks(certify_points, certify_infeasible, certify_unbounded, _dense_kink_scale)
"""The chain's certificate on dense data (:mod:`dxopt.conic.certify`)."""
