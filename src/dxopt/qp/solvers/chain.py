"""The fallback chain: the attempts of one forward as a list of values, run sample by sample,
every point polished and certified in one place (:meth:`FallbackChain.judge`).

Owns :class:`FallbackChain` (the backend calls, the PSD bookkeeping, the polish and certificate
of each point, the record of why each attempt failed, the outputs) and :class:`SampleLog`. The
attempts themselves (:class:`~dxopt.qp.solvers.attempts.Attempt`,
:func:`~dxopt.qp.solvers.attempts.fallback_chain`) are values of
:mod:`dxopt.qp.solvers.attempts`; multipliers a backend did not return are recovered by
:mod:`dxopt.qp.solvers.duals`. Which backend ``"auto"``
picks is :mod:`dxopt.qp.solvers.routing`'s; how each backend is called, with which settings,
is its entry in :mod:`dxopt.qp.solvers.backends` (one qpsolvers attempt:
:func:`~dxopt.qp.solvers.backends.qpsolvers_attempt`); the entry point and the batch fast path
are :mod:`dxopt.qp.solvers.forward`'s.

**Certificate.** Every backend's output is polished on its active set and certified against
the requested tolerances (componentwise scales, zero rows handled explicitly;
:mod:`dxopt.qp.certify.polish`). A point is polished when it does not certify, is off by more
than round-off, or leaves a row's side unsettled (slack and multiplier both small, as at an
interior-point solution); a looser-tolerance attempt is always polished. A sample is ``SOLVED``
only if the certificate passes; a point is judged by its certificate, not by the backend's
status (some backends stop with "max iterations" at a point that is a solution within
tolerance). Missing multipliers are recovered by least squares on the active rows,
:math:`[G_J^\\top\\ A^\\top][\\nu_J; \\mu] = -(Px^\\star + q)`
(:func:`~dxopt.qp.solvers.duals.recover_duals`).

**The chain** (``fallback=True``, the default): when an attempt fails, reports infeasible or
unbounded, or its polished point does not certify, the next attempt runs (also when the point
certifies only by its duality gap, i.e. its active set is not settled; such a point is used
only if no attempt gives a settled one): the requested backend, then ``piqp``, ``clarabel``,
``daqp`` (dense, or n <= 1000: ``DENSE_FALLBACK_MAX_N``), then the requested backend at the
looser stopping tolerance
:math:`\\max(10^3\\varepsilon_{abs}, 10^{-7})` (the polish restores the accuracy; the
certificate is still the requested one; skipped when that backend's strict point already
certified, by its duality gap only: the looser stop is for a backend that stalls short of the
tolerance, and cannot settle a point that reached it). Why: on the Maros-Meszaros set piqp
reports ``failed``/``infeasible`` on some feasible problems that clarabel solves, and the
reverse; an early stop at a looser tolerance followed by an exact polish rescues problems where
the backend stalls near the optimum. Which backend and stopping tolerance produced each sample
is recorded (``QPInfo.sample_solvers``, ``QPInfo.sample_tolerances``). A sample that no attempt
certifies is ``INFEASIBLE`` or ``UNBOUNDED`` only with a certificate checked by
:mod:`dxopt.qp.certify.certificates`; without one it is ``MAX_ITER``, ``INACCURATE`` or
``FAILED``, and ``ForwardResult.reasons`` says what to change and what each attempt saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dxopt.qp.certify.certificates import diagnose
from dxopt.qp.certify.polish import PolishResult, row_inf
from dxopt.qp.problem.canonical import NotPSDError, QPProblem, check_psd
from dxopt.qp.problem.contracts import ForwardResult
from dxopt.qp.problem.types import QPStatus
from dxopt.qp.solvers.attempts import Attempt, fallback_chain
from dxopt.qp.solvers.backends import backend, backend_kwargs, polish_attempt, qpsolvers_attempt
from dxopt.qp.solvers.daqp import FACTORED_FLAGS, DaqpBatch, DaqpPoint
from dxopt.qp.solvers.duals import finite_or_zero, recover_duals
from dxopt.qp.solvers.routing import numpy_views, sample_view

__all__ = [
    "DAQP_CLAIMS",
    "DAQP_ITERATION_LIMIT",
    "Attempt",
    "FallbackChain",
    "SampleLog",
    "fallback_chain",
]

DAQP_ITERATION_LIMIT = -4  # DAQP's exit flag at its iteration limit (dxopt.qp.solvers.daqp)
DAQP_CLAIMS = {-1: "daqp: infeasible", -3: "daqp: unbounded"}  # claims, without a ray
_NAMES = ("P", "q", "A", "b", "G", "h")


Point = tuple[Any, np.ndarray, np.ndarray, np.ndarray]
"""A backend's point ``(args, x, mu, nu)``; ``args`` (the sample's arrays) is ``None`` when
the backend did not need them (daqp), and rebuilt on demand."""


@dataclass
class SampleLog:
    """What the attempts of one sample saw: an iteration limit, a point that missed the
    tolerance (the least worst-residual / tolerance ratio and which attempt gave it), the
    backends' infeasibility claims (for :func:`diagnose`), the first point certified by its
    duality gap only, and one line per failed attempt (the reason)."""

    hit_cap: bool = False
    missed: bool = False
    best_miss: float = float("inf")
    best_from: str = ""
    claims: list[dict[str, Any]] = field(default_factory=list)
    #: the backends' own warnings (e.g. qpsolvers' "Clarabel.rs terminated with status
    #: PrimalInfeasible"), kept here instead of reaching the user: dxopt certifies every point
    #: and reports each sample's status itself
    backend_warnings: list[str] = field(default_factory=list)
    candidate: tuple[Attempt, PolishResult] | None = None
    gap_certified: set[str] = field(default_factory=set)
    trail: list[str] = field(default_factory=list)


class FallbackChain:
    """Runs the attempts of :func:`fallback_chain` on the samples of ``problem``.

    :meth:`point` calls an attempt's backend on one sample; :meth:`judge` polishes and
    certifies a point (the one place that does) and records why it failed; :meth:`run` walks
    the chain for one sample from its first point; :meth:`result` assembles the
    :class:`ForwardResult`. ``psd_pending``: ``P`` has not been checked for positive
    semidefiniteness yet; daqp's own Cholesky certifies it, and a sample whose factorization
    fails is checked by :func:`dxopt.qp.problem.canonical.check_psd` before anything else uses
    it."""

    def __init__(
        self,
        problem: QPProblem,
        attempts: tuple[Attempt, ...],
        *,
        eps_abs: float,
        eps_rel: float,
        polish: bool,
        warm_start: np.ndarray | None,
        psd_pending: bool,
    ) -> None:
        self.problem, self.attempts = problem, attempts
        self.backends = tuple(backend(a.solver) for a in attempts)  # their table entries
        self.eps_abs, self.eps_rel, self.polish = eps_abs, eps_rel, polish
        self.warm = warm_start
        self.logs: dict[int, SampleLog] = {}
        self.reasons: dict[int, str] = {}
        self._views: dict[str, dict[str, Any]] = {}
        self._kwargs: dict[int, dict[str, Any]] = {}
        self._daqp: DaqpBatch | None = None
        self._row_norms: dict[str, np.ndarray | None] = {}
        size = problem.size
        self._psd_shared = problem.P.ndim == 2  # one P for the batch: one certificate for all
        self._psd_done: set[int] = set() if psd_pending else set(range(size))

    def prepare_outputs(self) -> None:
        """Allocate the outputs (NaN rows, ``FAILED``): only when some sample takes the
        per-sample path (a batch certified at once never needs them)."""
        size, n, m, p = self.problem.size, self.problem.n, self.problem.m, self.problem.p
        self.x = np.full((size, n), np.nan)
        self.mu, self.nu = np.full((size, p), np.nan), np.full((size, m), np.nan)
        self.active = np.zeros((size, m), dtype=bool)
        self.status: list[QPStatus] = [QPStatus.FAILED] * size
        self.used_solver: list[str] = [""] * size
        self.used_eps: list[float] = [float("nan")] * size
        self.polished: list[bool] = [False] * size
        self.settled: list[bool] = [True] * size

    # ---------------------------------------------------------------- data, once per batch

    def views(self, solver: str) -> dict[str, Any]:
        if solver not in self._views:
            self._views[solver] = numpy_views(self.problem, solver)
        return self._views[solver]

    def sample_args(self, solver: str, i: int) -> dict[str, Any]:
        v = self.views(solver)
        return {k: sample_view(v, k, i) for k in _NAMES}

    def row_norm(self, name: str) -> np.ndarray | None:
        """Row max-norms of a shared ``G``/``A`` (once per batch, when first needed); ``None``
        for a batched or absent matrix (the per-sample code computes its own)."""
        if name not in self._row_norms:
            M = getattr(self.problem, name)
            if M is None or M.ndim != 2:
                self._row_norms[name] = None
            else:
                pair = self.problem.csr.get(name)
                self._row_norms[name] = row_inf(pair[0] if pair is not None else M.numpy())
        return self._row_norms[name]

    def kwargs(self, k: int) -> dict[str, Any]:
        """The backend settings of attempt ``k`` (once per batch)."""
        if k not in self._kwargs:
            a = self.attempts[k]
            opts = dict(a.options) if a.options else None
            self._kwargs[k] = backend_kwargs(a.solver, a.eps_abs, self.eps_rel, opts)
        return self._kwargs[k]

    def log(self, i: int) -> SampleLog:
        return self.logs.setdefault(i, SampleLog())

    # ------------------------------------------------------------------- PSD bookkeeping

    def _psd_certified(self, i: int) -> None:
        self._psd_done.update(range(self.problem.size) if self._psd_shared else (i,))

    def ensure_psd(self, i: int) -> None:
        if i not in self._psd_done:
            check_psd(self.problem, None if self._psd_shared else i)  # raises if not PSD
            self._psd_certified(i)

    def _call_daqp(self, i: int, kw: dict[str, Any], init: np.ndarray | None) -> DaqpPoint:
        if self._daqp is None:
            v = self.views("daqp")
            self._daqp = DaqpBatch(*(v[k] for k in _NAMES))
        batch = self._daqp
        if i in self._psd_done:
            return batch.solve(i, kw, init)
        # daqp's Cholesky of P (no proximal regularisation) is the PSD certificate
        out = batch.solve(i, {**kw, "eps_prox": 0.0}, init)
        if out.flag in FACTORED_FLAGS:
            self._psd_certified(i)
            return out
        self.ensure_psd(i)  # PSD but singular (or an unexpected flag): with daqp's prox
        return batch.solve(i, kw, init)

    # ---------------------------------------------------------------------- one attempt

    def point(self, i: int, k: int, *, clean: bool = True) -> Point | None:
        """The point of attempt ``k`` on sample ``i`` (``None``: no point, recorded).
        ``clean=False`` (daqp's first pass) leaves the finiteness checks of :meth:`clean` to
        the batch certificate, which refuses non-finite points."""
        step = self.attempts[k]
        warm = self.warm
        init = None if warm is None else (warm[i] if warm.ndim == 2 else warm)
        kw = self.kwargs(k)
        args = None
        try:
            if self.backends[k].call == "daqp":
                out = self._call_daqp(i, kw, init)
                if out.x is None and init is not None:  # a warm start that failed: cold
                    out = self._call_daqp(i, kw, None)
                if out.flag == DAQP_ITERATION_LIMIT:
                    self.log(i).hit_cap = True
                elif out.flag in DAQP_CLAIMS:  # a claim without a ray: diagnose decides
                    self.log(i).claims.append({"claim": DAQP_CLAIMS[out.flag]})
                if out.x is None:
                    return self._failed(i, step, f"no point (daqp exit flag {out.flag})")
                x, y, z = out.x, out.eq_duals, out.ineq_duals
            else:
                self.ensure_psd(i)
                args = self.sample_args(step.solver, i)
                pt = qpsolvers_attempt(step.solver, args, kwargs=kw, init=init,
                                       record_warnings=True)  # fmt: skip
                log = self.log(i)
                log.backend_warnings.extend(pt.messages)
                if pt.hit_cap:
                    log.hit_cap = True
                if not pt.found:  # the backend's own rays (OSQP), checked in diagnose
                    log.claims.append({"claim": step.solver, **pt.rays})
                if pt.x is None:
                    return self._failed(i, step, "no point")
                x, y, z = pt.x, pt.y, pt.z
        except (TypeError, AttributeError) as err:
            if step.options:
                raise ValueError(
                    f"solver_options: the backend {step.solver!r} rejected the options "
                    f"{sorted(step.options)} ({type(err).__name__}: {err}). Use the setting "
                    f"names of {step.solver}'s own documentation."
                ) from err
            return self._failed(i, step, f"crashed ({type(err).__name__})")
        except NotPSDError:  # ensure_psd: P is not PSD, the user's error
            raise
        except Exception as err:  # a backend crash: try the next one in the chain
            return self._failed(i, step, f"crashed ({type(err).__name__})")
        p, m = self.problem.p, self.problem.m
        if (p and (y is None or y.size != p)) or (m and (z is None or z.size != m)):
            if not np.all(np.isfinite(x)):
                return self._failed(i, step, "a non-finite point")
            a = self.sample_args(step.solver, i) if args is None else args
            y, z = recover_duals(a["P"], a["q"], a["A"], a["G"], a["h"], x, self.eps_abs)
        point: Point = (args, x, y, z)  # type: ignore[assignment]  # y, z set above
        return self.clean(i, step, point) if clean else point

    def clean(self, i: int, step: Attempt, point: Point | None) -> Point | None:
        """No point if ``x`` is not finite; non-finite multipliers become finite."""
        if point is None:
            return None
        if not np.all(np.isfinite(point[1])):
            return self._failed(i, step, "a non-finite point")
        args, x, y, z = point
        y = np.zeros(0) if not self.problem.p else finite_or_zero(y)
        z = np.zeros(0) if not self.problem.m else finite_or_zero(z)
        return args, x, y, z

    def _failed(self, i: int, step: Attempt, why: str) -> Point | None:
        """Record why attempt ``step`` gave sample ``i`` no point; no point."""
        self.log(i).trail.append(f"{step.label()}: {why}")
        return None

    def judge(self, i: int, step: Attempt, point: Point) -> bool | QPStatus:
        """Polish and certify ``point``: ``True`` when stored (solved), a status when the
        sample is decided otherwise (a zero row of ``G`` with ``h_i < 0``), ``False`` when the
        chain goes on (the reason is recorded)."""
        args, x, y, z = point
        if args is None:
            args = self.sample_args(step.solver, i)
        pol = polish_attempt(
            args, x, y, z, eps_abs=self.eps_abs, eps_rel=self.eps_rel, enabled=self.polish,
            force=step.loose, exact_working_set=backend(step.solver).exact_working_set,
            g_inf=self.row_norm("G"), a_inf=self.row_norm("A"),
        )  # fmt: skip
        cert = pol.certificate
        if cert.zero_row_infeasible:  # 0'x <= h_i < 0: the ray e_i, checked
            self.reasons[i] = "a zero row of G with h_i < 0 (0 <= h_i is false)"
            return QPStatus.INFEASIBLE
        if not cert.ok:
            log = self.log(i)
            log.missed = True
            miss = max(cert.primal, cert.dual, cert.sign, min(cert.complementarity, cert.gap))
            if miss < log.best_miss:
                log.best_miss, log.best_from = miss, step.label()
            log.trail.append(
                f"{step.label()}: a point that misses the tolerance (residual / tolerance: "
                f"primal {cert.primal:.3g}, dual {cert.dual:.3g}, complementarity "
                f"{min(cert.complementarity, cert.gap):.3g}; "
                f"{'polished' if pol.polished else 'the polish did not certify it'})"
            )
            return False
        if not cert.settled and not step.final:
            log = self.log(i)  # certified by the gap only: look further
            if log.candidate is None:
                log.candidate = (step, pol)
            log.gap_certified.add(step.solver)
            log.trail.append(f"{step.label()}: certified by the duality gap only (unsettled)")
            return False
        self.store(i, step, pol)
        return True

    def store(self, i: int, step: Attempt, pol: PolishResult) -> None:
        self.x[i] = pol.x
        if self.problem.p:
            self.mu[i] = pol.mu
        if self.problem.m:
            self.nu[i] = np.maximum(pol.nu, 0.0)
            self.active[i] = pol.active
        self.status[i] = QPStatus.SOLVED
        self.used_solver[i], self.used_eps[i] = step.solver, step.eps_abs
        self.polished[i] = pol.polished
        self.settled[i] = pol.certificate.settled

    def accept(self, i: int, x: np.ndarray, mu: np.ndarray, nu: np.ndarray) -> None:
        """Store a point of the first attempt certified as it is (the batch certificate)."""
        self.x[i] = x
        if self.problem.p:
            self.mu[i] = mu
        if self.problem.m:
            self.nu[i] = nu
            self.active[i] = nu > 0
        self.status[i] = QPStatus.SOLVED
        self.used_solver[i], self.used_eps[i] = self.attempts[0].solver, self.attempts[0].eps_abs

    # ------------------------------------------------------------------------ one sample

    def run(self, i: int, first: Point | None) -> None:
        """Walk the chain for sample ``i`` from the first attempt's point ``first``."""
        for k, step in enumerate(self.attempts):
            log = self.logs.get(i)
            if step.loose and log is not None and step.solver in log.gap_certified:
                # the looser stop is for a backend that stalls short of the tolerance; this
                # one reached it (its point certified), so a looser stop cannot settle it
                continue
            point = self.clean(i, step, first) if k == 0 else self.point(i, k)
            if point is None:
                continue
            verdict = self.judge(i, step, point)
            if verdict is True:
                return
            if verdict is not False:
                self.status[i] = verdict
                return
        log = self.log(i)
        if log.candidate is not None:  # no settled point anywhere: the first gap-certified
            self.store(i, *log.candidate)
            return
        self.ensure_psd(i)
        diagnosis = diagnose(
            self.sample_args(self.attempts[0].solver, i),
            claims=log.claims,
            hit_cap=log.hit_cap,
            had_point=log.missed,
            eps_abs=self.eps_abs,
            best_miss=log.best_miss,
            best_from=log.best_from,
        )
        self.status[i] = diagnosis.status
        trail = f" (attempts: {'; '.join(log.trail)})" if log.trail else ""
        self.reasons[i] = diagnosis.reason + trail

    def result(self, solver: str, solve_time: float) -> ForwardResult:
        size = self.problem.size
        return ForwardResult(
            x=torch.from_numpy(self.x),
            eq_duals=torch.from_numpy(self.mu),
            ineq_duals=torch.from_numpy(self.nu),
            status=tuple(self.status),
            solver=solver,
            solve_time=solve_time,
            active=torch.from_numpy(self.active),
            sample_solvers=tuple(self.used_solver),
            sample_eps=tuple(self.used_eps),
            polished=tuple(self.polished),
            settled=tuple(self.settled),
            reasons=tuple(self.reasons.get(i, "") for i in range(size)) if self.reasons else (),
        )
