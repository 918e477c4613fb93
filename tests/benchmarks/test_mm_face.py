"""The optimal-set judge of refusals (:mod:`benchmarks.qp.mm_face`) on problems whose solution
set is known in closed form: a segment of optimal points (not unique), a strictly convex QP and
a singular ``P`` whose loss is constant on the optimal set (unique), and an infeasible problem
(no verdict)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from benchmarks.qp import mm_face as F
from benchmarks.qp import mm_problems as mmp


def _box_lp(P: np.ndarray, q: list[float], *, infeasible: bool = False) -> mmp.MMProblem:
    """``min 1/2 x'Px + q'x`` s.t. ``x0 + x1 >= 1`` and ``0 <= x <= 2`` (``x0 + x1 >= 5``
    with ``infeasible``)."""
    G = np.vstack([[-1.0, -1.0], -np.eye(2), np.eye(2)])
    h = np.array([-5.0 if infeasible else -1.0, 0.0, 0.0, 2.0, 2.0])
    return mmp.MMProblem("FACETOY", sp.csc_matrix(P), np.array(q), sp.csc_matrix(G), h, None,
                         None)  # fmt: skip


def test_a_segment_of_optimal_points_is_verified_not_unique_with_the_exact_range():
    # min x0 + x1 over the box with x0 + x1 >= 1: the optimal set is the segment
    # x0 + x1 = 1, 0 <= x <= 1, on which w . x ranges over [min(w0, w1), max(w0, w1)]
    prob = _box_lp(np.zeros((2, 2)), [1.0, 1.0])
    v = F.judge_face(prob)
    assert v.verdict == F.NOT_UNIQUE, v
    w = mmp.loss_weights(prob, 0)
    x_star = F.reference_point(prob)
    assert x_star is not None
    norm = np.linalg.norm(w) * max(np.linalg.norm(x_star), 1.0)
    np.testing.assert_allclose(v.ranges, abs(w[0] - w[1]) / norm, rtol=1e-5)
    lo, hi = F.loss_range(prob, x_star, w, 1e-9)
    np.testing.assert_allclose(sorted([w @ lo, w @ hi]), sorted(w), atol=1e-7)


def test_strictly_convex_and_constant_loss_faces_are_unique():
    strict = F.judge_face(_box_lp(np.eye(2), [-1.0, -1.0]))  # x* = (1, 1)
    assert strict.verdict == F.UNIQUE, strict
    # P singular along x1 (objective x0^2 - 2 x0 + x1): x0 = 1, and x1's cost pins x1 = 0
    flat = F.judge_face(_box_lp(np.diag([2.0, 0.0]), [-2.0, 1.0]))
    assert flat.verdict == F.UNIQUE, flat
    # a unique point's range is the relaxation's: it shrinks with the tolerance
    assert flat.ranges[-1] <= F.UNIQUE_RANGE and flat.ranges[0] > 10 * flat.ranges[-1]


def test_no_reference_solution_gives_no_verdict():
    v = F.judge_face(_box_lp(np.eye(2), [0.0, 0.0], infeasible=True))
    assert v.verdict == F.NO_VERDICT and "reference" in v.why


def test_qafiro_a_public_problem_with_a_face_of_optima_is_verified():
    try:
        prob = mmp.load("QAFIRO")
    except FileNotFoundError:
        pytest.skip("Maros-Meszaros data not found")
    v = F.judge_face(prob)
    assert v.verdict == F.NOT_UNIQUE, v
    assert min(v.ranges) > 0.1 and max(v.gaps) <= F.ACCEPT_TOL


def test_the_summary_counts_refusals_where_no_derivative_exists_apart():
    from benchmarks.qp.mm_report import summarize, summary_table

    def rec(name, verdict, face=None):
        status = "refused" if verdict == "refused" else "ok"
        out = {"problem": name, "n": 3, "verdict": verdict, "forward_success": True,
               "silently_wrong": False, "flagged": False, "silent_forward_error": False,
               "dxopt": {"status": status, "forward_s": 0.1},
               "raw": {s: {"status": "ok", "success": True, "time_s": 0.05}
                       for s in mmp.RAW_SOLVERS}}  # fmt: skip
        return out | ({"face_verdict": face} if face else {})

    records = [rec("A", "match"), rec("B", "match"), rec("C", "refused", F.NOT_UNIQUE),
               rec("D", "refused", F.NO_VERDICT)]  # fmt: skip
    s = summarize(records, 120.0)
    assert s["gradient_coverage"] == 50.0 and s["no_derivative_names"] == ["C"]
    assert abs(s["gradient_coverage_where_one_may_exist"] - 200.0 / 3) < 1e-12
    assert "refused where no derivative exists" in summary_table({"run": s})
