"""The backend table: one :class:`Backend` record per CPU backend, and the one qpsolvers attempt.

Every property of a backend that the forward, the fallback chain, the lean route and the
router read is a field of its entry in :data:`BACKENDS`: how it is called (``call``: daqp
through its own API, :mod:`dxopt.qp.solvers.daqp`, the others through
:func:`qpsolvers.solve_problem`), the names of its stopping tolerances, the matrix formats it
takes, whether its point comes with an exact working set (the polish then runs only when the
point fails its certificate), whether the lean single route takes it and where it stands in
the fallback chain (:func:`dxopt.qp.solvers.attempts.fallback_chain`). A qpsolvers backend
without an entry (installed, but not listed here) gets :func:`backend`'s default record: no
tolerance settings, both formats, no exact working set, not lean, no fallback.

**Adding a backend** is one entry here (and, for a fallback, its ``fallback`` position);
``tests/qp/solvers/test_backends.py`` checks every entry against qpsolvers and the routes.

**Tolerances.** The requested tolerance is passed in each backend's own setting names (daqp
included: ``primal_tol``), with the relative part never below
``BACKEND_RELATIVE_FLOOR = 1e-12``: asked for more than double precision can reach on badly
scaled data, a backend stalls until its iteration limit (piqp on Maros-Meszaros CVXQP1_L,
n = 10000: the dual residual stops at 1e-8 on data of size 1e8, and the absolute 1e-9 kept it
iterating for 250 iterations; with the floor it stops after 14). The floor stays below the
certificate's own (``RELATIVE_FLOOR = 1e-10`` in :mod:`dxopt.qp.certify.tolerances`): at
``eps_rel = 1e-10`` piqp stops at points whose polish fails on a QP scaled by 1e8, at
``1e-12`` it does not.

**One qpsolvers attempt** (:func:`qpsolvers_attempt`): the problem built from the sample's
arrays, handed to the backend with its settings, the point read back as float64 with the
backend's own claims (found, iteration limit, infeasibility rays) and the multipliers it did
not return (or returned with the wrong size) marked missing. Both
:meth:`dxopt.qp.solvers.chain.FallbackChain.point` and the lean route's
:func:`dxopt.qp.lean.small.small_forward` call it; the polish of its point is
:func:`polish_attempt` for both.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import qpsolvers
import scipy.sparse as sp

from dxopt.qp.certify.certificates import hit_iteration_limit
from dxopt.qp.certify.polish import PolishResult
from dxopt.qp.certify.polish import polish as polish_solution

__all__ = [
    "BACKENDS",
    "BACKEND_RELATIVE_FLOOR",
    "Backend",
    "BackendPoint",
    "backend",
    "backend_kwargs",
    "fallback_backends",
    "polish_attempt",
    "qpsolvers_attempt",
]

BACKEND_RELATIVE_FLOOR = 1e-12
"""The least relative stopping tolerance passed to a backend (module docstring)."""

_FORMATS = ("dense", "sparse")


@dataclass(frozen=True)
class Backend:
    """One CPU backend of :func:`dxopt.qp.solve`.

    ``name``: the ``solver=`` name (qpsolvers' name); ``call``: ``"daqp"`` (daqp's own Python
    API on arrays built once per batch, its Cholesky the PSD certificate:
    :mod:`dxopt.qp.solvers.daqp`) or ``"qpsolvers"`` (:func:`qpsolvers_attempt`);
    ``abs_keys``/``rel_keys``: the settings that receive the absolute and the relative stopping
    tolerance (the relative one at least :data:`BACKEND_RELATIVE_FLOOR`), ``fixed`` further
    settings always passed; ``formats``: the matrix formats it takes, ``"dense"`` (numpy)
    and/or ``"sparse"`` (scipy CSC; data in the other format is converted for it);
    ``exact_working_set``: its point comes with an exact working set (active set backends: the
    polish runs only if the point fails); ``lean``: the lean single route
    (:mod:`dxopt.qp.lean.small`) takes it; ``fallback``: its position among the fallback
    chain's other backends (``None``: not one)."""

    name: str
    call: str = "qpsolvers"
    abs_keys: tuple[str, ...] = ()
    rel_keys: tuple[str, ...] = ()
    fixed: Mapping[str, float] = field(default_factory=dict)
    formats: tuple[str, ...] = _FORMATS
    exact_working_set: bool = False
    lean: bool = False
    fallback: int | None = None

    def __post_init__(self) -> None:
        if self.call not in ("daqp", "qpsolvers"):
            raise ValueError(
                f"call: expected 'daqp' or 'qpsolvers' for backend {self.name!r}, got "
                f"{self.call!r}."
            )
        if not self.formats or not set(self.formats) <= set(_FORMATS):
            raise ValueError(
                f"formats: expected a non-empty subset of {_FORMATS} for backend "
                f"{self.name!r}, got {self.formats!r}."
            )

    @property
    def dense_only(self) -> bool:
        """It takes dense arrays only (sparse data is densified for it)."""
        return "sparse" not in self.formats

    @property
    def sparse_only(self) -> bool:
        """It takes scipy CSC matrices only (dense data is converted for it)."""
        return "dense" not in self.formats

    def matrix(self, M: Any) -> Any:
        """A dense 2-D numpy matrix ``M`` (or ``None``) in this backend's format: scipy CSC for
        a sparse-only backend, else ``M`` itself."""
        return sp.csc_matrix(M) if M is not None and self.sparse_only else M

    def tolerances(self, eps_abs: float, eps_rel: float) -> dict[str, float]:
        """The stopping tolerances in this backend's own setting names."""
        rel = max(eps_rel, BACKEND_RELATIVE_FLOOR)
        kw = dict.fromkeys(self.abs_keys, eps_abs)
        kw.update(dict.fromkeys(self.rel_keys, rel))
        kw.update(self.fixed)
        return kw


def _entries(*records: Backend) -> Mapping[str, Backend]:
    return MappingProxyType({r.name: r for r in records})


BACKENDS: Mapping[str, Backend] = _entries(
    Backend(
        "daqp", call="daqp", abs_keys=("primal_tol",), formats=("dense",),
        exact_working_set=True, lean=True, fallback=2,
    ),
    Backend("piqp", abs_keys=("eps_abs",), rel_keys=("eps_rel",), lean=True, fallback=0),
    Backend("proxqp", abs_keys=("eps_abs",), rel_keys=("eps_rel",), lean=True),
    Backend(
        "clarabel", abs_keys=("tol_gap_abs", "tol_feas"), rel_keys=("tol_gap_rel",),
        fixed=MappingProxyType({"tol_ktratio": 1e-8}), formats=("sparse",), lean=True,
        fallback=1,
    ),
    Backend("osqp", abs_keys=("eps_abs",), rel_keys=("eps_rel",), formats=("sparse",), lean=True),
    Backend("scs", abs_keys=("eps_abs",), rel_keys=("eps_rel",), formats=("sparse",)),
    Backend("highs", abs_keys=("primal_feasibility_tolerance", "dual_feasibility_tolerance")),
)  # fmt: skip
"""The backend table (module docstring); read through :func:`backend`."""

_DEFAULTS: dict[str, Backend] = {}


def backend(name: str) -> Backend:
    """The table entry of ``name``, or the default record of a qpsolvers backend not listed
    (module docstring)."""
    entry = BACKENDS.get(name)
    if entry is None:
        entry = _DEFAULTS.get(name)
        if entry is None:
            entry = _DEFAULTS.setdefault(name, Backend(name))
    return entry


_RANKED: list[tuple[Mapping[str, Backend], tuple[Backend, ...]]] = []


def fallback_backends() -> tuple[Backend, ...]:
    """The entries with a ``fallback`` position, in that order (sorted once per table)."""
    if not _RANKED or _RANKED[0][0] is not BACKENDS:
        ranked = sorted((b for b in BACKENDS.values() if b.fallback is not None),
                        key=lambda b: b.fallback or 0)  # fmt: skip
        _RANKED[:] = [(BACKENDS, tuple(ranked))]
    return _RANKED[0][1]


def backend_kwargs(
    solver: str, eps_abs: float, eps_rel: float, options: dict[str, Any] | None
) -> dict[str, Any]:
    """The keyword arguments for ``solver``: its stopping tolerances from ``eps_abs``/
    ``eps_rel`` (:meth:`Backend.tolerances`), then the user's ``options``."""
    kw: dict[str, Any] = backend(solver).tolerances(eps_abs, eps_rel)
    kw.update(options or {})
    return kw


@dataclass(frozen=True)
class BackendPoint:
    """What one qpsolvers attempt returned: ``x`` (float64, ``None``: no point), the
    multipliers ``y`` (of ``A x = b``) and ``z`` (of ``G x <= h``), each ``None`` when the
    backend returned none or not one per row; ``found`` (the backend's own verdict),
    ``hit_cap`` (it stopped at its iteration limit), ``rays`` (its infeasibility certificates,
    OSQP's ``prim_inf_cert``/``dual_inf_cert``, when it found none) and ``messages`` (its
    warnings, recorded when asked)."""

    x: np.ndarray | None
    y: np.ndarray | None
    z: np.ndarray | None
    found: bool
    hit_cap: bool
    rays: Mapping[str, Any]
    messages: tuple[str, ...] = ()


def _multipliers(v: Any, rows: int) -> np.ndarray | None:
    if v is None:
        return None if rows else np.zeros(0)
    out = np.asarray(v, dtype=np.float64).reshape(-1)
    return out if out.size == rows else None


def qpsolvers_attempt(
    solver: str,
    args: Mapping[str, Any],
    *,
    kwargs: Mapping[str, Any],
    init: np.ndarray | None,
    record_warnings: bool,
) -> BackendPoint:
    """One call of ``solver`` through :func:`qpsolvers.solve_problem` on the sample's arrays
    ``args`` (``P, q, A, b, G, h`` in the backend's format: :meth:`Backend.formats`) with the
    settings ``kwargs`` (:func:`backend_kwargs`) from ``init``. ``record_warnings``: the
    backend's warnings are kept in :attr:`BackendPoint.messages` instead of reaching the user.
    Exceptions of the backend (a crash, an option it rejects) reach the caller, which decides."""
    problem = qpsolvers.Problem(
        args["P"], args["q"], args["G"], args["h"], args["A"], args["b"]
    )  # fmt: skip
    messages: tuple[str, ...] = ()
    if record_warnings:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            sol = qpsolvers.solve_problem(problem, solver=solver, initvals=init, **kwargs)
        messages = tuple(f"{solver}: {w.message}" for w in seen)
    else:
        sol = qpsolvers.solve_problem(problem, solver=solver, initvals=init, **kwargs)
    rays: Mapping[str, Any] = {}
    if not sol.found:
        extras = sol.extras if isinstance(sol.extras, dict) else {}
        rays = {k: extras.get(k) for k in ("prim_inf_cert", "dual_inf_cert")}
    x = None if sol.x is None else np.asarray(sol.x, dtype=np.float64)
    p = 0 if args["A"] is None else args["A"].shape[0]
    m = 0 if args["G"] is None else args["G"].shape[0]
    return BackendPoint(
        x, _multipliers(sol.y, p), _multipliers(sol.z, m), bool(sol.found),
        hit_iteration_limit(sol), rays, messages,
    )  # fmt: skip


def polish_attempt(
    args: Mapping[str, Any],
    x: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    *,
    eps_abs: float,
    eps_rel: float,
    enabled: bool,
    force: bool,
    exact_working_set: bool,
    g_inf: np.ndarray | None,
    a_inf: np.ndarray | None,
) -> PolishResult:
    """The polish and certificate of an attempt's point on the sample's arrays ``args``
    (:func:`dxopt.qp.certify.polish.polish`)."""
    return polish_solution(
        args["P"], args["q"], args["A"], args["b"], args["G"], args["h"], x, y, z,
        eps_abs=eps_abs, eps_rel=eps_rel, enabled=enabled, force=force,
        exact_working_set=exact_working_set, g_inf=g_inf, a_inf=a_inf,
    )  # fmt: skip
