"""An exact judge of a Maros-Meszaros gradient: the KKT derivative on a *verified* active set.

Independent of dxopt (numpy, scipy.sparse and :mod:`qpsolvers` only). For the QP
:math:`\\min \\tfrac12 x^\\top P x + q^\\top x` s.t. :math:`Gx \\le h`, :math:`Ax = b` and the
loss :math:`L = w^\\top x^\\star` with the weights and directions of the finite-difference judge
(:func:`benchmarks.qp.mm_problems.loss_weights`, :func:`~benchmarks.qp.mm_problems.directions`):

1. **Guess** the active set :math:`J` from a reference point: dxopt's certified ``x`` (rows
   with relative slack below ``1e-8``) and, if that guess fails, tight piqp and clarabel
   solves (row :math:`i` active when its scaled multiplier exceeds its scaled slack). A pair
   of opposite rows fixing one value (:func:`~benchmarks.qp.mm_problems.fixed_pairs`) is one
   equality row; all-zero rows are never perturbed by the directions and are left out.
2. **Verify** it: solve the equality-constrained KKT system
   :math:`K_J [x; \\lambda] = [-q; h_J; b]`, :math:`K_J = [[P, C^\\top], [C, 0]]`,
   :math:`C = [G_J; A]`, and bound the error of the solution by
   :math:`\\|K_J^{-1}\\|_2 (\\|r\\|_2 + \\text{round-off})` with :math:`\\|K_J^{-1}\\|_2`
   estimated by inverse power iteration. :math:`J` is verified when, with the safety factor
   :data:`MARGIN` on that bound, every active single row has :math:`\\lambda_i > 0` and every
   other row has slack :math:`h_i - G_i x > 0`, and :math:`K_J` is nonsingular
   (:math:`\\|K_J\\|\\,\\|K_J^{-1}\\| <` :data:`MAX_COND`). Then :math:`(x, \\lambda)` is the
   exact KKT point with strict complementarity, :math:`K_J` nonsingular is LICQ plus
   second-order sufficiency (:math:`P` positive definite on :math:`\\ker C`), so the solution
   map is smooth near the data and its derivative is the linear solve below (Fiacco,
   *Introduction to Sensitivity and Stability Analysis in Nonlinear Programming*, 1983,
   Thm. 3.2.2). A row that fits neither side by the margin is *ambiguous*: no verdict.
3. **Differentiate**: :math:`K_J [u; v] = [w; 0]`, so along a direction
   :math:`(\\delta q, \\delta h, \\delta b)` the derivative of :math:`L` is
   :math:`-u^\\top \\delta q + v^\\top [\\delta h_J; \\delta b]` (OptNet, arXiv 1703.00443),
   with the error bound
   :math:`\\|K_J^{-1}\\|_2 \\|r_{adj}\\|_2 \\|[\\delta q; \\delta h_J; \\delta b]\\|_2`.
4. **Compare** with dxopt's claim :math:`g^\\top d`: ``wrong`` if the difference exceeds
   :data:`RTOL` times the scale plus the bound in some direction, ``match`` if it is within
   that tolerance minus the bound in every direction, else ``no verdict`` (the reference is not
   accurate enough to tell).

The derivative depends only on :math:`J` and the data, not on the accuracy of the reference
point: the point only proposes :math:`J`, the verification decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from benchmarks.qp import mm_problems as mmp

MATCH, WRONG, NO_VERDICT = "match", "wrong", "no verdict"
RTOL = 1e-3  # relative directional-derivative error that counts as wrong (as the FD reference)
MARGIN = 10.0  # safety factor on every error bound (norm estimate from below, round-off)
MAX_COND = 1e13  # ||K|| ||K^-1|| above this: K counts as singular (LICQ or SOSC fails)
SLACK_GUESS = 1e-8  # relative slack below which a row of an x-only reference is active
POWER_STEPS = 25  # inverse power iterations of the ||K^-1|| estimate
REFINE_STEPS = 30
DELTAS = (1e-10, 1e-14)  # relative shifts of the quasi-definite factorisation, tried in turn
EPS = float(np.finfo(np.float64).eps)

#: tight reference solves (qpsolvers name and settings), tried in order after dxopt's point
REFERENCE_SOLVERS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("piqp", {"eps_abs": 1e-11, "eps_rel": 0.0, "max_iter": 500}),
    ("clarabel", {"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11, "tol_feas": 1e-11,
                  "tol_ktratio": 1e-9, "max_iter": 500}),
)  # fmt: skip


@dataclass(frozen=True)
class KKTVerdict:
    """The exact judge's verdict on one problem.

    ``verdict``: ``"match"``, ``"wrong"`` or ``"no verdict"``; ``why``: the reason of a no
    verdict (every failed guess, ``"; "``-joined); ``source``: the reference point whose
    active set was verified; ``n_active``/``n_pairs``: active single rows and fixed pairs;
    ``inv_norm``: the estimate of :math:`\\|K_J^{-1}\\|_2`; ``multiplier_margin`` and
    ``slack_margin``: the least active multiplier and the least inactive slack over their error
    bounds (verified means both above :data:`MARGIN`); per direction ``reference``,
    ``claimed``, ``bound`` (of the reference's error) and ``rel_error``."""

    verdict: str
    why: str = ""
    source: str = ""
    n_active: int = 0
    n_pairs: int = 0
    inv_norm: float = math.nan
    multiplier_margin: float = math.nan
    slack_margin: float = math.nan
    reference: tuple[float, ...] = field(default_factory=tuple)
    claimed: tuple[float, ...] = field(default_factory=tuple)
    bound: tuple[float, ...] = field(default_factory=tuple)
    rel_error: tuple[float, ...] = field(default_factory=tuple)


# ------------------------------------------------------------------------------ linear algebra


class KKTSolver:
    """Solves with :math:`K` through a factorisation of the quasi-definite
    :math:`K_\\delta = K + \\mathrm{diag}(\\delta I_n, -\\delta I_k)` (nonsingular for every
    :math:`\\delta > 0` when :math:`P \\succeq 0`: Vanderbei, SIAM J. Optim. 5(1), 1995; SuperLU
    is never given a possibly singular matrix) and iterative refinement against :math:`K`
    itself, so the residuals are those of the exact system."""

    def __init__(self, K: sp.spmatrix, n: int, relative_delta: float = 1e-10) -> None:
        self.K = sp.csc_matrix(K)
        self.absK = abs(self.K)
        N = self.K.shape[0]
        self.norm_inf = float(abs(self.K).sum(axis=1).max()) if self.K.nnz else 0.0
        delta = relative_delta * max(self.norm_inf, 1e-300)
        shift = np.concatenate([np.full(n, delta), np.full(N - n, -delta)])
        self.lu = spla.splu(sp.csc_matrix(self.K + sp.diags(shift)))

    def solve(self, rhs: np.ndarray) -> tuple[np.ndarray, float]:
        """``(z, |r|_2)``: the refined solution and its residual ``|rhs - K z|_2``, plus the
        round-off level of computing that residual (``4 eps (|K||z| + |rhs|)``)."""
        z = self.lu.solve(rhs)
        best, best_norm = z, math.inf
        for _ in range(REFINE_STEPS):
            r = rhs - self.K @ z
            norm = float(np.linalg.norm(r))
            if not math.isfinite(norm):
                break
            stalled = norm > 0.5 * best_norm  # refinement no longer contracts
            if norm < best_norm:
                best, best_norm = z, norm
            if stalled or norm == 0.0:
                break
            z = z + self.lu.solve(r)
        floor = 4 * EPS * float(np.linalg.norm(self.absK @ np.abs(best) + np.abs(rhs)))
        return best, best_norm + floor

    def inverse_norm(self, seed: int = 0) -> tuple[float, bool]:
        """``(estimate, converged)``: :math:`\\|K^{-1}\\|_2` estimated from below by inverse
        power iteration on the symmetric :math:`K`; ``converged`` is ``False`` when a solve's
        residual stays above ``1e-3`` (``|v| = 1``: the refinement does not contract, ``K`` is
        singular in double precision), and the estimate is then a lower bound only."""
        v = np.random.default_rng(seed).standard_normal(self.K.shape[0])
        v /= np.linalg.norm(v)
        est = 0.0
        for _ in range(POWER_STEPS):
            u, res = self.solve(v)
            norm = float(np.linalg.norm(u))
            if not math.isfinite(norm) or norm == 0.0:
                return math.inf, False
            est = max(est, norm)
            if res > 1e-3:
                return est, False
            v = u / norm
        return est, True


def kkt_matrix(P: sp.spmatrix, C: sp.spmatrix | None) -> sp.csc_matrix:
    """:math:`[[P, C^\\top], [C, 0]]`."""
    if C is None or C.shape[0] == 0:
        return sp.csc_matrix(P)
    k = C.shape[0]
    return sp.bmat([[P, C.T], [C, sp.csc_matrix((k, k))]], format="csc")


# -------------------------------------------------------------------------------- the active set


@dataclass(frozen=True)
class Rows:
    """The row structure of ``G``: the kept row of each fixed pair, its partner, the free
    (single) rows, the all-zero rows."""

    partner: np.ndarray
    kept: np.ndarray  # bool: the kept row of a fixed pair (an equality row)
    single: np.ndarray  # bool: a row that is neither part of a pair nor all-zero

    @staticmethod
    def of(prob: mmp.MMProblem) -> Rows:
        m = prob.m
        if prob.G is None or prob.h is None:
            empty = np.zeros(0, dtype=bool)
            return Rows(np.zeros(0, dtype=np.int64), empty, empty)
        partner = mmp.fixed_pairs(prob.G, prob.h)
        paired = partner >= 0
        kept = paired & (np.arange(m) < partner)
        zero = np.diff(sp.csr_matrix(prob.G).indptr) == 0
        return Rows(partner, kept, ~paired & ~zero)


def guesses(
    prob: mmp.MMProblem, rows: Rows, x_dxopt: np.ndarray | None, solvers: Sequence[str]
) -> Iterator[tuple[str, np.ndarray]]:
    """``(source, active single rows as a bool mask)`` from each reference point in turn."""
    if prob.G is None or prob.h is None:
        yield "no inequalities", np.zeros(0, dtype=bool)
        return
    scale = 1.0 + np.abs(prob.h)
    if x_dxopt is not None:
        slack = (prob.h - prob.G @ x_dxopt) / scale
        yield "dxopt x (slack)", rows.single & (slack <= SLACK_GUESS)
    import qpsolvers

    problem = mmp._qp(prob)
    for name, opts in REFERENCE_SOLVERS:
        if name not in solvers or name not in qpsolvers.available_solvers:
            continue
        try:
            sol = qpsolvers.solve_problem(problem, solver=name, **opts)
        except Exception:  # a backend crash is a missing reference
            continue
        if not sol.found or sol.x is None or sol.z is None or not np.isfinite(sol.x).all():
            continue
        z = np.maximum(np.asarray(sol.z, dtype=np.float64), 0.0)
        slack = np.maximum(prob.h - prob.G @ sol.x, 0.0) / scale
        zs = z / max(1.0, float(z.max(initial=0.0)))
        yield f"{name} (tight)", rows.single & (zs > slack)


@dataclass(frozen=True)
class Verified:
    """A verified active set: its KKT solver, :math:`C`, the active row indices (single rows
    and kept rows of pairs, in the order of :math:`C`), the margins and the norm estimate."""

    solver: KKTSolver
    C: sp.csc_matrix | None
    rows: np.ndarray
    inv_norm: float
    multiplier_margin: float
    slack_margin: float


def verify(prob: mmp.MMProblem, rows: Rows, active: np.ndarray) -> tuple[Verified | None, str]:
    """The test of one guessed active set (module docstring, step 2); ``(None, why)`` if it
    fails."""
    n = prob.n
    idx = np.zeros(0, dtype=np.int64)
    blocks: list[sp.spmatrix] = []
    rhs = [-prob.q]
    if prob.G is not None and prob.h is not None:
        idx = np.nonzero(active | rows.kept)[0]
        if idx.size:
            blocks.append(sp.csr_matrix(prob.G)[idx])
            rhs.append(prob.h[idx])
    if prob.A is not None and prob.b is not None:
        blocks.append(prob.A)
        rhs.append(prob.b)
    C = sp.vstack(blocks, format="csc") if blocks else None
    Kmat = kkt_matrix(prob.P, C)
    for delta in DELTAS:  # a smaller shift where the refinement does not contract
        try:
            solver = KKTSolver(Kmat, n, relative_delta=delta)
        except (RuntimeError, MemoryError) as exc:
            return None, f"KKT factorisation failed ({type(exc).__name__})"
        inv, converged = solver.inverse_norm()
        if converged:
            break
    cond = inv * max(solver.norm_inf, 1e-300)
    if not converged or not math.isfinite(cond) or cond > MAX_COND:
        at_least = "" if converged else ">= "
        return None, (
            f"KKT matrix singular in double precision (cond estimate {at_least}{cond:.2g}, "
            f"{idx.size} active rows: LICQ or SOSC fails numerically)"
        )
    sol, res = solver.solve(np.concatenate(rhs))
    err = MARGIN * inv * res  # bound on |sol - exact|_2, with the safety factor
    x = sol[:n]
    mult_margin = slack_margin = math.inf
    if prob.G is not None and prob.h is not None:
        lam = sol[n : n + idx.size]
        single_active = active[idx]
        if single_active.any():
            worst = float(lam[single_active].min())
            mult_margin = worst / max(err, 1e-300)
            if worst <= err:
                count = int((lam[single_active] <= err).sum())
                return None, (
                    f"{count} active rows with multiplier within its error bound ({err:.2g}) "
                    f"or negative (least {worst:.2g}): ambiguous or wrong guess"
                )
        inactive = rows.single & ~active
        if inactive.any():
            Gi = sp.csr_matrix(prob.G)[np.nonzero(inactive)[0]]
            slack = prob.h[inactive] - Gi @ x
            row_norm = np.sqrt(np.asarray(Gi.multiply(Gi).sum(axis=1)).ravel())
            bound = err * row_norm + 4 * EPS * (np.abs(prob.h[inactive]) + abs(Gi) @ np.abs(x))
            bad = slack <= MARGIN * bound
            slack_margin = float(np.min(slack / np.maximum(MARGIN * bound, 1e-300)))
            if bad.any():
                worst = float(slack[bad].min())
                return None, (
                    f"{int(bad.sum())} inactive rows with slack within its error bound or "
                    f"violated (least {worst:.2g}): ambiguous or wrong guess"
                )
    return Verified(solver, C, idx, inv, mult_margin, slack_margin), ""


# ------------------------------------------------------------------------------------ the judge


def reference_derivatives(
    prob: mmp.MMProblem, ver: Verified, w: np.ndarray, dirs: list[dict[str, Any]]
) -> tuple[list[float], list[float]]:
    """The exact directional derivatives of ``w . x*`` along ``dirs`` on the verified set and
    their error bounds (module docstring, step 3)."""
    n = prob.n
    k = 0 if ver.C is None else ver.C.shape[0]
    sol, res = ver.solver.solve(np.concatenate([w, np.zeros(k)]))
    err = MARGIN * ver.inv_norm * res
    u, v = sol[:n], sol[n:]
    refs, bounds = [], []
    for d in dirs:
        parts = [np.zeros(n) if d.get("q") is None else -np.asarray(d["q"])]
        if ver.rows.size:
            parts.append(np.zeros(ver.rows.size) if d.get("h") is None else d["h"][ver.rows])
        if prob.A is not None:
            parts.append(np.zeros(prob.p) if d.get("b") is None else np.asarray(d["b"]))
        vec = np.concatenate(parts)
        refs.append(float(np.concatenate([u, v]) @ vec))
        bounds.append(err * float(np.linalg.norm(vec)) + 4 * EPS * float(np.abs(sol) @ np.abs(vec)))
    return refs, bounds


def claimed(grads: dict[str, np.ndarray], d: dict[str, Any]) -> float:
    """dxopt's directional derivative ``g . d``."""
    return sum(
        float(np.asarray(grads[key]) @ d[key])
        for key in ("q", "h", "b")
        if d.get(key) is not None and key in grads
    )


def compare(
    refs: Sequence[float], bounds: Sequence[float], claims: Sequence[float], floor: float
) -> tuple[str, list[float], str]:
    """``(verdict, relative errors, why)`` of the claims against the references (step 4)."""
    rels, verdict, why = [], MATCH, ""
    for r, b, c in zip(refs, bounds, claims):
        scale = max(abs(r), abs(c), floor)
        gap = abs(c - r)
        rels.append(gap / scale)
        if gap - b > RTOL * scale:
            verdict = WRONG
        elif gap + b > RTOL * scale and verdict == MATCH:
            verdict, why = NO_VERDICT, f"reference error bound {b:.2g} too large for {scale:.2g}"
    return verdict, rels, why if verdict == NO_VERDICT else ""


def judge(
    prob: mmp.MMProblem,
    seed: int,
    grads: dict[str, np.ndarray],
    x_dxopt: np.ndarray | None = None,
    *,
    solvers: Sequence[str] = ("piqp", "clarabel"),
) -> KKTVerdict:
    """The exact judge of dxopt's gradient ``grads`` (keys ``q``, ``h``, ``b``) of
    ``L = w . x*`` (module docstring). ``x_dxopt``: dxopt's solution, the first reference
    point; ``solvers``: the tight reference solves tried after it."""
    rows = Rows.of(prob)
    w = mmp.loss_weights(prob, seed)
    dirs = mmp.directions(prob, seed)
    whys: list[str] = []
    seen: set[bytes] = set()
    for source, active in guesses(prob, rows, x_dxopt, solvers):
        key = np.packbits(active).tobytes()
        if key in seen:
            continue
        seen.add(key)
        ver, why = verify(prob, rows, active)
        if ver is None:
            whys.append(f"{source}: {why}")
            continue
        refs, bounds = reference_derivatives(prob, ver, w, dirs)
        claims = [claimed(grads, d) for d in dirs]
        x_scale = 1.0 if x_dxopt is None else max(1.0, float(np.abs(x_dxopt).max(initial=0.0)))
        floor = max(1e-8 * max(map(abs, refs), default=0.0),
                    1e-10 * float(np.abs(w).sum()) * x_scale)  # fmt: skip
        verdict, rels, why = compare(refs, bounds, claims, floor)
        return KKTVerdict(
            verdict, why, source, int(active.sum()), int(rows.kept.sum()), ver.inv_norm,
            ver.multiplier_margin, ver.slack_margin, tuple(refs), tuple(claims), tuple(bounds),
            tuple(rels),
        )  # fmt: skip
    return KKTVerdict(NO_VERDICT, "; ".join(whys) or "no reference point")


# ------------------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> None:
    """Judge the saved dxopt results of a run (``--cache DIR --label L``: the
    ``DIR/L/dxopt-NAME.pkl`` files of :mod:`benchmarks.qp.maros_meszaros`), each problem in an
    isolated process with a time limit; writes one JSON record per problem to ``--out``."""
    import argparse
    import json
    import pickle
    import time
    from pathlib import Path

    from benchmarks.qp.maros_meszaros import isolated

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--label", action="append", required=True, help="repeatable")
    parser.add_argument("--problems", default="", help="comma-separated (default: all saved)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    wanted = {p.strip() for p in args.problems.split(",") if p.strip()}
    records = json.loads(args.out.read_text()) if args.out.exists() else {}
    for label in args.label:
        for path in sorted((args.cache / label).glob("dxopt-*.pkl")):
            name = path.stem[len("dxopt-") :]
            if wanted and name not in wanted:
                continue
            with open(path, "rb") as fh:
                dx = pickle.load(fh)
            key = f"{label}/{name}"
            if dx.get("grads") is None:
                records[key] = {"verdict": "-", "why": f"no gradient ({dx.get('status')})"}
            else:
                t0 = time.perf_counter()
                res, _ = isolated("kkt", name, args.seed, 0.0, args.timeout,
                                     extra=(dx["grads"], dx.get("x")))  # fmt: skip
                if "verdict" not in res:
                    res = {"verdict": NO_VERDICT, "why": str(res.get("status", res))[:300]}
                res["judge_s"] = round(time.perf_counter() - t0, 2)
                records[key] = res
            print(f"{key}: {records[key]['verdict']} {records[key].get('why', '')[:150]}",
                  flush=True)  # fmt: skip
            args.out.write_text(json.dumps(records, indent=1, default=float))


if __name__ == "__main__":
    main()
