"""The attempts of the fallback chain as values: :class:`Attempt` (a backend, the stopping
tolerance passed to it, the options it gets and what it accepts) and :func:`fallback_chain`
(the documented list for a problem and a requested backend). They are run by
:class:`dxopt.qp.solvers.chain.FallbackChain`; why the chain is what it is: the module
docstring there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.solvers.backends import fallback_backends
from dxopt.qp.solvers.routing import DENSE_FALLBACK_MAX_N, available_backends

__all__ = ["Attempt", "fallback_chain"]


@dataclass(frozen=True)
class Attempt:
    """One step of the fallback chain.

    ``solver``: the backend; ``eps_abs``: the stopping tolerance passed to it (the certificate
    is always the requested one); ``options``: the user's ``solver_options`` (the first attempt
    only: other backends name their settings differently); ``loose``: a stop looser than
    requested, whose point is always polished and which is skipped for a sample whose strict
    point from the same backend certified already (by its duality gap only); ``final``: the
    last attempt, which accepts a point certified by its duality gap only (an unsettled active
    set) where earlier attempts keep such a point as a candidate and look further."""

    solver: str
    eps_abs: float
    options: Mapping[str, Any] | None = field(default=None, compare=False)
    loose: bool = False
    final: bool = False

    def label(self) -> str:
        return f"{self.solver} (eps_abs {self.eps_abs:.0e})"


def fallback_chain(
    problem: QPProblem,
    solver: str,
    eps_abs: float,
    options: Mapping[str, Any] | None = None,
    *,
    fallback: bool = True,
) -> tuple[Attempt, ...]:
    """The documented fallback chain for ``solver`` at ``eps_abs`` (:mod:`dxopt.qp.solvers.chain`).

    1. the requested backend at the requested tolerance, with the user's ``options``;
    2. the other backends that suit the problem, in the order of their ``fallback`` positions
       in :data:`dxopt.qp.solvers.backends.BACKENDS`: ``piqp`` and ``clarabel`` (interior
       point, robust on badly scaled data), and ``daqp`` (an exact working set, which settles
       the degenerate LP-like problems where an interior point's active set is ambiguous); a
       dense-only backend when the problem is dense or has at most ``DENSE_FALLBACK_MAX_N``
       variables (it is densified);
    3. the requested backend at a looser stopping tolerance ``max(1e3 eps_abs, 1e-7)``: the
       polish then restores the requested accuracy, and the certificate is still checked at
       the requested tolerance.

    ``fallback=False``: the first attempt alone."""
    if not fallback:
        return (Attempt(solver, eps_abs, options, final=True),)
    steps: list[tuple[str, float, bool]] = [(solver, eps_abs, False)]
    dense_ok = not problem.any_sparse or problem.n <= DENSE_FALLBACK_MAX_N
    installed = available_backends()
    steps += [
        (b.name, eps_abs, False)
        for b in fallback_backends()
        if b.name != solver and b.name in installed and (dense_ok or not b.dense_only)
    ]
    loose = max(1e3 * eps_abs, 1e-7)
    if loose > eps_abs and solver != "torch":  # torch: a batch solve, first attempt only
        steps.append((solver, loose, True))
    last = len(steps) - 1
    return tuple(
        Attempt(s, eps, options if k == 0 else None, loose=is_loose, final=k == last)
        for k, (s, eps, is_loose) in enumerate(steps)
    )
