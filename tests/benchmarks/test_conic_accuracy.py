"""The accuracy columns of ``dxopt bench conic``: the kink-aware slope, the variable's layout
and one problem with a closed-form derivative."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cvxpy")


def test_smooth_slope_is_exact_to_the_resolution():
    from benchmarks.conic.accuracy import kink_aware_slope

    slope = kink_aware_slope(lambda t: np.exp(t) * np.sin(t + 1))
    assert slope.verdict == "smooth"
    assert abs(slope.value - (np.sin(1) + np.cos(1))) < 1e-10


def test_kink_gets_no_value():
    from benchmarks.conic.accuracy import kink_aware_slope

    for phi in (lambda t: abs(t) + 0.3 * t, lambda t: max(t, 0.0) * 2.0 + 1.0):
        slope = kink_aware_slope(phi)
        assert slope.verdict == "kink" and slope.value is None


def test_noise_is_unresolved_and_a_zero_slope_uses_the_floor():
    from benchmarks.conic.accuracy import kink_aware_slope

    rng = np.random.default_rng(0)
    noisy = kink_aware_slope(lambda t: t + 1e-9 * rng.standard_normal())
    assert noisy.verdict == "unresolved"
    flat = lambda t: 2.0 + 1e-13 * rng.standard_normal()  # noqa: E731
    assert kink_aware_slope(flat, floor=1.0).verdict == "smooth"
    assert kink_aware_slope(flat, floor=0.0).verdict != "smooth"  # 0 relative to itself


@pytest.mark.parametrize("symmetric", [False, True])
def test_variable_value_matches_cvxpy(symmetric):
    """The variable's value read from CVXPY's canonical x equals ``variable.value``."""
    import clarabel
    import scipy.sparse as sp
    from benchmarks.conic.accuracy import variable_value
    from benchmarks.conic.peers import clarabel_cones
    from benchmarks.conic.problems import ConeData

    X = cp.Variable((3, 3), symmetric=symmetric)
    C = np.arange(9.0).reshape(3, 3)
    C = C + C.T if symmetric else C
    prob = cp.Problem(cp.Minimize(cp.sum_squares(X - C) + X[0, 1]), [X[2, 0] >= 20])
    prob.solve(solver=cp.CLARABEL)
    data, chain, _ = prob.get_problem_data(cp.CLARABEL)
    ids = chain.compose_var_id_map().get(X.id, [X.id])
    start = int(data[cp.settings.PARAM_PROB].var_id_to_col[ids[0]])
    d = data["dims"]
    cd = ConeData(data["P"], data["c"], data["A"], data["b"], d.zero, d.nonneg, tuple(d.soc),
                  d.exp, tuple(d.p3d), tuple(d.psd))  # fmt: skip
    s = clarabel.DefaultSettings()
    s.verbose = False
    P = sp.triu(cd.P).tocsc()
    x = clarabel.DefaultSolver(P, cd.q, sp.csc_matrix(cd.A), cd.b, clarabel_cones(cd), s).solve().x
    got = variable_value(np.asarray(x), start, X)
    np.testing.assert_allclose(got, X.value.reshape(-1), atol=1e-6)


def test_log_penalty_fd_is_the_closed_form_and_dxopt_is_within_target():
    """diffcp issue 57's problem: dx*/dlam = lam / sqrt(lam^2 + 1) - 1."""
    from benchmarks.conic.accuracy import TARGET, accuracy_rows
    from benchmarks.conic.problems import log_penalty

    prob = log_penalty(1)
    rows = {r["method"]: r for r in accuracy_rows(prob, methods=["dxopt.conic"])}
    row = rows["dxopt.conic"]
    lam = float(prob.values[0][0, 0])
    assert row["verdict"] == "within" and row["grad_rel_err"] <= TARGET
    # the module's seeded direction (a tenth of |theta|) and weight, drawn as it draws them
    rng = np.random.default_rng(0 + 17)
    d = np.sign(rng.standard_normal(1)[0]) * 0.1 * lam
    w = rng.standard_normal(1)[0]
    exact = w * d * (lam / np.sqrt(lam**2 + 1) - 1)
    assert abs(row["fd"] - exact) < 1e-9 * abs(exact)
    assert abs(row["grad"] - exact) < 1e-8 * abs(exact)
    assert row["x_err"] < 1e-8
