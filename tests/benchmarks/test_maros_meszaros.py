"""The gradient judge on constructed cases with a known truth, and a few-second Maros-Meszaros
subset: dxopt's gradients get no "wrong" verdict, and a corrupted gradient does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from benchmarks.common import REPO_ROOT
from benchmarks.qp import judge as J
from benchmarks.qp import mm_evidence as mme
from benchmarks.qp import mm_problems as mmp

STEPS = mmp.STEPS


def _line(fun):
    return J.evaluate_line(fun, STEPS)


# ------------------------------------------------------------------ judge on known truths


def test_smooth_case_passes_and_a_wrong_slope_fails():
    f0, plus, minus = _line(lambda t: 1.5 + 3.0 * t + 0.7 * t**2)
    assert J.judge_direction(3.0, f0, plus, minus).verdict == J.MATCH
    assert J.judge_direction(3.0 * (1 + 1e-5), f0, plus, minus).verdict == J.MATCH
    for wrong in (3.1, 2.94, -3.0, 0.0, 30.0):  # 2% errors and worse
        v = J.judge_direction(wrong, f0, plus, minus)
        assert v.verdict == J.WRONG, (wrong, v)
        assert v.rel_error == pytest.approx(abs(wrong - 3.0) / max(abs(wrong), 3.0), rel=0.01)


def test_a_kink_accepts_either_one_sided_slope_and_their_hull():
    # f(t) = max(2t, -t): D+ = 2, D- = -1 (the solution map of a QP along a direction that
    # changes the active set)
    f0, plus, minus = _line(lambda t: max(2.0 * t, -t))
    assert J.judge_direction(2.0, f0, plus, minus).verdict == J.MATCH
    assert J.judge_direction(-1.0, f0, plus, minus).verdict == J.MATCH
    assert J.judge_direction(0.5, f0, plus, minus).verdict == J.CLARKE
    assert J.judge_direction(2.5, f0, plus, minus).verdict == J.WRONG
    assert J.judge_direction(-1.5, f0, plus, minus).verdict == J.WRONG


def test_a_kink_of_a_real_projection():
    # x*(h) = argmin 1/2 x^2 - a x s.t. x <= h = min(a, h); at h = a the loss L = x* has
    # one-sided derivatives 0 (h up) and 1 (h down) in h
    a = 0.3
    f0, plus, minus = _line(lambda t: min(a, a + t))
    assert J.judge_direction(0.0, f0, plus, minus).verdict == J.MATCH
    assert J.judge_direction(1.0, f0, plus, minus).verdict == J.MATCH
    assert J.judge_direction(2.0, f0, plus, minus).verdict == J.WRONG


def test_unstable_differences_give_no_verdict_not_a_pass():
    rng = np.random.default_rng(0)
    f0, plus, minus = _line(lambda t: 1.0 + 1e-4 * rng.standard_normal())  # pure noise
    for claim in (0.0, 1.0, 1e3):
        assert J.judge_direction(claim, f0, plus, minus).verdict == J.NO_VERDICT
    # a step ladder that never settles: f(t) = t sin(log t)-like oscillation
    f0, plus, minus = _line(lambda t: abs(t) * np.sin(1.0 / max(abs(t), 1e-300)))
    assert J.judge_direction(0.3, f0, plus, minus).verdict in (J.NO_VERDICT, J.MATCH)
    assert J.judge_direction(0.3, f0, plus, minus).verdict != J.WRONG


def test_noise_bound_turns_small_differences_into_no_verdict():
    rng = np.random.default_rng(1)
    f0, plus, minus = _line(lambda t: 2.0 + 1e-9 * t + 1e-12 * rng.standard_normal())
    # with the true evaluation error declared, a slope of 1e-9 is not resolvable at these steps
    v = J.judge_direction(5.0, f0, plus, minus, noise=1e-12)
    assert v.verdict in (J.NO_VERDICT, J.WRONG)
    v = J.judge_direction(1e-9, f0, plus, minus, noise=1e-11)
    assert v.verdict == J.NO_VERDICT


def test_one_usable_side_that_disagrees_is_no_verdict():
    f0, plus, minus = _line(lambda t: 2.0 * t if t >= 0 else None)  # infeasible for t < 0
    assert J.judge_direction(2.0, f0, plus, minus).verdict == J.MATCH
    assert J.judge_direction(-1.0, f0, plus, minus).verdict == J.NO_VERDICT
    assert J.judge_direction(float("nan"), f0, plus, minus).verdict == J.WRONG


def test_combine():
    assert J.combine([J.MATCH, J.NO_VERDICT]) == J.MATCH
    assert J.combine([J.MATCH, J.CLARKE]) == J.CLARKE
    assert J.combine([J.MATCH, J.WRONG, J.CLARKE]) == J.WRONG
    assert J.combine([J.NO_VERDICT]) == J.NO_VERDICT


# ------------------------------------------------- degenerate points: the piece check


def _pieces_problem():
    import scipy.sparse as sp

    # min 1/2 |x|^2 - x1 - x2 s.t. x1 <= h1, x2 <= h2, x1 + x2 <= h3 at h = 0: x* = 0, three
    # dependent active rows. Near h = 0 the solution map has four affine pieces, by the rows
    # that stay active: {1,2}: x = (h1, h2); {3}: x = -Pi q + (h3/2) 1 with Pi = I - 11'/2;
    # {1,3}: x = (h1, h3 - h1); {2,3}: x = (h3 - h2, h2). Their gradients of L = w.x (in q
    # and h) are the B-subdifferential at h = 0.
    G = sp.csc_matrix(np.array([[1.0, 0], [0, 1.0], [1.0, 1.0]]))
    prob = mmp.MMProblem("toy-pieces", sp.csc_matrix(np.eye(2)), np.array([-1.0, -1.0]), G,
                         np.zeros(3), None, None)  # fmt: skip
    w1, w2 = mmp.loss_weights(prob, 0)
    Pi = np.eye(2) - 0.5
    pieces = {
        "12": {"q": np.zeros(2), "h": np.array([w1, w2, 0.0])},
        "3": {"q": -Pi @ np.array([w1, w2]), "h": np.array([0.0, 0.0, (w1 + w2) / 2])},
        "13": {"q": np.zeros(2), "h": np.array([w1 - w2, 0.0, w2])},
        "23": {"q": np.zeros(2), "h": np.array([0.0, w2 - w1, w1])},
    }
    return prob, pieces


def test_piece_check_certifies_every_piece_and_only_pieces():
    from benchmarks.qp.maros_meszaros import PASSING, judge_piece, judge_problem

    prob, pieces = _pieces_problem()
    ev = mme.fd_evidence(prob, 0)
    assert ev["base_solver"].endswith("+polish")
    line = {}
    for name, grads in pieces.items():
        line[name] = judge_problem(prob, 0, ev, {"grads": grads})["verdict"]
        pev = mme.piece_evidence(prob, 0, ev["x0"], grads)
        assert pev["relaxed_rows"] == 3 - int((grads["h"] != 0).sum()), pev
        assert pev["move"] <= 1e-12
        out = judge_piece(prob, 0, pev, grads)
        assert out["verdict"] == J.PIECE and out["piece_verdict"] in PASSING, (name, out)
    # the line judge alone calls some true pieces wrong: w.x* is not convex in h, so a piece
    # the random line does not enter can lie outside its one-sided slopes
    assert J.WRONG in line.values(), line
    # a claim with a piece's support but the wrong values stays wrong ...
    bad = {"q": np.zeros(2), "h": -pieces["13"]["h"]}
    assert judge_problem(prob, 0, ev, {"grads": bad})["verdict"] == J.WRONG
    out = judge_piece(prob, 0, mme.piece_evidence(prob, 0, ev["x0"], bad), bad)
    assert out["piece_verdict"] == J.WRONG and "verdict" not in out, out
    # ... and so does one spread over all dependent rows (nothing to relax)
    spread = {"q": np.zeros(2), "h": np.full(3, pieces["3"]["h"][2] / 1.5)}
    pev = mme.piece_evidence(prob, 0, ev["x0"], spread)
    assert "directions" not in pev and "support" in pev["why"]
    assert judge_piece(prob, 0, pev, spread)["piece_verdict"] == J.WRONG


def test_piece_check_refuses_a_support_that_is_not_a_piece():
    # claim supported on row 1 only: relaxing rows 2 and 3 moves x* (x2 is then free)
    prob, _ = _pieces_problem()
    ev = mme.fd_evidence(prob, 0)
    grads = {"q": np.zeros(2), "h": np.array([1.0, 0.0, 0.0])}
    pev = mme.piece_evidence(prob, 0, ev["x0"], grads)
    assert "directions" not in pev and "moves" in pev["why"], pev


def test_round_off_slopes_are_not_read_as_a_nonzero_derivative():
    from benchmarks.qp.maros_meszaros import evaluation_noise

    # f(t) = 1e-19 + 1e-17 t: a polished x* = 0 computed to round-off; the two solvers agree
    # bitwise, so the measured noise is 0. A claim of 0 must not be judged wrong.
    f0, plus, minus = _line(lambda t: 1e-19 + 1e-17 * t)
    assert J.judge_direction(0.0, f0, plus, minus, noise=0.0).verdict == J.WRONG  # raw
    prob, _ = _pieces_problem()
    noise = evaluation_noise(prob, 0, {"noise": 0.0, "x0": np.zeros(2)})
    w = np.abs(mmp.loss_weights(prob, 0))
    assert noise == pytest.approx(1e-13 * w.sum())
    assert J.judge_direction(0.0, f0, plus, minus, noise=noise).verdict == J.NO_VERDICT
    # a real slope of the size of w is still judged: 1% off is wrong
    f0, plus, minus = _line(lambda t: 0.5 * t)
    assert J.judge_direction(0.505, f0, plus, minus, noise=noise).verdict == J.WRONG


def _s268_evidence(f0_error: float) -> tuple[float, dict, dict]:
    """The S268 line (Maros-Meszaros, shift direction): a weakly active row at x*, so f has a
    kink at 0 with slope -0.066 on the + side and 0 on the - side; f(0) carries an error
    ``f0_error`` (the polished base point), and the two smallest - steps land on the active
    piece as the base point did (the values of the cached evidence)."""
    true0 = 5.2142441557296575
    plus = {t: true0 - 0.066 * t for t in STEPS}
    minus = {t: true0 for t in STEPS}
    minus[1e-6], minus[1e-7] = true0 + 0.066e-6 + f0_error, true0 + 0.066e-7 + f0_error
    return true0 + f0_error, plus, minus


def test_an_error_of_f0_shown_by_a_flat_side_is_noise_not_a_slope():
    f0, plus, minus = _s268_evidence(2.4e-9)
    # raw, the two smallest - steps read as a stable slope equal to the + side: a false "wrong"
    assert J.judge_direction(0.0, f0, plus, minus, noise=0.0).verdict == J.WRONG
    noise = J.flat_offset(f0, [plus, minus])
    assert noise == pytest.approx(2.4e-9, rel=1e-3)
    assert J.judge_direction(0.0, f0, plus, minus, noise=noise).verdict == J.MATCH  # - side
    assert J.judge_direction(-0.066, f0, plus, minus, noise=noise).verdict == J.MATCH  # + side
    # the judge can still fail: a claim far from both sides is wrong
    for wrong in (0.5, -0.5, 0.066):
        assert J.judge_direction(wrong, f0, plus, minus, noise=noise).verdict == J.WRONG
    # an exact f(0) shows no gap; a side that moves is never flat
    f0, plus, minus = _s268_evidence(0.0)
    assert J.flat_offset(f0, [plus]) == 0.0
    assert J.flat_offset(f0, [minus]) == 0.0


# ------------------------------------------------------------- Maros-Meszaros subset

try:
    mmp.data_dir()
    HAVE_DATA = True
except FileNotFoundError:
    HAVE_DATA = False
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"no Maros-Meszaros data (${mmp.DATA_ENV})")

# PRIMALC8 (n = 520, about 10 s): dependent active rows of very different norms, where the
# minimum-norm adjoint fails and the default once fell back to the pseudo-inverse (wrong)
SUBSET = ("HS21", "HS35", "HS76", "HS118", "DUALC1", "QAFIRO", "HS21" + mmp.ZERO_ROW,
          pytest.param("PRIMALC8", marks=pytest.mark.slow))  # fmt: skip


# problems of SUBSET whose gradient has to be refused, with the cause the refusal must name
# (test_qafiro_has_no_derivative checks it independently)
REFUSED = {"QAFIRO": "P is singular on the null space of the active rows"}


@needs_data
@pytest.mark.parametrize("name", SUBSET)
def test_subset_gets_no_wrong_gradient_and_a_corrupted_one_is_caught(name):
    from benchmarks.qp.maros_meszaros import judge_problem
    from benchmarks.qp.mm_dxopt import run_dxopt

    prob = mmp.load(name)
    dx = run_dxopt(prob, 0, accept_tol=1e-6, repeats=1)
    assert dx["status"] in ("ok", "refused"), dx  # never a silent failure or a crash
    if name in REFUSED:  # no derivative exists: the refusal and its cause are the result
        assert dx["status"] == "refused", dx
        assert REFUSED[name] in dx["error"], dx["error"]
        return
    if dx["status"] != "ok":
        pytest.skip(f"{name}: dxopt refused the gradient ({dx.get('error', '')[:80]})")
    assert dx["accepted"], dx["residuals"]
    ev = mme.fd_evidence(prob, 0)
    result = judge_problem(prob, 0, ev, dx)
    assert result["verdict"] != J.WRONG, result
    if name == "PRIMALC8":  # a vertex piece that both one-sided slopes of every line accept
        assert dx["backward_info"]["pseudo_inverse"] == [False], dx["backward_info"]
        assert result["verdict"] == J.MATCH, result
    if name in ("HS21", "HS35", "HS76"):  # smooth, verified active set: a full match
        assert result["verdict"] == J.MATCH and result["source"] == "fd", result
        assert result["ref_err"] < 1e-8
    # the judge can fail: every directional derivative of a gradient scaled by 1.05 is 5% off
    bad = {k: 1.05 * v for k, v in dx["grads"].items()}
    corrupted = judge_problem(prob, 0, ev, {**dx, "grads": bad})
    if result["verdict"] == J.MATCH:
        # wrong where two sides or the verified reference can tell, never a pass
        assert corrupted["verdict"] in (J.WRONG, J.NO_VERDICT), corrupted
        if result["source"] == "ref" or J.MATCH in result["directions"].values():
            assert corrupted["verdict"] == J.WRONG or not result.get("ref_consistent"), corrupted
    if name in ("HS21", "HS35", "HS76"):
        assert corrupted["verdict"] == J.WRONG


@needs_data
def test_qafiro_has_no_derivative():
    """QAFIRO's refusal is right: its solution set is a face on which the loss ``w . x`` is not
    constant, so ``x*(q)`` is a set and the loss of the returned point has no derivative.
    Independently of dxopt's backward: the optimal set of a convex QP is {x feasible :
    P x = P x*, q'x = q'x*}; two HiGHS LPs over it find optimal points (feasible, objective
    equal to round-off) whose losses differ by O(10)."""
    import scipy.sparse as sp
    from benchmarks.qp.mm_dxopt import run_dxopt
    from scipy.optimize import linprog

    prob = mmp.load("QAFIRO")
    dx = run_dxopt(prob, 0, accept_tol=1e-6, repeats=1)
    assert dx["qp_status"] == ["solved"] and dx["accepted"], dx
    dense = [M.toarray() if sp.issparse(M) else np.asarray(M) for M in (prob.P, prob.G, prob.A)]
    P, G, A = dense
    x = np.asarray(dx["x"])
    w = mmp.loss_weights(prob, 0)
    face = {"A_ub": G, "b_ub": prob.h, "A_eq": np.vstack([A, P, prob.q[None]]),
            "b_eq": np.concatenate([prob.b, P @ x, [prob.q @ x]]),
            "bounds": [(None, None)] * prob.n, "method": "highs"}  # fmt: skip
    ends = [linprog(sign * w, **face) for sign in (1.0, -1.0)]
    assert all(e.status == 0 for e in ends)
    f = 0.5 * x @ P @ x + prob.q @ x
    for e in ends:  # optimal points of the QP itself
        y = e.x
        assert abs(0.5 * y @ P @ y + prob.q @ y - f) <= 1e-9 * (1 + abs(f))
        assert (G @ y - prob.h).max() <= 1e-9 and np.abs(A @ y - prob.b).max() <= 1e-9
    assert w @ ends[1].x - w @ ends[0].x > 1.0  # the loss is not constant on the face
    assert dx["status"] == "refused" and REFUSED["QAFIRO"] in dx["error"], dx


@needs_data
def test_reference_gradient_is_exact_on_a_smooth_problem():
    prob = mmp.load("HS35")
    ev = mme.fd_evidence(prob, 0)
    ref = ev["reference"]
    assert ref["verified"], ref["why"]
    assert ev["base_solver"].endswith("+polish") and ev["noise"] < 1e-12
    for r, e in zip(ref["directions"], ev["directions"]):
        v = J.judge_direction(r, ev["f0"], e["plus"], e["minus"], noise=ev["noise"])
        assert v.verdict == J.MATCH and v.rel_error < 1e-8, (e["kind"], v)


def test_fixed_pairs_and_polish_make_degenerate_differences_exact():
    import scipy.sparse as sp

    # x0 fixed by l = u folded into G (rows 0, 1), x1 <= 1 and x0 + x1 <= 2 (both active)
    G = sp.csc_matrix(np.array([[1.0, 0], [-1.0, 0], [0, 1.0], [1.0, 1.0]]))
    h = np.array([1.0, -1.0, 1.0, 2.0])
    prob = mmp.MMProblem("toy", sp.csc_matrix(np.eye(2)), np.array([-3.0, -3.0]), G, h, None, None)
    assert mmp.fixed_pairs(G, h).tolist() == [1, 0, -1, -1]
    assert mmp.fixed_rows(G, h).tolist() == [True, True, False, False]
    x, _, z, solver = mme.solve_polished(prob)
    assert solver.endswith("+polish")
    np.testing.assert_allclose(x, [1.0, 1.0], atol=1e-14)
    assert z is not None and z.min() >= 0.0
    np.testing.assert_allclose(G.T @ z + x - 3.0, 0.0, atol=1e-12)  # stationary


@needs_data
def test_quick_cli_run_writes_json_and_table(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.qp.run", "--suite", "maros-meszaros",
           "--problems", "HS21,HS35", "--raw", "daqp,piqp", "--out", str(tmp_path),
           "--label", "after"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    payload = json.loads((tmp_path / "maros_meszaros_after.json").read_text())
    summary = payload["summary"]
    assert summary["problems"] == 2 and summary["verdicts"][J.WRONG] == 0
    assert summary["verdicts"][J.MATCH] == 2
    assert summary["success_rate"]["dxopt"] == 100.0
    assert {r["problem"] for r in payload["records"]} == {"HS21", "HS35"}
    # the exact KKT judge agrees on these smooth problems (benchmarks.qp.mm_kkt_judge)
    assert [r["kkt_verdict"] for r in payload["records"]] == [J.MATCH] * 2, payload["records"]
    assert max(max(r["kkt_rel_error"]) for r in payload["records"]) < 1e-6
    text = (tmp_path / "maros_meszaros.md").read_text()
    assert "| HS21 | 2 | 5 | 0 |" in text and "verdict: wrong" in text
    assert (tmp_path / "maros_meszaros.png").stat().st_size > 0
    rerender = subprocess.run([*cmd[:5], "--render-only", "--out", str(tmp_path)], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rerender.returncode == 0, rerender.stderr[-2000:]


def test_render_only_merges_size_ranges_into_one_before_after_table(tmp_path):
    from benchmarks.qp import maros_meszaros as mm

    results = REPO_ROOT / "benchmarks" / "qp" / "results"
    before = json.loads((results / "maros_meszaros_before.json").read_text())
    small = json.loads((results / "maros_meszaros_after.json").read_text())
    large = json.loads((results / "mm_large" / "maros_meszaros_after.json").read_text())
    before["records"], small["records"] = before["records"][:3], small["records"][:3]
    large["records"] = large["records"][:2]
    for name, payload in (("before", before), ("after", small)):
        (tmp_path / f"maros_meszaros_{name}.json").write_text(json.dumps(payload))
    extra = tmp_path / "large.json"
    extra.write_text(json.dumps(large))
    payloads = mm.load_payloads(tmp_path, [extra])
    assert list(payloads) == ["before", "after"]
    merged = payloads["after"]
    names = [r["problem"] for r in merged["records"]]
    assert names == [r["problem"] for r in small["records"] + large["records"]]
    # summaries are recomputed from the records on load (3 of the before run kept here)
    assert merged["summary"]["problems"] == 5 and payloads["before"]["summary"]["problems"] == 3
    text = mm.section(payloads)
    assert "**before** covers 3 of the 5 problems" in text
    for r in large["records"]:  # one row per problem, the baseline's verdict 'not run'
        assert f"| {r['problem']} | {r['n']} |" in text
    assert text.count("| not run |") == 2
    assert "verdict: piece" in text


# ------------------------------------------------- issue 28: HS268/S268, QBEACONF, uniqueness


@needs_data
@pytest.mark.parametrize("name", ["HS268", "S268"])
def test_hs268_gradient_is_the_exact_derivative_of_the_piece_without_the_weak_row(name):
    """HS268/S268: the unconstrained minimiser x = (1, 2, -1, 3, -4) lies exactly on row 5
    (slack 0, multiplier 0): a kink of the solution map. dxopt drops the weakly active row, so
    its gradient is that of the piece where row 5 is inactive, x*(q) = -P^{-1} q: in closed
    form dL/dq = -P^{-1} w, dL/dh = 0. That piece is entered by every line on one side, and the
    polished one-sided difference of that side matches the claim to 1e-5 (cond(P) = 1.2e6: a
    re-solve errs by ~eps cond(P) |x| / t in the slope; at eps 1e-9 that is the 4e-5 an
    independent judge read as a disagreement)."""
    from benchmarks.qp.mm_dxopt import run_dxopt

    prob = mmp.load(name)
    P = prob.P.toarray()
    assert np.linalg.cond(P) > 1e6  # the ill-conditioning behind the unpolished judge's misread
    dx = run_dxopt(prob, 0, accept_tol=1e-6, repeats=1)
    assert dx["status"] == "ok" and dx["accepted"], dx
    w = mmp.loss_weights(prob, 0)
    np.testing.assert_allclose(dx["x"], [1.0, 2.0, -1.0, 3.0, -4.0], atol=1e-9)
    assert prob.h is not None and prob.G is not None
    slack = prob.h - prob.G @ np.array([1.0, 2.0, -1.0, 3.0, -4.0])
    assert slack[4] == 0.0 and slack[:4].min() >= 4.0  # row 5 weakly active, the rest slack
    ref = -np.linalg.solve(P, w)
    assert np.abs(dx["grads"]["q"] - ref).max() <= 1e-9 * np.abs(ref).max()
    assert np.abs(dx["grads"]["h"]).max() == 0.0
    # the claim along a unit q direction is one polished one-sided slope (the side that leaves
    # row 5 inactive), the other side is the piece with row 5 active: a kink, either is valid
    d = np.random.default_rng(3).standard_normal(prob.n)
    d /= np.linalg.norm(d)
    line = {"q": d, "h": None, "b": None}
    claimed = float(dx["grads"]["q"] @ d)
    f0 = float(w @ mme.solve_polished(prob)[0])
    sides = []
    for sign in (1.0, -1.0):
        # even a polished re-solve carries ~2.5e-9 of round-off in x here (cond(P) 1.2e6),
        # i.e. ~1e-9 / t in the slope: t = 1e-3 keeps that below 1e-5 of the claim
        t = 1e-3
        x_t, solver = mme.fd_solve(prob, line, sign * t)
        assert x_t is not None and solver.endswith("+polish")
        sides.append(sign * (float(w @ x_t) - f0) / t)
    assert min(abs(s - claimed) for s in sides) <= 1e-5 * abs(claimed), (claimed, sides)
    assert max(abs(s - claimed) for s in sides) > 1e-2 * abs(claimed), (claimed, sides)  # kink


def _face_problem():
    import scipy.sparse as sp

    # min x1 + 0 x2 s.t. x1 >= 0, 0 <= x2 <= 1: the optimal set is the segment x1 = 0, x2 in
    # [0, 1]; P is zero, so w . x* is not a function of q (any x2 is optimal)
    G = sp.csc_matrix(np.array([[-1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]))
    P = sp.csc_matrix(np.diag([1.0, 0.0]))
    return mmp.MMProblem("toy-face", P, np.array([1.0, 0.0]), G, np.array([0.0, 0.0, 1.0]),
                         None, None)  # fmt: skip


def test_two_optimal_points_of_a_face_are_not_unique_and_get_no_verdict():
    from benchmarks.qp.mm_verdict import judge_problem, not_unique

    prob = _face_problem()
    a, b = np.array([0.0, 0.0]), np.array([0.0, 0.7])  # both optimal, 0.7 apart, P flat
    assert "not unique" in not_unique(prob, a, b)
    assert not_unique(prob, a, a + 1e-9) == ""  # solver error, not another point
    # a unique solution: x1 differs (P curves along it) -> not taken for non-uniqueness
    assert not_unique(prob, np.array([0.3, 0.0]), a) == ""
    # whatever the evidence at the other point reads, it gives no verdict
    f0 = 0.3
    ev = {"noise": 0.0, "x0": b, "f0": f0, "directions": [
        {"kind": k, "plus": {t: f0 + 5.0 * t for t in STEPS},
         "minus": {t: f0 - 5.0 * t for t in STEPS}} for k in mmp.DIRECTION_KINDS]}  # fmt: skip
    grads = {"q": np.zeros(2), "h": np.zeros(3)}
    at_b = judge_problem(prob, 0, ev, {"grads": grads})  # no x: judged on the evidence
    assert at_b["verdict"] == J.WRONG, at_b
    at_a = judge_problem(prob, 0, ev, {"grads": grads, "x": a})
    assert at_a["verdict"] == J.NO_VERDICT and at_a["source"] == "non-unique", at_a
    assert at_a["fd_verdict"] == J.WRONG  # the line reading is kept, not counted


@needs_data
def test_qbeaconf_solution_is_not_unique_and_dxopt_returns_a_vertex():
    """QBEACONF: the optimal set is a face (the interior-point solution has 122 tight rows,
    rank 212 with the equalities, n = 262); dxopt's daqp vertex and clarabel's point differ by
    ~3400 with equal objective and P flat between them. The judge gives no verdict (not a
    jump read as a slope); dxopt's point is a vertex (tight rows and equalities of rank n),
    which does not move with q wherever it stays optimal, so its dL/dq is 0."""
    from benchmarks.qp.mm_dxopt import run_dxopt
    from benchmarks.qp.mm_verdict import flagged, judge_problem

    prob = mmp.load("QBEACONF")
    dx = run_dxopt(prob, 0, accept_tol=1e-6, repeats=1)
    assert dx["status"] == "ok" and dx["accepted"], dx
    assert flagged(dx)  # degenerate: dependent active rows
    ev = mme.fd_evidence(prob, 0)
    result = judge_problem(prob, 0, ev, dx)
    assert result["verdict"] == J.NO_VERDICT and result["source"] == "non-unique", result
    assert prob.G is not None and prob.h is not None and prob.A is not None
    x = dx["x"]
    tight = (prob.h - prob.G @ x) <= 1e-6 * (1.0 + np.abs(prob.h))
    rows = np.vstack([prob.G.toarray()[tight], prob.A.toarray()])
    assert np.linalg.matrix_rank(rows) == prob.n  # a vertex
    assert np.abs(dx["grads"]["q"]).max() <= 1e-10 * np.abs(mmp.loss_weights(prob, 0)).max()


def test_summary_counts_raw_solved_problems_dxopt_misses_and_non_convex_refusals():
    from benchmarks.qp.mm_report import summarize, targets_table

    def rec(name, dx_status, raw_ok, solved, verdict):
        return {"problem": name, "n": 3, "verdict": verdict, "forward_success": solved,
                "silently_wrong": False, "flagged": False, "silent_forward_error": False,
                "dxopt": {"status": dx_status, "forward_s": 0.1},
                "raw": {s: {"status": "ok", "success": raw_ok, "time_s": 0.05}
                        for s in ("piqp", "clarabel")} | {s: {"status": "not run (--raw)"}
                        for s in ("daqp", "proxqp", "osqp")}}  # fmt: skip

    records = [
        rec("A", "ok", True, True, J.MATCH),
        rec("B", "forward failed", True, False, "forward failed"),  # a miss
        rec("C", "not convex", True, False, "refused"),  # refused by design, said apart
        rec("D", "forward failed", False, False, "forward failed"),  # nobody solves it
    ]
    s = summarize(records, 120.0)
    assert s["raw_solved"] == 3 and s["forward_solved"] == 1
    assert s["raw_solved_dxopt_failed"] == ["B"] and s["nonconvex_names"] == ["C"]
    table = targets_table(s)
    assert "| every problem a raw backend solves" in table
    line = next(ln for ln in table.splitlines() if "raw backend solves" in ln)
    assert "B" in line and "non-convex (NotPSDError): C" in line and "MISSED" in line
    s_ok = summarize([records[0], records[2], records[3]], 120.0)
    line = next(ln for ln in targets_table(s_ok).splitlines() if "raw backend solves" in ln)
    assert "PASS" in line and "all; refused as non-convex" in line


@needs_data
def test_unpolished_line_re_solves_use_the_solver_of_f0_once(monkeypatch):
    """QSHELL: no re-solve polishes, clarabel at 1e-11 is accepted and piqp fails after its
    whole budget (2 s a point). The line re-solves take the solver of f(0) and its accepted
    point at once: one solver call a point, not every solver looking for a polished one."""
    import qpsolvers

    calls: list[str] = []
    real = qpsolvers.solve_problem

    def counting(problem, solver, **opts):
        calls.append(solver)
        return real(problem, solver=solver, **opts)

    monkeypatch.setattr(qpsolvers, "solve_problem", counting)
    monkeypatch.setattr(mme, "polish", lambda prob, x, z: None)  # nothing polishes
    prob = mmp.load("HS21")
    ev = mme.fd_evidence(prob, 0, steps=(1e-3, 1e-4), reference=False)
    assert ev["base_solver"] == "clarabel"  # unpolished, the first FD solver
    points = 3 * 2 * 2  # three directions, two steps, two sides
    base_calls = len(mme.FD_SOLVERS[:2]) + len(mme.FD_SOLVERS)  # the noise and f(0)
    assert len(calls) == base_calls + points, calls
    assert calls[base_calls:] == ["clarabel"] * points
    assert all(v is not None for e in ev["directions"] for s in ("plus", "minus")
               for v in e[s].values())  # fmt: skip


def test_a_backward_that_runs_out_of_time_keeps_its_forward_record(monkeypatch):
    """A dxopt task killed at its time limit after the forward: the record says which stage
    (``backward timeout``) and keeps the forward's status, so a slow backward is not counted
    as a forward failure; a task killed before any stage is a plain timeout."""
    import pickle
    import time

    from benchmarks.qp import maros_meszaros as mm

    def forward_then_hang(kind, name, seed, accept_tol, extra=None):
        with open(mm._STAGE_PATH, "wb") as fh:
            pickle.dump({"status": "ok", "accepted": True, "forward_s": 0.01}, fh)
        time.sleep(60)

    monkeypatch.setattr(mm, "_task", forward_then_hang)
    res, wall = mm.isolated("dxopt", "toy", 0, 1e-6, 2.0)
    assert res["status"] == "backward timeout (> 2 s)" and res["accepted"], res
    assert wall < 30

    monkeypatch.setattr(mm, "_task", lambda *args, **kw: time.sleep(60))
    res, _ = mm.isolated("dxopt", "toy", 0, 1e-6, 2.0)
    assert res == {"status": "timeout (> 2 s)"}


CPU_BUDGET_S = 30  # QETAMACR forward + backward: about 1-2 s of CPU when the rule is cheap


@needs_data
def test_degenerate_backward_of_a_mid_size_problem_stays_within_a_cpu_budget():
    """QETAMACR (n = 688, 335 active rows and 272 equalities, 156 of them dependent): forward and
    backward took 0.6 s in the earlier benchmark run; with the min-cost vertex rule 7.5 s of CPU
    on one thread, 2 s with the sparse LP vertex, and 91-166 s with numpy's two OpenBLAS
    threads spinning on a loaded machine (every flagged problem from n ~ 700 up then timed out
    in the benchmark). A guard against the dense null-space loop growing further; CPU time, not
    wall time, so the check does not depend on the machine's load."""
    import resource

    code = (
        "from benchmarks.qp import mm_problems as m\n"
        "from benchmarks.qp.mm_dxopt import run_dxopt\n"
        "dx = run_dxopt(m.load('QETAMACR'), 0, accept_tol=1e-6, repeats=1)\n"
        "print(dx['status'], dx['accepted'])\n"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_BUDGET_S, CPU_BUDGET_S + 5))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=1800, preexec_fn=limit, env=env)  # fmt: skip
    assert proc.returncode == 0, (
        f"QETAMACR forward + backward ran out of its {CPU_BUDGET_S} s CPU budget "
        f"(exit {proc.returncode}): {proc.stderr[-500:]}"
    )
    assert proc.stdout.split()[-2:] == ["ok", "True"], proc.stdout
