"""The exact KKT judge of the Maros-Meszaros benchmark on small QPs with a closed-form
solution map: it matches the exact gradient, says ``wrong`` for a perturbed one, and gives no
verdict where the active set is ambiguous (a kink) or the KKT matrix is singular."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from benchmarks.qp import mm_kkt_judge as K
from benchmarks.qp import mm_problems as mmp


def _toy(h0: float, *, duplicate: bool = False, pair: bool = False) -> mmp.MMProblem:
    """``min 1/2 |x|^2 + q'x`` s.t. ``x0 <= h0``, ``x2 <= 5``, ``x0 + x1 = b`` (``b = 2``,
    ``q = (0, 0, -0.5)``). For ``h0 < 1`` row 0 is active with multiplier ``2 - 2 h0 > 0``:
    ``x* = (h0, b - h0, -q2)``; at ``h0 = 1`` its multiplier and slack are both 0 (a kink).
    ``duplicate``: row 0 twice (dependent active rows); ``pair``: plus ``2 x2 <= 1`` and
    ``-2 x2 <= -1`` (a fixed pair: ``x2 = 0.5``)."""
    rows = [[1.0, 0, 0], [0, 0, 1.0]]
    h = [h0, 5.0]
    if duplicate:
        rows.append([1.0, 0, 0])
        h.append(h0)
    if pair:
        rows += [[0, 0, 2.0], [0, 0, -2.0]]
        h += [1.0, -1.0]
    return mmp.MMProblem(
        "KKTTOY", sp.identity(3, format="csc"), np.array([0.0, 0.0, -0.5]),
        sp.csc_matrix(np.array(rows)), np.array(h), sp.csc_matrix(np.array([[1.0, 1.0, 0]])),
        np.array([2.0]),
    )  # fmt: skip


def _exact(prob: mmp.MMProblem, *, pair: bool = False) -> tuple[dict, np.ndarray]:
    """Gradient of ``w . x*`` and ``x*`` in closed form: ``dL/dh0 = w0 - w1``, ``dL/db = w1``,
    ``dL/dq2 = -w2`` (or, with the pair, ``dL/dh_pair = w2 / 2`` on its kept row)."""
    w = mmp.loss_weights(prob, 0)
    gh = np.zeros(prob.m)
    gh[0] = w[0] - w[1]
    gq = np.array([0.0, 0.0, 0.0 if pair else -w[2]])
    if pair:
        gh[2] = w[2] / 2
    x = np.array([prob.h[0], 2.0 - prob.h[0], 0.5])
    return {"q": gq, "h": gh, "b": np.array([w[1]])}, x


def test_exact_gradient_matches_and_the_reference_is_the_closed_form():
    prob = _toy(0.5)
    grads, x = _exact(prob)
    v = K.judge(prob, 0, grads, x, solvers=())
    assert v.verdict == K.MATCH, v
    assert v.source.startswith("dxopt") and v.n_active == 1
    truth = [K.claimed(grads, d) for d in mmp.directions(prob, 0)]
    np.testing.assert_allclose(v.reference, truth, rtol=1e-12, atol=1e-14)
    assert max(v.bound) < 1e-10 and v.multiplier_margin > K.MARGIN and v.slack_margin > 1.0


def test_reference_solver_point_finds_the_active_set_without_dxopt():
    prob = _toy(0.5)
    grads, _ = _exact(prob)
    v = K.judge(prob, 0, grads, None, solvers=("piqp",))
    assert v.verdict == K.MATCH and v.source == "piqp (tight)", v


@pytest.mark.parametrize("factor", [1.01, 0.98, -1.0])
def test_perturbed_gradient_is_wrong(factor):
    prob = _toy(0.5)
    grads, x = _exact(prob)
    bad = {k: g.copy() for k, g in grads.items()}
    bad["h"][0] *= factor  # one component off by 1%, 2%, or its sign
    v = K.judge(prob, 0, bad, x, solvers=())
    assert v.verdict == K.WRONG, v
    assert max(v.rel_error) > K.RTOL


def test_a_wrong_active_set_in_the_claim_is_wrong():
    # the gradient of the unconstrained-in-row-0 piece (x0 = x1 = b/2), right only for h0 > 1
    prob = _toy(0.5)
    _, x = _exact(prob)
    w = mmp.loss_weights(prob, 0)
    half = 0.5 * (w[1] - w[0])  # x0 = (b - q0 + q1) / 2, x1 = (b + q0 - q1) / 2
    other = {"q": np.array([half, -half, -w[2]]), "h": np.zeros(prob.m),
             "b": np.array([(w[0] + w[1]) / 2])}  # fmt: skip
    assert K.judge(prob, 0, other, x, solvers=()).verdict == K.WRONG


def test_kink_is_no_verdict():
    prob = _toy(1.0)  # row 0: slack 0 and multiplier 0 at x* = (1, 1, 0.5)
    grads, x = _exact(prob)
    for pts in ({"x_dxopt": x, "solvers": ()}, {"x_dxopt": None, "solvers": ("piqp",)}):
        v = K.judge(prob, 0, grads, **pts)
        assert v.verdict == K.NO_VERDICT, v
        assert "ambiguous" in v.why


def test_slightly_inside_the_kink_the_margin_decides():
    # h0 = 1 - 1e-6: multiplier 2e-6, far above the solve's error: verified and matched
    prob = _toy(1.0 - 1e-6)
    grads, x = _exact(prob)
    v = K.judge(prob, 0, grads, x, solvers=())
    assert v.verdict == K.MATCH, v
    assert K.MARGIN < v.multiplier_margin < 1e12


def test_dependent_active_rows_are_no_verdict():
    prob = _toy(0.5, duplicate=True)
    grads, x = _exact(prob)
    v = K.judge(prob, 0, {**grads, "h": np.append(grads["h"], 0.0)}, x, solvers=())
    assert v.verdict == K.NO_VERDICT and "singular" in v.why, v


def test_fixed_pair_is_one_equality_row():
    prob = _toy(0.5, pair=True)
    grads, x = _exact(prob, pair=True)
    v = K.judge(prob, 0, grads, x, solvers=())
    assert v.verdict == K.MATCH and v.n_pairs == 1, v
    bad = {**grads, "q": grads["q"] + np.array([0.0, 0.0, 0.3])}
    assert K.judge(prob, 0, bad, x, solvers=()).verdict == K.WRONG


def _have_data() -> bool:
    try:
        mmp.data_dir()
    except FileNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _have_data(), reason=f"no Maros-Meszaros data (${mmp.DATA_ENV})")
def test_a_real_problem_matches_and_its_scaled_gradient_is_wrong():
    from benchmarks.qp.mm_dxopt import run_dxopt

    prob = mmp.load("HS76")
    dx = run_dxopt(prob, 0, accept_tol=1e-6, repeats=1)
    assert dx["status"] == "ok", dx
    v = K.judge(prob, 0, dx["grads"], dx["x"])
    assert v.verdict == K.MATCH and max(v.rel_error) < 1e-6, v
    bad = {k: 1.05 * g for k, g in dx["grads"].items()}
    assert K.judge(prob, 0, bad, dx["x"]).verdict == K.WRONG
