"""The keyword options of :func:`dxopt.qp.solve`, written once: :class:`QPOptions`.

:func:`dxopt.qp.solve` builds one from its keywords (:meth:`QPOptions.of`),
:class:`dxopt.qp.QPLayer` stores one, the router (:mod:`dxopt.qp.api.route`) reads it, and an
``executor=``
(:class:`dxopt.qp.problem.executor.QPExecutor`) receives it as one value. A new option is a new
field here (with its check in :meth:`QPOptions.check`); the signatures of ``solve`` and
``QPLayer`` list the same names (``tests/qp/api/test_route.py`` holds them equal).

May import: ``contracts`` (the backward-method protocol), ``dxopt._core``.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, fields
from typing import Any

from dxopt._core import check_on_failure
from dxopt.qp.problem.contracts import BackwardMethod

__all__ = ["COMPILED_SOLVER", "INFEASIBLE_MODES", "QPOptions", "solver_names"]

COMPILED_SOLVER = "dual_active_set"
"""The name of dxopt's compiled dual active-set solver (:mod:`dxopt.qp.solvers.dual_active_set`)."""

_BACKWARD_NAMES = ("penalty", "kkt")
INFEASIBLE_MODES = ("fail", "relax")
"""``infeasible=``: ``"fail"`` (a certified-infeasible sample is a failure, handled by
``on_failure``) or ``"relax"`` (solve the closest feasible problem, :mod:`dxopt.qp.api.relax`)."""
_CACHE_SIZE = 64  # distinct option sets kept (a model uses one or two)


@functools.lru_cache(maxsize=1)
def solver_names() -> frozenset[str]:
    """The names ``solve`` takes besides ``"auto"``: ``"torch"``, ``"dual_active_set"`` and the
    installed qpsolvers backends."""
    import qpsolvers

    return frozenset(("torch", COMPILED_SOLVER, *qpsolvers.available_solvers))


@dataclass(frozen=True, kw_only=True)
class QPOptions:
    """Every keyword option of :func:`dxopt.qp.solve` and :class:`dxopt.qp.QPLayer` (the
    problem data ``P, q, A, b, G, h, lb, ub, warm_start`` aside); the meaning of each field is
    documented on :func:`dxopt.qp.solve`. Checked when built (:meth:`check`: ``ValueError`` or
    ``TypeError`` naming the option)."""

    backward: str | BackwardMethod = "penalty"
    solver: str = "auto"
    eps_abs: float = 1e-9
    eps_rel: float = 0.0
    on_failure: str = "raise"
    max_workers: int | None = None
    solver_options: dict[str, Any] | None = None
    check_psd: bool = True
    executor: Any = None
    fallback: bool = True
    polish: bool = True
    infeasible: str = "fail"

    def __post_init__(self) -> None:
        self.check()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in field order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(
        cls,
        backward: str | BackwardMethod,
        solver: str,
        eps_abs: float,
        eps_rel: float,
        on_failure: str,
        max_workers: int | None,
        solver_options: dict[str, Any] | None,
        check_psd: bool,
        executor: Any,
        fallback: bool,
        polish: bool,
        infeasible: str = "fail",
    ) -> QPOptions:
        """The checked options of one ``solve`` call: the same object for the same option set
        (the frozen dataclass's ``__init__`` costs 2 us, the tiny solve's per-call budget; a
        cache hit 0.2 us). Option sets with a dict or an executor are built afresh; the backward
        method and the flags are compared by identity (``check_psd=1`` equals ``True`` but is
        refused)."""
        # a method object by identity (its hash would hash every field on each call)
        method_key = backward if backward.__class__ is str else id(backward)
        key = (method_key, solver, eps_abs, eps_rel, on_failure, max_workers, fallback, polish,
               infeasible)  # fmt: skip
        if solver_options is None and executor is None:
            try:
                hit = _CACHE.get(key)
            except TypeError:  # an unhashable value: a bad option, the check below says which
                hit = None
            if (
                hit is not None
                and hit.backward is backward
                and hit.check_psd is check_psd
                and hit.fallback is fallback
                and hit.polish is polish
            ):
                return hit
        options = cls(
            backward=backward, solver=solver, eps_abs=eps_abs, eps_rel=eps_rel,
            on_failure=on_failure, max_workers=max_workers, solver_options=solver_options,
            check_psd=check_psd, executor=executor, fallback=fallback, polish=polish,
            infeasible=infeasible,
        )  # fmt: skip
        if solver_options is None and executor is None and check_psd is True:
            try:
                if len(_CACHE) >= _CACHE_SIZE:
                    _CACHE.clear()
                _CACHE[key] = options
            except TypeError:
                pass
        return options

    @classmethod
    def keyword_signature(cls, *, self_parameter: bool = False) -> inspect.Signature:
        """The options as keyword-only parameters with their defaults (``QPLayer.__init__``'s
        signature; ``self_parameter``: with a leading ``self``)."""
        params = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                              annotation=f.type)
            for f in fields(cls)
        ]  # fmt: skip
        if self_parameter:
            params.insert(0, inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD))
        return inspect.Signature(params)

    @classmethod
    def with_options(cls, fn: Any) -> inspect.Signature:
        """``fn``'s signature with its ``**options`` replaced by the options as keyword-only
        parameters (``CvxpyQPLayer.__init__``'s: its own arguments, then these)."""
        own = [
            p for p in inspect.signature(fn).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]  # fmt: skip
        return inspect.Signature([*own, *cls.keyword_signature().parameters.values()])

    @classmethod
    def from_keywords(cls, options: dict[str, Any], *, where: str) -> QPOptions:
        """The checked options of ``where`` (a class taking ``**options``): ``TypeError``
        naming the keywords that are not options, else :meth:`check`'s errors."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise TypeError(
                f"{where}: unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                f"the options are those of dxopt.qp.solve: {', '.join(cls.names())}. Check "
                "the spelling."
            )
        return cls(**options)

    def as_keywords(self) -> dict[str, Any]:
        """The options as the keyword arguments of :func:`dxopt.qp.solve`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def check(self) -> None:
        """Raise the error for the first option that is not one :func:`dxopt.qp.solve` takes:
        ``solver`` a name (a typo used to fall through the fallback chain to another backend
        without a word), the flags booleans (``check_psd="no"`` is truthy), the tolerances
        finite and non-negative, ``solver_options`` a dict, ``backward`` a name or a method,
        ``executor`` an object with a ``solve`` method."""
        on_failure = self.on_failure
        check_on_failure(on_failure, ("raise", "nan", "warn", "ignore"))
        solver = self.solver
        if solver != "auto" and solver not in solver_names():
            import qpsolvers

            known = ("auto", "torch", COMPILED_SOLVER, *sorted(qpsolvers.available_solvers))
            names = ", ".join(repr(n) for n in known)
            if not isinstance(solver, str):
                raise TypeError(
                    f"solver: expected a str, one of {names}; got {type(solver).__name__}."
                )
            raise ValueError(
                f"solver: expected one of {names} (dxopt's solvers, then the installed "
                f"qpsolvers backends); got {solver!r}. Check the spelling, or install the "
                f"backend (e.g. pip install 'qpsolvers[{solver}]')."
            )
        for flag_name in ("check_psd", "fallback", "polish"):
            flag = getattr(self, flag_name)
            if not isinstance(flag, bool):
                raise TypeError(
                    f"{flag_name}: expected True or False, got {flag!r} ({type(flag).__name__})."
                )
        if self.solver_options is not None and not isinstance(self.solver_options, dict):
            raise TypeError(
                f"solver_options: expected a dict of the backend's settings (e.g. "
                f"{{'max_iter': 200}}) or None, got {type(self.solver_options).__name__}."
            )
        backward = self.backward
        if not (
            (isinstance(backward, str) and backward in _BACKWARD_NAMES)
            or (not isinstance(backward, str) and isinstance(backward, BackwardMethod))
        ):
            raise ValueError(
                f"backward: expected 'penalty', 'kkt' or a backward method (an object with a "
                f"`name` and a `solve_adjoint(data, diagnostics)` method, e.g. "
                f"PenaltyBackward(), KKTBackward(), Smoothed(mu=1e-3) or a subclass of "
                f"dxopt.qp.BackwardBase), "
                f"got {backward!r}."
            )
        for tol_name in ("eps_abs", "eps_rel"):
            tol = getattr(self, tol_name)
            if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
                raise ValueError(
                    f"{tol_name}: expected a finite float >= 0, got {tol!r}. Use e.g. "
                    "eps_abs=1e-9, eps_rel=0.0."
                )
        if self.infeasible not in INFEASIBLE_MODES:
            raise ValueError(
                f"infeasible: expected 'fail' (a certified-infeasible sample is a failure, "
                f"handled by on_failure) or 'relax' (solve the closest feasible problem "
                f"instead), got {self.infeasible!r}."
            )
        workers = self.max_workers
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ValueError(f"max_workers: expected a positive int or None, got {workers!r}.")
        executor = self.executor
        if executor is not None and not callable(getattr(executor, "solve", None)):
            raise TypeError(
                f"executor: expected None or an executor such as "
                f"dxopt.distributed.RayExecutor, got {type(executor).__name__}."
            )


_CACHE: dict[tuple[Any, ...], QPOptions] = {}
