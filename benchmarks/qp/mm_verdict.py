"""The gradient verdict of one Maros-Meszaros problem: dxopt's claim against the
finite-difference evidence (:mod:`benchmarks.qp.mm_evidence`) through the judge of
:mod:`benchmarks.qp.judge`, the verified reduced-KKT reference, the piece check of a flagged
degenerate gradient, and the uniqueness check of the solution (a loss ``w . x*`` over a
non-unique solution set is not a function of the data, so no difference can judge it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.qp import judge as J
from benchmarks.qp import mm_problems as mmp

REF_RTOL = 1e-3  # relative gradient error against a verified reference that counts as wrong
VERDICTS = (J.MATCH, J.CLARKE, J.PIECE, J.WRONG, J.NO_VERDICT, "refused", "forward failed",
            "error")  # fmt: skip
PASSING = (J.MATCH, J.CLARKE, J.PIECE)


def claim(grads: dict[str, np.ndarray], d: dict[str, Any]) -> float:
    total = 0.0
    for key in ("q", "h", "b"):
        if d.get(key) is not None and key in grads:
            total += float(grads[key] @ d[key])
    return total


def flagged(dx: dict) -> bool:
    """dxopt said the sample is degenerate: a ``QPDegenerateWarning``, dependent rows or a
    pseudo-inverse adjoint in its backward diagnostics."""
    bw = dx.get("backward_info") or {}
    deps = bw.get("dependent_rows") or []
    return bool(
        dx.get("degenerate_warning")
        or (isinstance(deps, list) and any(int(v or 0) > 0 for v in deps))
        or bw.get("licq") is False
        or any(bool(v) for v in (bw.get("pseudo_inverse") or []))
    )


ROUNDOFF = 1e-13  # relative accuracy of a polished solution (its KKT solve's residual)
NONUNIQUE_MOVE = 1e-6  # relative distance of two accepted solutions that is not solver error
FLAT = 1e-10  # curvature of P along their difference, relative to max|P_ij| |d|^2: flat
SAME_OBJECTIVE = 1e-8  # relative difference of their objectives: equal


def not_unique(prob: mmp.MMProblem, x: np.ndarray | None, x0: np.ndarray | None) -> str:
    """Why the solution set is not one point, or ``""``: dxopt's accepted ``x`` and the
    finite-difference base point ``x0`` are far apart (relative distance above
    ``NONUNIQUE_MOVE``), ``P`` is flat along their difference ``d``
    (``d' P d <= FLAT max|P_ij| |d|^2``) and their objectives
    are equal (within ``SAME_OBJECTIVE``). The optimal set of a convex QP is convex, so the
    whole segment is optimal, ``w . x*`` is not a function of the data there, and the one-sided
    differences of another solver describe another point of the set (they can jump: the
    re-solve lands elsewhere on the face): they are no evidence for or against dxopt's
    gradient, whichever way they read. Two accepted points of a problem with a unique but
    ill-conditioned solution differ along directions where ``P`` curves, so they are not
    taken for non-uniqueness."""
    if x is None or x0 is None:
        return ""
    x, x0 = np.asarray(x, dtype=np.float64), np.asarray(x0, dtype=np.float64)
    d = x - x0
    move = float(np.abs(d).max(initial=0.0)) / (1.0 + float(np.abs(x0).max(initial=0.0)))
    if move <= NONUNIQUE_MOVE:
        return ""
    pmax = float(abs(prob.P).max()) if prob.P.nnz else 0.0
    curvature = float(d @ (prob.P @ d))
    if curvature > FLAT * pmax * float(d @ d):
        return ""

    def objective(v: np.ndarray) -> tuple[float, float]:
        quad, lin = 0.5 * float(v @ (prob.P @ v)), float(prob.q @ v)
        return quad + lin, max(abs(quad), abs(lin))

    (fx, sx), (f0, s0) = objective(x), objective(x0)
    if abs(fx - f0) > SAME_OBJECTIVE * max(1.0, sx, s0):
        return ""
    return (
        f"x* not unique: dxopt's solution and the finite-difference solver's differ by "
        f"{move:.2g} (relative) with equal objective ({abs(fx - f0):.2g} apart) and "
        f"d'Pd = {curvature:.2g} along their difference d (|d|^2 = {float(d @ d):.2g})"
    )


def evaluation_noise(prob: mmp.MMProblem, seed: int, ev: dict) -> float:
    """The error bound of one evaluation of ``f = w . x*``: the measured disagreement of the two
    finite-difference solvers (``ev["noise"]``), at least the round-off of a polished solution,
    ``ROUNDOFF * sum_i |w_i| max(|x_i|, 1)``, and at least the gap between ``f(0)`` and a flat
    side of any direction (:func:`benchmarks.qp.judge.flat_offset`). Two polished solutions
    on the same active set are the same KKT solve and agree to the last bit, so the measured
    noise alone can be 0, and a slope of round-off (1e-17 / 1e-3) would then read as a usable
    nonzero slope."""
    x0 = ev.get("x0")
    w = np.abs(mmp.loss_weights(prob, seed))
    scale = float(w @ np.maximum(np.abs(x0), 1.0)) if x0 is not None else float(w.sum())
    noise = max(float(ev["noise"]), ROUNDOFF * scale)
    f0 = ev.get("f0")
    if f0 is not None and np.isfinite(f0):  # an error of f(0) that a flat side shows
        sides = [e[k] for e in ev.get("directions", []) for k in ("plus", "minus") if k in e]
        noise = max(noise, J.flat_offset(float(f0), sides))
    return noise


def judge_problem(prob: mmp.MMProblem, seed: int, ev: dict, dx: dict) -> dict[str, Any]:
    """Verdict of dxopt's gradient (``dx["grads"]``) at its solution (``dx["x"]``, optional)
    against the evidence ``ev``; ``no verdict`` (source ``"non-unique"``) where the two points
    show that the solution is not unique (:func:`not_unique`)."""
    grads = dx["grads"]
    noise = evaluation_noise(prob, seed, ev)
    dirs = mmp.directions(prob, seed)
    per = []
    for d, e in zip(dirs, ev["directions"]):
        plus = {float(t): v for t, v in e["plus"].items()}
        minus = {float(t): v for t, v in e["minus"].items()}
        v = J.judge_direction(claim(grads, d), ev["f0"], plus, minus, noise=noise)
        per.append((d["kind"], v))
    fd = J.combine([v.verdict for _, v in per])
    out: dict[str, Any] = {
        "fd_verdict": fd,
        "directions": {k: v.verdict for k, v in per},
        "fd_rel_error": {k: v.rel_error for k, v in per},
    }
    verdict, source = fd, "fd"
    why = not_unique(prob, dx.get("x"), ev.get("x0"))
    if why:  # the evidence is about another optimal point: no verdict, whatever it reads
        out.update(verdict=J.NO_VERDICT, source="non-unique", nonunique=why)
        return out
    ref = ev.get("reference") or {}
    if ref.get("verified"):
        # the reference must itself pass the judge wherever finite differences can tell
        ref_ok = all(
            J.judge_direction(r, ev["f0"], e["plus"], e["minus"], noise=noise).verdict != J.WRONG
            for r, e in zip(ref["directions"], ev["directions"])
        )
        x0 = ev.get("x0")
        floor = max(
            1e-8 * max(abs(r) for r in ref["directions"]),
            1e-10 * float(np.abs(mmp.loss_weights(prob, seed)).sum())
            * max(1.0, float(np.abs(x0).max()) if x0 is not None else 1.0),
        )  # fmt: skip
        errs = [
            abs(v.claimed - r) / max(abs(v.claimed), abs(r), floor)
            for (_, v), r in zip(per, ref["directions"])
        ]
        err = max(errs)
        out.update(ref_err=err, ref_consistent=ref_ok)
        if ref_ok and fd != J.WRONG:
            if err > REF_RTOL:
                verdict, source = J.WRONG, "ref"
            elif fd == J.NO_VERDICT:
                verdict, source = J.MATCH, "ref"
    out.update(verdict=verdict, source=source)
    return out


def judge_piece(prob: mmp.MMProblem, seed: int, piece_ev: dict, grads: dict) -> dict[str, Any]:
    """The piece check of a flagged gradient judged ``wrong`` at a degenerate point.

    At a point where the active rows are dependent the solution map has several affine pieces,
    and along a random line the one-sided slopes see only the two pieces the line enters: the
    derivative of a third piece (an element of the B-subdifferential, so of Clarke's
    generalised gradient) can lie outside them, because ``w . x*`` is not convex and
    :math:`\\partial_C f(0) \\subseteq \\partial_C F(\\theta) d` is only an inclusion. The
    check (:func:`benchmarks.qp.mm_evidence.piece_evidence`) moves to the point of the piece the
    gradient names (the tight rows outside its support relaxed, :math:`x^\\star` unchanged)
    and judges the same claim there along the same directions: ``piece`` if it matches (or
    lies between the one-sided slopes) there, else the verdict stays ``wrong``. A gradient that
    spreads over all dependent rows (the minimum-norm one) relaxes nothing and stays ``wrong``.
    """
    if "directions" not in piece_ev:
        return {"piece_verdict": J.WRONG, "piece_why": piece_ev.get("why", "")}
    per = []
    noise = evaluation_noise(prob, seed, piece_ev)
    for d, e in zip(mmp.directions(prob, seed), piece_ev["directions"]):
        plus = {float(t): v for t, v in e["plus"].items()}
        minus = {float(t): v for t, v in e["minus"].items()}
        per.append(J.judge_direction(claim(grads, d), piece_ev["f0"], plus, minus,
                                     noise=noise).verdict)  # fmt: skip
    fd = J.combine(per)
    out = {"piece_verdict": fd, "piece_directions": dict(zip(mmp.DIRECTION_KINDS, per)),
           "piece_relaxed_rows": piece_ev.get("relaxed_rows"), "piece_why": ""}  # fmt: skip
    if fd in (J.MATCH, J.CLARKE):
        out.update(verdict=J.PIECE, source="piece")
    return out
