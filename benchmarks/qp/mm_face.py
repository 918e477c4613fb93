"""A judge of refusals: is ``x*`` unique, and is the loss constant on the optimal set?

Independent of dxopt (numpy, scipy's HiGHS and :mod:`qpsolvers` only). A refused gradient
is right when no derivative exists. For the convex QP
:math:`\\min \\tfrac12 x^\\top P x + q^\\top x` s.t. :math:`Gx \\le h`, :math:`Ax = b`
(:math:`P \\succeq 0`) every solution :math:`x'` shares :math:`Px' = Px^\\star` and
:math:`q^\\top x' = q^\\top x^\\star` (the objective is constant on the segment between two
solutions, so :math:`(x' - x^\\star)^\\top P (x' - x^\\star) = 0`, hence
:math:`P(x' - x^\\star) = 0`; Mangasarian, "A simple characterization of solution sets of
convex programs", Oper. Res. Lett. 7, 1988), so the optimal set is the polyhedron

.. math:: S = \\{x : Gx \\le h,\\ Ax = b,\\ Px = Px^\\star,\\ q^\\top x = q^\\top x^\\star\\}.

Two linear programs over :math:`S` (relaxed by a tolerance :math:`\\tau`, rows scaled by their
own size) give the range :math:`[\\min_S w^\\top x, \\max_S w^\\top x]` of the benchmark's loss
:math:`L = w^\\top x` (:func:`benchmarks.qp.mm_problems.loss_weights`). The verdicts:

- ``not unique (verified)``: at both tolerances :data:`TAUS` both end points are optimal QP
  points on their own (relative primal residual and objective gap at most the benchmark's
  acceptance tolerance) and the loss differs between them by at least :data:`MIN_RANGE`
  (relative to :math:`\\Vert w\\Vert \\max(\\Vert x^\\star\\Vert, 1)`), not shrinking with
  :math:`\\tau` (at most a factor :data:`SHRINK`): the loss is
  not a function of the data at this point (its value depends on which solution a solver
  returns), so no derivative exists and a refusal is right;
- ``unique``: the range at the tighter tolerance is below :data:`UNIQUE_RANGE` (the loss is
  a function of the data here; a refusal is then not explained by non-uniqueness, though a
  kink may still leave no derivative);
- ``no verdict``: anything else (the range moves with :math:`\\tau`, an LP fails, or an end
  point is not optimal to the tolerance: the relaxation, not the problem, made the range).

Run ``python -m benchmarks.qp.mm_face --results FILE.json`` (the refused problems of a
:mod:`benchmarks.qp.maros_meszaros` run) or ``--problems A,B``; writes JSON and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from benchmarks.qp import mm_problems as mmp

TAUS = (1e-7, 1e-9)
"""The relaxations of :math:`S` (relative to each row's scale)."""
MIN_RANGE = 1e-5
"""Smallest relative loss range called a non-unique loss: 100 times :data:`UNIQUE_RANGE` (a
range the relaxation made shrinks with it, which the :data:`SHRINK` test catches)."""
UNIQUE_RANGE = 1e-7
"""Largest relative loss range (at the tighter tolerance) called unique."""
SHRINK = 4.0
"""Largest factor by which the range may shrink between the two tolerances."""
ACCEPT_TOL = 1e-6
"""An end point's relative primal residual and objective gap limit (the benchmark's)."""

BOX = 10.0
"""The LPs run in the box :math:`|x - x^\\star|_\\infty \\le` this times
:math:`\\max(|x^\\star|_\\infty, 1)` (an unbounded optimal set has end points on it)."""
HIGHS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
"""HiGHS's tolerances, below the tightest relaxation."""

NOT_UNIQUE, UNIQUE, NO_VERDICT = "not unique (verified)", "unique", "no verdict"


@dataclass(frozen=True)
class FaceVerdict:
    """One problem's verdict; ``ranges`` the relative loss range per tolerance, ``gaps`` and
    ``primal`` the worst end point's relative objective gap and primal residual."""

    name: str
    verdict: str
    why: str
    loss: float = math.nan
    ranges: tuple[float, ...] = ()
    gaps: tuple[float, ...] = ()
    primal: tuple[float, ...] = ()


def reference_point(prob: mmp.MMProblem) -> np.ndarray | None:
    """A tight solution (clarabel, then piqp, at 1e-11 and then 1e-9), ``None`` if none is
    accepted."""
    import qpsolvers

    problem = mmp._qp(prob)
    for tol in (1e-11, 1e-9):
        options = {
            "clarabel": {"tol_gap_abs": tol, "tol_gap_rel": tol, "tol_feas": tol},
            "piqp": {"eps_abs": tol, "eps_rel": 0.0},
        }
        for solver, opts in options.items():
            if solver not in qpsolvers.available_solvers:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # qpsolvers' "AlmostSolved": judged below
                sol = qpsolvers.solve_problem(problem, solver=solver, **opts)
            if sol.found and sol.x is not None and np.isfinite(sol.x).all():
                res = mmp.residuals(prob, np.asarray(sol.x), sol.y, sol.z)
                if mmp.accepted(res, ACCEPT_TOL):
                    return np.asarray(sol.x, dtype=np.float64)
    return None


def _objective(prob: mmp.MMProblem, x: np.ndarray) -> float:
    return float(0.5 * x @ (prob.P @ x) + prob.q @ x)


def _primal(prob: mmp.MMProblem, x: np.ndarray) -> float:
    return mmp.residuals(prob, x, None, None)["primal"]


def _face_lp(
    prob: mmp.MMProblem, x_star: np.ndarray, tau: float
) -> tuple[sp.csr_matrix, np.ndarray]:
    """``(A_ub, b_ub)`` of :math:`S` relaxed by ``tau`` times each row's scale, and at least
    by ``x_star``'s own residual in that row (so ``x_star`` lies in it: the LPs are feasible)."""
    ub_rows: list[sp.spmatrix] = []
    ub_rhs: list[np.ndarray] = []

    def two_sided(M: sp.spmatrix, target: np.ndarray) -> None:
        slack = np.maximum(tau * np.maximum(np.abs(target), 1.0), np.abs(M @ x_star - target))
        ub_rows.extend([M, -M])
        ub_rhs.extend([target + slack, -target + slack])

    if prob.G is not None and prob.h is not None:
        slack = np.maximum(tau * np.maximum(np.abs(prob.h), 1.0), prob.G @ x_star - prob.h)
        ub_rows.append(prob.G)
        ub_rhs.append(prob.h + slack)
    if prob.A is not None and prob.b is not None:
        two_sided(sp.csr_matrix(prob.A), prob.b)
    P = sp.csr_matrix(prob.P)
    rows = np.flatnonzero(np.diff(P.indptr))  # the rows of P with entries
    if rows.size:
        Pr = P[rows]
        two_sided(Pr, Pr @ x_star)
    two_sided(sp.csr_matrix(prob.q[None, :]), np.array([prob.q @ x_star]))
    return sp.csr_matrix(sp.vstack(ub_rows)), np.concatenate(ub_rhs)


def loss_range(
    prob: mmp.MMProblem, x_star: np.ndarray, w: np.ndarray, tau: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """The end points ``(argmin, argmax)`` of ``w . x`` over :math:`S` relaxed by ``tau``
    (``None`` if an LP fails)."""
    A_ub, b_ub = _face_lp(prob, x_star, tau)
    radius = BOX * max(float(np.abs(x_star).max(initial=0.0)), 1.0)
    box = list(zip(x_star - radius, x_star + radius, strict=True))
    ends = []
    for sign in (1.0, -1.0):
        for options in (HIGHS, {}):  # HiGHS's defaults where the tight tolerances stall
            res = linprog(sign * w, A_ub=A_ub, b_ub=b_ub, bounds=box, method="highs",
                          options=options)  # fmt: skip
            if res.status == 0 and res.x is not None:
                break
        else:
            return None
        ends.append(np.asarray(res.x))
    return ends[0], ends[1]


def judge_face(prob: mmp.MMProblem, seed: int = 0, x_star: np.ndarray | None = None) -> FaceVerdict:
    """The verdict of the module docstring for ``prob``'s loss (``seed``'s weights)."""
    if x_star is None:
        x_star = reference_point(prob)
    if x_star is None:
        return FaceVerdict(prob.name, NO_VERDICT, "no accepted reference solution")
    w = mmp.loss_weights(prob, seed)
    loss = float(w @ x_star)
    f_star = _objective(prob, x_star)
    norm = float(np.linalg.norm(w)) * max(float(np.linalg.norm(x_star)), 1.0)
    ranges, gaps, prims = [], [], []
    for tau in TAUS:
        ends = loss_range(prob, x_star, w, tau)
        if ends is None:
            why = f"an LP over the optimal set failed (tau={tau:g})"
            return FaceVerdict(prob.name, NO_VERDICT, why, loss, tuple(ranges), tuple(gaps),
                               tuple(prims))  # fmt: skip
        lo, hi = ends
        ranges.append(float(w @ hi - w @ lo) / norm)
        gaps.append(max(abs(_objective(prob, e) - f_star) / max(abs(f_star), 1.0) for e in ends))
        prims.append(max(_primal(prob, e) for e in ends))
    out = (loss, tuple(ranges), tuple(gaps), tuple(prims))
    if ranges[-1] <= UNIQUE_RANGE:
        return FaceVerdict(prob.name, UNIQUE, "the loss is constant on the optimal set", *out)
    optimal = max(gaps) <= ACCEPT_TOL and max(prims) <= ACCEPT_TOL
    steady = ranges[-1] >= ranges[0] / SHRINK
    if optimal and steady and min(ranges) >= MIN_RANGE:
        return FaceVerdict(prob.name, NOT_UNIQUE, "two optimal points with different losses", *out)
    if not optimal:
        why = "an end point is not optimal to the tolerance"
    elif not steady:
        why = "the range shrinks with the tolerance"
    else:
        why = f"range below {MIN_RANGE:g}"
    return FaceVerdict(prob.name, NO_VERDICT, why, *out)


def refused_names(results: Path) -> list[str]:
    """The problems a :mod:`benchmarks.qp.maros_meszaros` run's dxopt refused (not as
    non-convex: those have no optimal set to judge)."""
    records = json.loads(results.read_text())["records"]
    return [r["problem"] for r in records if r.get("dxopt", {}).get("status") == "refused"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, nargs="*", default=[], help="maros_meszaros JSONs")
    parser.add_argument("--problems", default="", help="comma-separated names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/qp/results/mm_face"))
    args = parser.parse_args(argv)
    names = [s for s in args.problems.split(",") if s]
    for results in args.results:
        names += [name for name in refused_names(results) if name not in names]
    verdicts = []
    for name in names:
        verdicts.append(judge_face(mmp.load(name), args.seed))
        print(f"{name}: {verdicts[-1].verdict} ({verdicts[-1].why})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    out = {"seed": args.seed, "taus": TAUS, "verdicts": [asdict(v) for v in verdicts]}
    (args.out / "mm_face.json").write_text(json.dumps(out, indent=2))
    taus = ", ".join(f"{t:g}" for t in TAUS)
    lines = [f"| problem | verdict | loss range (relative; tau = {taus}) | end points' objective "
             "gap | primal residual | why |", "|---|---|---|---|---|---|"]  # fmt: skip
    for v in verdicts:
        fmt = ", ".join(f"{r:.3g}" for r in v.ranges)
        lines.append(f"| {v.name} | {v.verdict} | {fmt} | {max(v.gaps, default=math.nan):.1e} | "
                     f"{max(v.primal, default=math.nan):.1e} | {v.why} |")  # fmt: skip
    counts = {k: sum(v.verdict == k for v in verdicts) for k in (NOT_UNIQUE, UNIQUE, NO_VERDICT)}
    md = "\n".join(lines) + "\n\n" + ", ".join(f"{k}: {c}" for k, c in counts.items()) + "\n"
    (args.out / "mm_face.md").write_text(md)
    print(md)
    return out


if __name__ == "__main__":
    main()
