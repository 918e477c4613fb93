"""Finite-difference evidence of the Maros-Meszaros judge: polished re-solves along the
perturbation lines, the evaluation noise, the exact reduced-KKT reference gradient on a verified
active set, and the piece check of a degenerate gradient.

Independent of dxopt (numpy, scipy and :mod:`qpsolvers` only), so the evidence of a problem is
cached and reused when the same problem is judged against several versions of dxopt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from benchmarks.qp.mm_problems import (
    STEPS,
    MMProblem,
    _qp,
    accepted,
    directions,
    fixed_pairs,
    loss_weights,
    residuals,
)

#: solvers of the finite-difference re-solves, tried in order (tight tolerances)
FD_SOLVERS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("clarabel", {"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11, "tol_feas": 1e-11,
                  "tol_ktratio": 1e-9, "max_iter": 500}),
    ("piqp", {"eps_abs": 1e-11, "eps_rel": 0.0, "max_iter": 500}),
    ("clarabel", {}),  # default tolerances: only where both tight solves fail (then polished)
)  # fmt: skip


def polish(
    prob: MMProblem, x: np.ndarray, z: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None:
    """Exact solution on the active set read off an interior-point solution (OSQP's polish).

    Takes :math:`J = \\{i: z_i > \\tau \\max(1, \\|z\\|_\\infty)\\}` for a few thresholds
    :math:`\\tau` (a pair of :func:`fixed_pairs` enters as one equality row), solves the
    equality-constrained KKT system on ``J`` and the equalities (regularised and refined where
    rows are dependent: :func:`kkt_solve`), and keeps the first result
    that has multipliers :math:`z_J \\ge 0` and relative residuals below ``1e-11`` (so it is
    feasible, stationary and complementary). ``None`` if none does. Interior-point solutions
    are accurate to about the square root of their tolerance on degenerate problems; a
    polished point is exact on its piece, so one-sided differences of polished points are
    exact slopes of the piecewise-affine solution map.
    """
    from benchmarks.qp.generators import QPProblem
    from benchmarks.qp.reference import _kkt_matrix

    qp = QPProblem("maros-meszaros", prob.n, prob.P, prob.q, prob.A, prob.b, prob.G, prob.h)
    zs = np.zeros(prob.m) if z is None else np.maximum(np.asarray(z, dtype=np.float64), 0.0)
    zscale = max(1.0, float(zs.max(initial=0.0)))
    partner = np.full(prob.m, -1) if prob.G is None else fixed_pairs(prob.G, prob.h)
    paired = partner >= 0
    first = paired & (np.arange(prob.m) < partner)  # the kept row of each fixed pair
    seen: set[bytes] = set()
    for tau in (1e-8, 1e-6, 1e-10, 1e-4):
        mask = zs > tau * zscale
        mask[first] |= mask[partner[first]]
        mask[paired & ~first] = False
        active = np.nonzero(mask)[0]
        key = active.tobytes()
        if key in seen:
            continue
        seen.add(key)
        parts = [-prob.q]
        if active.size:
            assert prob.h is not None
            parts.append(prob.h[active])
        if prob.b is not None:
            parts.append(prob.b)
        try:
            sol, _ = kkt_solve(_kkt_matrix(qp, active), np.concatenate(parts), prob.n)
        except Exception:  # singular beyond repair for this J
            continue
        if not np.isfinite(sol).all():
            continue
        xp = sol[: prob.n]
        zp = None
        yp = sol[prob.n + active.size :] if prob.p else None
        if prob.m:
            zp = np.zeros(prob.m)
            zp[active] = sol[prob.n : prob.n + active.size]
            kept = active[first[active]]  # a fixed pair's multiplier has either sign
            zp[partner[kept]] = -np.minimum(zp[kept], 0.0)
            zp[kept] = np.maximum(zp[kept], 0.0)
            if zp.min(initial=0.0) < -1e-9 * max(1.0, float(np.abs(zp).max())):
                continue
        if accepted(residuals(prob, xp, yp, zp), 1e-11):
            return xp, yp, zp
    return None


SINGULAR_CONTRACTION = 0.1  # refinement contraction above which K counts as singular


def kkt_solve(
    K: Any, rhs: np.ndarray, n: int, *, relative_delta: float = 1e-9, check_singular: bool = False
) -> tuple[np.ndarray, bool]:
    """Solve the KKT system ``K z = rhs`` (``K = [[P, C'], [C, 0]]``, ``P`` the leading
    ``n x n`` block), singular or not; returns ``(z, singular)``.

    SuperLU is never given the exact ``K``: on an exactly singular matrix it reads
    uninitialised memory and crashes the process at random (seen on STADAT1/2, AUG3DQP,
    QSHIP08L). It factors the quasi-definite :math:`K_\\delta = K + \\mathrm{diag}(\\delta
    I_n, -\\delta I_k)`, which is nonsingular for every :math:`\\delta > 0` (Vanderbei, SIAM
    J. Optim. 5(1), 1995), with :math:`\\delta` = ``relative_delta`` times the largest entry,
    and refines against the exact ``K`` (:math:`z \\leftarrow z + K_\\delta^{-1}(r - Kz)`;
    on a consistent singular system this converges to a solution). With ``check_singular``,
    ``singular`` is the verdict of a power iteration on the refinement's iteration matrix
    :math:`E = K_\\delta^{-1}\\mathrm{diag}(\\delta I, -\\delta I)`: its spectral radius is 1
    if ``K`` is singular and about :math:`\\delta\\|K^{-1}\\|` otherwise, so ``singular``
    means :math:`\\sigma_{min}(K) \\lesssim 10\\,\\delta`. Without it, ``singular`` is
    ``False`` unless the refinement stalls above ``1e-10``.
    """
    import scipy.sparse.linalg as spla

    N = K.shape[0]
    Ks = sp.csc_matrix(K)
    delta = relative_delta * max(float(abs(Ks).max()) if Ks.nnz else 0.0, 1e-300)
    shift = np.concatenate([np.full(n, delta), np.full(N - n, -delta)])
    lu = spla.splu(sp.csc_matrix(Ks + sp.diags(shift)))
    z = lu.solve(rhs)
    norm = max(1.0, float(np.linalg.norm(rhs)))
    rel = np.inf
    for _ in range(100):
        r = rhs - Ks @ z
        new = float(np.linalg.norm(r)) / norm
        if new <= 1e-13 or new > 0.9 * rel:
            rel = min(rel, new)
            break
        rel = new
        z = z + lu.solve(r)
    singular = rel > 1e-10
    if check_singular and not singular:
        v = np.random.default_rng(0).standard_normal(N)
        v /= np.linalg.norm(v)
        ratio = 0.0
        for _ in range(12):
            v = lu.solve(shift * v)
            ratio = float(np.linalg.norm(v))
            if not np.isfinite(ratio) or ratio == 0.0:
                break
            v /= ratio
        singular = not np.isfinite(ratio) or ratio > SINGULAR_CONTRACTION
    return z, bool(singular)


Solved = tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, str]


def solve_polished(
    prob: MMProblem, *, order: Sequence[int] | None = None, first_accepted: bool = False
) -> Solved:
    """``(x, y, z, solver)`` by the first of :data:`FD_SOLVERS` (in ``order``, indices; default
    all in turn) that succeeds, polished (:func:`polish`; the solver name then ends in
    ``+polish``) where possible; an unpolished solution is kept only if its relative residuals
    are below ``1e-7``, and with ``first_accepted`` the first such one is returned without
    trying the later solvers for a polished one."""
    return _solve_polished(prob, order, first_accepted)[:4]


def _solve_polished(
    prob: MMProblem, order: Sequence[int] | None, first_accepted: bool
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, str, int | None]:
    """:func:`solve_polished` and the index in :data:`FD_SOLVERS` of the solver it used."""
    import qpsolvers

    problem = _qp(prob)
    fallback: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, str, int | None] = (
        None, None, None, "", None,
    )  # fmt: skip
    for i in range(len(FD_SOLVERS)) if order is None else order:
        solver, opts = FD_SOLVERS[i]
        try:
            sol = qpsolvers.solve_problem(problem, solver=solver, **opts)
        except Exception:  # a backend crash is a failed re-solve
            continue
        if sol.found and sol.x is not None and np.isfinite(sol.x).all():
            x = np.asarray(sol.x)
            polished = polish(prob, x, sol.z)
            if polished is not None:
                return (*polished, solver + "+polish", i)
            if fallback[0] is None and accepted(residuals(prob, x, sol.y, sol.z), 1e-7):
                fallback = (x, sol.y, sol.z, solver, i)
                if first_accepted:
                    return fallback
    return fallback


def fd_solve(
    prob: MMProblem,
    d: dict[str, Any] | None,
    t: float,
    *,
    order: Sequence[int] | None = None,
    first_accepted: bool = False,
) -> tuple[np.ndarray | None, str]:
    """``x*(theta + t d)`` and the solver that produced it (:func:`solve_polished`)."""
    x, _, _, solver = solve_polished(
        prob_at(prob, d, t), order=order, first_accepted=first_accepted
    )
    return x, solver


def prob_at(prob: MMProblem, d: dict[str, Any] | None, t: float) -> MMProblem:
    """The problem at ``theta + t d``."""
    if d is None or t == 0.0:
        return prob

    def add(v: np.ndarray | None, dv: np.ndarray | None) -> np.ndarray | None:
        return v if v is None or dv is None else v + t * dv

    q = add(prob.q, d["q"])
    assert q is not None
    return MMProblem(prob.name, prob.P, q, prob.G, add(prob.h, d["h"]), prob.A, add(prob.b, d["b"]))


def solver_noise(prob: MMProblem, w: np.ndarray) -> float:
    """``|w . (x_a - x_b)|`` between the (polished) solutions of the two FD solvers at
    ``theta``: the evaluation error bound of the judge; ``inf`` unless both solve."""
    import qpsolvers

    xs: list[np.ndarray] = []
    for solver, opts in FD_SOLVERS[:2]:
        try:
            sol = qpsolvers.solve_problem(_qp(prob), solver=solver, **opts)
        except Exception:
            continue
        if sol.found and sol.x is not None and np.isfinite(sol.x).all():
            polished = polish(prob, np.asarray(sol.x), sol.z)
            xs.append(np.asarray(sol.x) if polished is None else polished[0])
    return float(abs(w @ (xs[0] - xs[1]))) if len(xs) >= 2 else math.inf


def fd_evidence(
    prob: MMProblem,
    seed: int,
    steps: tuple[float, ...] = STEPS,
    *,
    dirs: list[dict[str, Any]] | None = None,
    reference: bool = True,
) -> dict[str, Any]:
    """Everything the judge needs that does not depend on dxopt: per direction ``f(0)``,
    ``f(+-t)`` for ``L = w . x*``, the noise bound, and the exact reference directional
    derivatives on a verified active set where one exists (:func:`reference_gradient`).
    ``dirs`` replaces :func:`directions` (the piece check of :func:`piece_problem` keeps the
    directions of the original problem); ``reference=False`` skips the reference."""
    t0 = time.perf_counter()
    w = loss_weights(prob, seed)
    noise = solver_noise(prob, w)
    x0, y0, z0, base_solver, base = _solve_polished(prob, None, False)
    out: dict[str, Any] = {"noise": noise, "base_solver": base_solver, "x0": x0, "directions": []}
    if x0 is None:
        out["f0"] = None
    else:
        out["f0"] = float(w @ x0)
        if not math.isfinite(noise):  # one FD solver only: a conservative bound
            out["noise"] = 1e-8 * float(np.abs(w) @ np.maximum(np.abs(x0), 1.0))
    polished = base_solver.endswith("+polish")
    # the re-solves along the lines start with the solver of f(0) (its errors at nearby points
    # are alike); an unpolished f(0) takes that solver's accepted solution at once, without
    # trying the others for a polished one: it is compared with like, and a solver that failed
    # at theta spends its whole iteration budget at every point (QSHELL: piqp, 2 s a point, so
    # the evidence took 4 minutes and timed out under load; 25 s this way)
    order = None if base is None else [base, *(i for i in range(len(FD_SOLVERS)) if i != base)]

    def value(d: dict[str, Any], t: float) -> float | None:
        # a polished f(0) is only compared with polished f(t): an unpolished value carries an
        # error the noise bound (measured between polished points) does not cover
        x, solver = fd_solve(prob, d, t, order=order, first_accepted=not polished)
        if x is None or (polished and not solver.endswith("+polish")):
            return None
        return float(w @ x)

    if dirs is None:
        dirs = directions(prob, seed)
    for d in dirs:
        plus, minus = {}, {}
        if x0 is not None:
            for t in steps:
                plus[t], minus[t] = value(d, t), value(d, -t)
        out["directions"].append({"kind": d["kind"], "plus": plus, "minus": minus})
    if not reference:
        out["reference"] = {"verified": False, "why": "not computed"}
    elif x0 is None or not base_solver.endswith("+polish"):
        out["reference"] = {"verified": False, "why": "no polished solution"}
    else:
        out["reference"] = reference_gradient(prob, w, x0, y0, z0, dirs)
    out["fd_s"] = time.perf_counter() - t0
    return out


def reference_gradient(
    prob: MMProblem,
    w: np.ndarray,
    x: np.ndarray,
    y: np.ndarray | None,
    z: np.ndarray | None,
    dirs: list[dict[str, Any]],
) -> dict[str, Any]:
    """The exact reduced-KKT derivative of ``w . x*`` along each of ``dirs`` at the polished
    solution ``(x, y, z)``, kept only on a *verified* active set, where the solution map is
    smooth along the directions: LICQ holds (the KKT matrix is nonsingular), strict
    complementarity with a margin (active multipliers above ``1e-6 max(1, |z|)``, inactive
    slacks above ``1e-6 (1 + |h_i|)``). A pair of :func:`fixed_pairs` is one equality row
    (the directions move both of its rows together). Adjoint: :math:`K [u; v] = [w; 0]`,
    :math:`\\partial_q L = -u`, :math:`\\partial_{h_J} L = v_J`, :math:`\\partial_b L = v_A`
    (OptNet, arXiv 1703.00443)."""
    from benchmarks.qp.generators import QPProblem
    from benchmarks.qp.reference import _kkt_matrix

    why = []
    active = np.zeros(0, dtype=np.int64)
    if prob.G is not None and prob.h is not None and z is not None:
        partner = fixed_pairs(prob.G, prob.h)
        paired = partner >= 0
        first = paired & (np.arange(prob.m) < partner)
        zscale = max(1.0, float(np.abs(z).max(initial=0.0)))
        strong = z > 1e-6 * zscale
        zero = z == 0.0
        free = ~paired
        act = strong & free
        act[first] = True  # a fixed pair is always an active equality row
        active = np.nonzero(act)[0]
        slack = (prob.h - prob.G @ x) / (1.0 + np.abs(prob.h))
        if (free & ~strong & ~zero).any():
            why.append("weakly active row (0 < z_i <= 1e-6 max z)")
        if (free & zero & (slack <= 1e-6)).any():
            why.append("inactive row with (near-)zero slack")
    qp = QPProblem("maros-meszaros", prob.n, prob.P, prob.q, prob.A, prob.b, prob.G, prob.h)
    K = _kkt_matrix(qp, active)
    rhs = np.zeros(K.shape[0])
    rhs[: prob.n] = w
    try:
        sol, degenerate = kkt_solve(K, rhs, prob.n, check_singular=True)
    except Exception as exc:
        return {"verified": False, "why": f"{type(exc).__name__}: {str(exc)[:120]}"}
    if degenerate:
        why.append("active rows dependent (KKT matrix singular)")
    if why:
        return {"verified": False, "why": "; ".join(why)}
    grads: dict[str, np.ndarray] = {"q": -sol[: prob.n]}
    if prob.m:
        gh = np.zeros(prob.m)
        gh[active] = sol[prob.n : prob.n + active.size]
        grads["h"] = gh
    if prob.p:
        grads["b"] = sol[prob.n + active.size :]
    along = [
        sum(float(grads[k] @ d[k]) for k in ("q", "h", "b") if d.get(k) is not None and k in grads)
        for d in dirs
    ]
    return {"verified": True, "why": "", "directions": along}


# ------------------------------------------------------------------------------ piece check

PIECE_MARGIN = 1e-2  # relative relaxation of the rows outside a gradient's support
TIGHT = 1e-8  # relative slack of a tight row at a polished solution


def piece_problem(
    prob: MMProblem, x0: np.ndarray, grad_h: np.ndarray | None
) -> tuple[MMProblem | None, int, str]:
    """The nearby problem on which a claimed gradient must be the plain derivative.

    A gradient whose ``h`` part is supported on a subset :math:`B` of the tight rows :math:`J`
    claims to be the derivative of the affine piece on which the rows :math:`J \\setminus B`
    are inactive. Relaxing exactly those rows, :math:`h_i \\mathrel{+}= m(1 + |h_i|)` with
    :math:`m` = ``PIECE_MARGIN``, moves :math:`\\theta` into that piece's region, along a
    segment that stays in it; if :math:`x^\\star` does not move (there is an optimal multiplier
    supported on :math:`B`), the solution map is the same affine piece there, and its
    derivative at the relaxed point is a limit of derivatives at points of differentiability
    arbitrarily close to :math:`\\theta`, i.e. an element of the B-subdifferential at
    :math:`\\theta`. Returns ``(problem, relaxed rows, why)``; ``problem`` is ``None`` when
    there is nothing to relax (``why`` says so). Whether ``x0`` stays optimal is checked by the
    caller (:func:`piece_evidence`).
    """
    if prob.G is None or prob.h is None or grad_h is None:
        return None, 0, "no inequality rows"
    slack = prob.h - prob.G @ x0
    tight = slack <= TIGHT * (1.0 + np.abs(prob.h))
    relax = tight & (np.asarray(grad_h) == 0.0)
    if not relax.any():
        return None, 0, "no tight row outside the gradient's support"
    h = prob.h + PIECE_MARGIN * (1.0 + np.abs(prob.h)) * relax
    return MMProblem(prob.name, prob.P, prob.q, prob.G, h, prob.A, prob.b), int(relax.sum()), ""


def piece_evidence(prob: MMProblem, seed: int, x0: np.ndarray, grads: dict) -> dict[str, Any]:
    """Finite-difference evidence at the relaxed point of :func:`piece_problem`, along the
    directions of the original problem; ``{"why": ...}`` without ``directions`` where the check
    does not apply (nothing to relax, or :math:`x^\\star` moves: the support is not a piece)."""
    relaxed, count, why = piece_problem(prob, x0, grads.get("h"))
    if relaxed is None:
        return {"why": why}
    x1, *_ = solve_polished(relaxed)
    if x1 is None:
        return {"why": "the relaxed problem did not solve", "relaxed_rows": count}
    move = float(np.abs(x1 - x0).max() / (1.0 + np.abs(x0).max()))
    if move > 1e-7:
        why = f"x* moves by {move:.2g} when the rows outside the gradient's support are relaxed"
        return {"why": why + ": the support is not a piece at theta", "relaxed_rows": count}
    ev = fd_evidence(relaxed, seed, dirs=directions(prob, seed), reference=False)
    ev.update(relaxed_rows=count, move=move, why="")
    return ev
