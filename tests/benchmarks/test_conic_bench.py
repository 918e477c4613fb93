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


def test_summary_reports_each_missed_target_with_its_figure():
    from benchmarks.conic.run import section, summary

    goals = [
        {
            "problem": "socp",
            "target": "batch 128: <= 1.25x",
            "figure": "9.85x",
            "verdict": "MISSED",
        },
        {"problem": "sdp", "target": "batch 128: <= 1.25x", "figure": "1.10x", "verdict": "MET"},
        {"problem": "socp", "target": "batch 1: <= 2x", "figure": "-", "verdict": "-"},
    ]
    text = summary(goals)
    assert "met on 1 of 2" in text and "**MISSED** on 1 (socp 9.85x)" in text
    assert "batch 1: <= 2x" not in text  # no figure: no verdict, not counted
    one = [{"problem": "all", "target": "gradients", "figure": "worst 5e-9", "verdict": "MET"}]
    assert summary(one) == "- gradients: met on 1 of 1; MET on all (worst 5e-9)"
    sec = section(["--rounds", "3"], {}, goals, "TABLES", "conic")
    assert "python -m benchmarks.conic.run --rounds 3" in sec and "TABLES" in sec
    assert "results/conic.png" in sec


def test_quick_run_leaves_benchmarks_md_alone(monkeypatch, tmp_path):
    import benchmarks.conic.run as run

    called = []
    monkeypatch.setattr(run, "update_benchmarks_md", lambda *a: called.append(a))
    monkeypatch.setattr(run, "results_dir", lambda area: tmp_path)
    monkeypatch.setattr(run, "run_case", lambda *a: [])
    monkeypatch.setattr(run, "accuracy_rows", lambda *a, **k: [])
    monkeypatch.setattr(run, "targets", lambda rows, quick: [])
    monkeypatch.setattr(run, "plot", lambda *a: None)
    run.main(["--quick", "--problems", "socp"])
    assert called == []
    run.main(["--problems", "socp"])
    assert called and called[0][0] == "conic"
