"""Linear programs with a fixed feasible set: their data, parsed and validated once
(:class:`LPData`, read by :class:`LPOracle`, :class:`~dxopt.dfl.QPTL`,
:class:`~dxopt.dfl.LogBarrierLP` and :func:`~dxopt.dfl.binding_normals`), the certificate of
an LP answer (:func:`certify_lp`, qp's certificate with :math:`P = 0`) and the LP oracle
(:class:`LPOracle`, HiGHS or any :mod:`qpsolvers` backend).

The feasible set is :math:`S = \\{x : Ax = b,\\ Gx \\le h,\\ lb \\le x \\le ub\\}`; only the
costs change between calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from dxopt._core import Status, check_on_failure, check_positive, handle_failure
from dxopt.dfl._checks import as_array, lp_bounds, lp_dimension, lp_matrix
from dxopt.dfl._highs import import_highspy, new_highs, pass_model
from dxopt.dfl.oracle_base import OracleBase, OracleError, Sense

__all__ = [
    "LP_KEYWORDS",
    "LPCertificate",
    "LPData",
    "LPOracle",
    "certify_lp",
    "lp_keywords",
    "no_other_keywords",
    "split_lp",
]


@dataclass(frozen=True, eq=False)
class LPData:
    """The constraints :math:`Ax = b`, :math:`Gx \\le h`, :math:`lb \\le x \\le ub` of an LP in
    :attr:`dim` variables, as float64 numpy arrays (build it with :meth:`parse`).

    Attributes:
        dim: the number of variables.
        A, b: ``(p, dim)`` and ``(p,)`` equality rows, or both ``None``.
        G, h: ``(m, dim)`` and ``(m,)`` inequality rows, or both ``None``.
        lb, ub: ``(dim,)`` bounds, ``-inf`` / ``+inf`` where there is none.
    """

    dim: int
    A: np.ndarray | None
    b: np.ndarray | None
    G: np.ndarray | None
    h: np.ndarray | None
    lb: np.ndarray
    ub: np.ndarray

    @classmethod
    def parse(
        cls,
        owner: str,
        *,
        A: Any = None,
        b: Any = None,
        G: Any = None,
        h: Any = None,
        lb: Any = None,
        ub: Any = None,
    ) -> LPData:
        """Validate the LP's data (tensors, arrays, lists; a number for ``lb`` / ``ub`` bounds
        every entry): a matrix comes with its right-hand side, the dimension is fixed by a
        matrix or a bound vector, matrices are 2-D with ``dim`` columns and finite, right-hand
        sides have one entry per row, no NaN, ``lb <= ub``. Errors are ``ValueError`` naming
        the argument (``owner`` names the caller when the arguments disagree)."""
        dim = lp_dimension(owner, A=A, b=b, G=G, h=h, lb=lb, ub=ub)
        A_ = None if A is None else lp_matrix("A", A, dim)
        G_ = None if G is None else lp_matrix("G", G, dim)
        b_ = None if A_ is None else as_array("b", b, (A_.shape[0],))
        h_ = None if G_ is None else as_array("h", h, (G_.shape[0],))
        lb_, ub_ = lp_bounds(lb, ub, dim)
        for arr in (A_, b_, G_, h_, lb_, ub_):
            if arr is not None:
                arr.setflags(write=False)
        return cls(dim, A_, b_, G_, h_, lb_, ub_)

    @property
    def has_lower(self) -> np.ndarray:
        """``(dim,)`` bool: the entries with a finite lower bound."""
        return np.isfinite(self.lb)

    @property
    def has_upper(self) -> np.ndarray:
        """``(dim,)`` bool: the entries with a finite upper bound."""
        return np.isfinite(self.ub)

    def certificate_rows(self) -> _CertificateRows:
        """The rows and canonical problem :func:`certify_lp` reads, built on first use and
        kept (the data is read-only)."""
        cached: _CertificateRows | None = self.__dict__.get("_certificate_rows")
        if cached is None:
            cached = _certificate_rows(self)
            object.__setattr__(self, "_certificate_rows", cached)
        return cached

    def tensors(self, dtype: torch.dtype, device: Any = None) -> dict[str, Tensor | None]:
        """The keyword arguments ``A, b, G, h, lb, ub`` of :func:`dxopt.qp.solve` as tensors
        (``lb`` / ``ub`` ``None`` where every entry is infinite)."""

        def tensor(arr: np.ndarray | None) -> Tensor | None:
            return None if arr is None else torch.tensor(arr, dtype=dtype, device=device)

        return {
            "A": tensor(self.A),
            "b": tensor(self.b),
            "G": tensor(self.G),
            "h": tensor(self.h),
            "lb": tensor(self.lb) if self.has_lower.any() else None,
            "ub": tensor(self.ub) if self.has_upper.any() else None,
        }


def _lp_parameters() -> list[inspect.Parameter]:
    """The keyword parameters ``A, b, G, h, lb, ub`` of :meth:`LPData.parse` (written once)."""
    params = list(inspect.signature(LPData.parse).parameters.values())
    return [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


LP_KEYWORDS = tuple(p.name for p in _lp_parameters())
"""The names of the LP's data, ``("A", "b", "G", "h", "lb", "ub")``."""

F = TypeVar("F", bound=Callable[..., Any])


def lp_keywords(rest: str | None = None) -> Callable[[F], F]:
    """Decorator of a function taking the LP's data through ``**lp``: its signature (for
    ``help()``, IDEs, :mod:`inspect`) lists ``A, b, G, h, lb, ub`` as keyword-only parameters
    (default ``None``) in place of ``**lp``, followed by ``**rest`` when ``rest`` names other
    keywords it passes on (QPTL's options of :func:`dxopt.qp.solve`)."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        kinds = inspect.Parameter
        head = [p for p in params if p.kind is not kinds.VAR_KEYWORD]
        at = next((i for i, p in enumerate(head) if p.kind is kinds.KEYWORD_ONLY), len(head))
        tail = [kinds(rest, kinds.VAR_KEYWORD, annotation=Any)] if rest else []
        new = [*head[:at], *_lp_parameters(), *head[at:], *tail]
        fn.__signature__ = sig.replace(parameters=new)  # type: ignore[attr-defined]
        return fn

    return decorate


def split_lp(owner: str, options: dict[str, Any]) -> tuple[LPData, dict[str, Any]]:
    """:meth:`LPData.parse` of the LP keywords in ``options``, and the other keywords."""
    lp = {k: v for k, v in options.items() if k in LP_KEYWORDS}
    return LPData.parse(owner, **lp), {k: v for k, v in options.items() if k not in lp}


def no_other_keywords(owner: str, rest: dict[str, Any]) -> None:
    """A ``TypeError`` naming the keywords in ``rest`` (none expected)."""
    if rest:
        raise TypeError(
            f"{owner}: unexpected keyword(s) {sorted(rest)}; the LP is given by "
            f"{', '.join(LP_KEYWORDS)}."
        )


@dataclass(frozen=True)
class LPCertificate:
    """Per-sample certificate of LP answers (:meth:`LPData.certify`).

    Attributes:
        ok: ``(B,)`` bool, the answer and its multipliers pass qp's certificate.
        primal: ``(B,)`` :math:`\\max(\\|Ax - b\\|_\\infty, \\|(Gx - h)_+\\|_\\infty,
            \\|(lb - x)_+\\|_\\infty, \\|(x - ub)_+\\|_\\infty)`.
        dual: ``(B,)`` the stationarity residual
            :math:`\\|c + A^\\top\\mu + G^\\top\\nu - \\nu_l + \\nu_u\\|_\\infty`.
    """

    ok: np.ndarray
    primal: np.ndarray
    dual: np.ndarray


@dataclass(frozen=True, eq=False)
class _CertificateRows:
    """What the certificate reads of an :class:`LPData`, built once per LPData
    (:meth:`LPData.certificate_rows`): the inequality rows ``G``, ``h`` (``G``, then
    :math:`-e_i^\\top x \\le -lb_i` for the finite lower bounds, then :math:`e_i^\\top x
    \\le ub_i` for the finite upper ones), their max-norms ``g_inf``, and qp's canonical
    problem of :math:`P = 0` and these rows for one placeholder cost, whose ``q`` each call
    replaces."""

    G: np.ndarray
    h: np.ndarray
    g_inf: np.ndarray
    problem: Any  # dxopt.qp.problem.canonical.QPProblem


def _certificate_rows(data: LPData) -> _CertificateRows:
    from dxopt.qp.certify.polish import row_inf
    from dxopt.qp.problem.canonical import canonical_problem

    d = data.dim
    eye = np.eye(d)
    lo, hi = data.has_lower, data.has_upper
    rows = [M for M in (data.G, -eye[lo], eye[hi]) if M is not None]
    rhs = [v for v in (data.h, -data.lb[lo], data.ub[hi]) if v is not None]
    G, h = np.vstack(rows), np.concatenate(rhs)
    for arr in (G, h):
        arr.setflags(write=False)
    t = torch.from_numpy
    problem = canonical_problem(
        torch.zeros(d, d, dtype=torch.float64), torch.zeros(1, d, dtype=torch.float64),
        None if data.A is None else t(data.A.copy()), None if data.b is None else t(data.b.copy()),
        t(G.copy()) if G.shape[0] else None, t(h.copy()) if G.shape[0] else None,
        check_psd=False,
    )  # fmt: skip
    return _CertificateRows(G, h, row_inf(G), problem)


def certify_lp(
    data: LPData,
    c: np.ndarray,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    nu_lower: np.ndarray,
    nu_upper: np.ndarray,
    *,
    eps_abs: float,
    eps_rel: float,
) -> LPCertificate:
    """Certify the answers ``x`` ``(B, d)`` of :math:`\\min c^\\top x` over ``data`` with
    their multipliers, by qp's certificate (:func:`dxopt.qp.certify.polish.batch_accept_exact`,
    the one every QP answer passes, here with :math:`P = 0`): primal feasibility of every row
    and bound, stationarity :math:`c + A^\\top\\mu + G^\\top\\nu - \\nu_l + \\nu_u = 0`, signs
    and complementarity row by row, each against ``eps_abs`` / ``eps_rel`` (norm scales, never
    a normalised row).

    Args:
        c: ``(B, d)`` the costs minimised (the sign of ``sense`` applied).
        mu: ``(B, p)`` multipliers of :math:`Ax = b`; nu: ``(B, m)`` of :math:`Gx \\le h`;
            nu_lower, nu_upper: ``(B, d)`` of the bounds (read only where the bound is
            finite). Negative inequality multipliers are clipped at 0, so a wrong sign shows
            as a stationarity residual.
    """
    import dataclasses

    from dxopt.qp.certify.polish import batch_accept_exact

    B, d = c.shape
    if d != data.dim:
        raise ValueError(f"c: expected shape (B, {data.dim}), got {c.shape}.")
    if not np.isfinite(c).all():
        raise ValueError("c: expected finite costs, got NaN or infinite entries.")
    rows = data.certificate_rows()
    G, g_inf = rows.G, rows.g_inf
    lo, hi = data.has_lower, data.has_upper
    multipliers = [nu] if data.G is not None else []
    multipliers += [nu_lower[:, lo], nu_upper[:, hi]]
    nu_all = np.where(g_inf > 0, np.maximum(np.concatenate(multipliers, 1), 0.0), 0.0)
    # the cached canonical problem with this batch's costs (its data validated once)
    q = torch.from_numpy(np.ascontiguousarray(c, dtype=np.float64))
    problem = dataclasses.replace(rows.problem, q=q, batch=B)
    if G.shape[0] == 0:
        nu_all = np.zeros((B, 0))
    mu = mu if data.A is not None else np.zeros((B, 0))
    cert = batch_accept_exact(problem, x, mu, nu_all, g_inf, eps_abs=eps_abs, eps_rel=eps_rel)
    ok = np.broadcast_to(np.asarray(cert.ok, dtype=bool), (B,))
    primal = np.broadcast_to(np.asarray(cert.primal, dtype=float), (B,))
    return LPCertificate(ok.copy(), primal.copy(), np.asarray(cert.dual, dtype=float).copy())


class LPOracle(OracleBase):
    """:math:`x(c) \\in \\arg\\min_x c^\\top x` (``argmax`` with ``sense="max"``) s.t.
    :math:`Ax = b`, :math:`Gx \\le h`, :math:`lb \\le x \\le ub`; the feasible set is fixed, only
    ``c`` changes (parsed once into :attr:`data`, an :class:`~dxopt.dfl.lp.LPData`).

    Every answer is certified like every QP answer of :mod:`dxopt.qp` (with :math:`P = 0`):
    primal feasibility, stationarity with the solver's multipliers, signs and complementarity
    against ``eps_abs`` / ``eps_rel`` (:func:`~dxopt.dfl.lp.certify_lp`). :attr:`last_status`
    holds ``Status.SOLVED`` for a certified answer, ``Status.INACCURATE`` for an optimum the
    solver reported that fails the certificate, ``Status.INFEASIBLE`` / ``UNBOUNDED`` /
    ``FAILED`` from the solver; :attr:`last_certificate` (HiGHS only) the certificate of each
    sample of the last call (``ok`` False, residuals NaN where HiGHS reported no optimum).
    Any of these but ``SOLVED`` is handled by ``on_failure``.

    Args:
        A, b, G, h, lb, ub: the constraints (tensors or arrays; ``+-inf`` bounds allowed).
        sense: ``"min"`` or ``"max"``.
        solver: ``"highs"`` (HiGHS dual simplex through ``highspy``, one model built once and
            hot-started from the previous basis: about 0.1-0.3 ms a solve for 40 variables),
            ``"auto"`` (``"highs"`` when ``highspy`` is installed, else ``"piqp"``) or a
            :mod:`qpsolvers` name (``"piqp"``, ``"clarabel"``, ...), solved with ``P = 0`` by
            :func:`dxopt.qp.solve`, which polishes and certifies its answers (interior points
            may land on a non-vertex optimum on ties).
        eps_abs, eps_rel: the requested tolerances (HiGHS' primal and dual feasibility
            tolerances, default ``1e-7`` as HiGHS', and those of the certificate; for the
            qpsolvers backends those of :func:`dxopt.qp.solve`).
        on_failure: for answers that are not certified: ``"raise"`` (default, an
            :class:`OracleError`), ``"warn"``, ``"ignore"`` (the answers as they are, their
            status in :attr:`last_status`) or ``"nan"`` (NaN rows).
    """

    @lp_keywords()
    def __init__(
        self,
        *,
        sense: Sense = "min",
        solver: str = "auto",
        eps_abs: float = 1e-7,
        eps_rel: float = 0.0,
        on_failure: str = "raise",
        **lp: Any,
    ) -> None:
        self.data, rest = split_lp("LPOracle", lp)
        no_other_keywords("LPOracle", rest)
        super().__init__(dim=self.data.dim, sense=sense)
        self.A, self.b, self.G, self.h = self.data.A, self.data.b, self.data.G, self.data.h
        self.lb, self.ub = self.data.lb, self.data.ub
        self.eps_abs = check_positive("eps_abs", eps_abs)
        self.eps_rel = check_positive("eps_rel", eps_rel, allow_zero=True)
        self.on_failure = check_on_failure(on_failure, ("raise", "warn", "ignore", "nan"))
        if solver == "auto":
            try:
                import highspy  # noqa: F401

                solver = "highs"
            except ImportError:
                solver = "piqp"
        self.solver = solver
        self.last_certificate: LPCertificate | None = None
        self._highs: Any = None
        if solver == "highs":
            self._highs = self._build_highs()

    def _build_highs(self) -> Any:
        import scipy.sparse as sp

        highspy = import_highspy("LPOracle(solver='highs')")
        rows = [M for M in (self.A, self.G) if M is not None]
        lower = [self.b] if self.b is not None else []
        upper = [self.b] if self.b is not None else []
        if self.G is not None and self.h is not None:
            lower.append(np.full(self.G.shape[0], -np.inf))
            upper.append(self.h)
        hs = new_highs("LPOracle(solver='highs')")
        hs.setOptionValue("primal_feasibility_tolerance", self.eps_abs)
        hs.setOptionValue("dual_feasibility_tolerance", self.eps_abs)
        pass_model(
            hs,
            matrix=sp.csc_matrix(np.vstack(rows) if rows else np.zeros((0, self.dim))),
            row_lower=np.concatenate(lower) if lower else np.zeros(0),
            row_upper=np.concatenate(upper) if upper else np.zeros(0),
            col_lower=self.lb,
            col_upper=self.ub,
        )
        ms = highspy.HighsModelStatus
        self._optimal = ms.kOptimal
        self._statuses = {ms.kInfeasible: Status.INFEASIBLE, ms.kUnbounded: Status.UNBOUNDED}
        self._statuses[ms.kUnboundedOrInfeasible] = Status.UNBOUNDED
        self._cols = np.arange(self.dim, dtype=np.int32)
        return hs

    def _solve(self, c: np.ndarray) -> np.ndarray:
        c = self.sign * c
        if self._highs is None:
            out, status = self._solve_qp(c)
        else:
            out, status = self._solve_highs(c)
        self._status = tuple(status)
        bad = [i for i, st in enumerate(status) if st is not Status.SOLVED]
        if bad:
            cert = self.last_certificate
            seen = None if cert is None else np.isfinite(cert.primal)
            worst = "" if cert is None or seen is None or not seen.any() else (
                f"; largest primal / dual residuals {float(cert.primal[seen].max()):.3g} / "
                f"{float(cert.dual[seen].max()):.3g}"
            )  # fmt: skip
            what = ", ".join(f"{i}: {status[i].value}" for i in bad[:5])
            message = (
                f"LPOracle ({self.solver}): {len(bad)} of {len(status)} answers are not "
                f"certified optima at eps_abs={self.eps_abs:g}, eps_rel={self.eps_rel:g} "
                f"({what}){worst}; check the LP (infeasible / unbounded for these costs), or "
                "loosen eps_abs."
            )
            if self.on_failure == "nan":
                out[bad] = np.nan
            else:
                handle_failure(self.on_failure, message, error=OracleError,
                               status=status[bad[0]], stacklevel=4)  # fmt: skip
        return out

    def _solve_highs(self, c: np.ndarray) -> tuple[np.ndarray, list[Status]]:
        """One hot-started HiGHS solve per row, then the batch's certificate."""
        hs, (B, d) = self._highs, c.shape
        p = 0 if self.A is None else self.A.shape[0]
        out = np.full_like(c, np.nan)
        row_dual = np.zeros((B, p + (0 if self.G is None else self.G.shape[0])))
        col_dual = np.zeros((B, d))
        status = [Status.SOLVED] * B
        for i in range(B):
            hs.changeColsCost(self.dim, self._cols, c[i])
            hs.run()
            model_status = hs.getModelStatus()
            if model_status != self._optimal:
                status[i] = self._statuses.get(model_status, Status.FAILED)
                continue
            sol = hs.getSolution()
            out[i], row_dual[i], col_dual[i] = sol.col_value, sol.row_dual, sol.col_dual
        found = np.array([st is Status.SOLVED for st in status])
        nan = np.full(B, np.nan)
        self.last_certificate = LPCertificate(np.zeros(B, dtype=bool), nan, nan.copy())
        if found.any():
            # HiGHS: c - A'y = s (row duals y, reduced costs s); in qp's convention
            # c + A'mu + G'nu - nu_l + nu_u = 0: mu = -y_A, nu = -y_G, nu_l - nu_u = s
            s = col_dual[found]
            cert = certify_lp(
                self.data, c[found], out[found], -row_dual[found, :p], -row_dual[found, p:],
                np.maximum(s, 0.0), np.maximum(-s, 0.0), eps_abs=self.eps_abs,
                eps_rel=self.eps_rel,
            )  # fmt: skip
            full = self.last_certificate
            full.ok[found], full.primal[found], full.dual[found] = cert.ok, cert.primal, cert.dual
            for k in np.flatnonzero(found)[~cert.ok].tolist():
                status[k] = Status.INACCURATE
        return out, status

    def _solve_qp(self, c: np.ndarray) -> tuple[np.ndarray, list[Status]]:
        """The batch through :func:`dxopt.qp.solve` with ``P = 0`` (polished, certified)."""
        from dxopt.qp import solve

        kw = self.data.tensors(torch.float64)
        sol = solve(
            torch.zeros(self.dim, self.dim, dtype=torch.float64), torch.from_numpy(c),
            A=kw["A"], b=kw["b"], G=kw["G"], h=kw["h"], lb=kw["lb"], ub=kw["ub"],
            solver=self.solver, eps_abs=self.eps_abs, eps_rel=self.eps_rel, on_failure="ignore",
        )  # fmt: skip
        self.last_certificate = None
        out = sol.x.detach().numpy().reshape(c.shape).copy()
        status = [st if st is Status.SOLVED else (st if not st.ok else Status.INACCURATE)
                  for st in sol.status]  # fmt: skip
        return out, status
