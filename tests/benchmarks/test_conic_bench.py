"""The conic benchmark's problem set and runners, at a smoke size: the raw Clarabel loop, the
layers and Moreau agree on each problem's solution."""

from __future__ import annotations

import pytest

pytest.importorskip("cvxpy")
pytest.importorskip("cvxpylayers")


@pytest.mark.parametrize("name", ["socp", "portfolio", "logistic"])
def test_runners_agree_at_batch_two(name):
    from benchmarks.conic.run import run_case

    rows = {r["method"]: r for r in run_case(name, 2, rounds=1, seed=3)}
    assert rows["raw Clarabel loop"]["x_err"] == 0
    assert rows["cvxpylayers Clarabel"]["x_err"] <= 1e-3
    if rows["Moreau"].get("x_err") is not None:
        assert rows["Moreau"]["x_err"] <= 1e-4
    dx = rows["dxopt.conic"]
    assert dx["note"] == "forward+backward" and dx["ms"] > 0
    # x_err is over the user's variable: socp's canonical x also holds the epigraph of
    # abs(x) <= 1, which is not unique (the old whole-vector comparison gave 0.4 there)
    assert dx["x_err"] <= 1e-4
    for key in ("raw Clarabel loop", "cvxpylayers default"):
        assert rows[key]["ms"] > 0


def test_cone_data_has_the_cones_of_each_model():
    from benchmarks.conic.problems import PROBLEMS, cone_data

    socp, port, logi, sdp = (
        cone_data(PROBLEMS[k](1))[0] for k in ("socp", "portfolio", "logistic", "sdp")
    )
    assert socp.soc and socp.nonneg
    assert port.soc and port.zero == 1
    assert logi.exp == 2 * 20  # two exponential cones per logistic term, m = 20
    assert sdp.psd == (4,)
