"""benchmarks/qp_cvxpy/run.py on one small case: every method timed, the same solution from the
layer and the hand-written matrices, and targets judged from the figures in the rows."""

from __future__ import annotations

import pytest

pytest.importorskip("cvxpylayers")

from benchmarks.qp_cvxpy.run import (
    COLUMNS,
    CVXPYLAYERS_OPTIONS,
    OVERHEAD_TARGET,
    SPEEDUP_TARGET,
    run_case,
    section,
    targets,
)


def test_one_case_times_every_method_and_judges_the_targets() -> None:
    rows = run_case("simplex", 2, 1, 0)
    methods = [r["method"] for r in rows]
    assert methods == ["CvxpyQPLayer", "dxopt.qp.solve (matrices)", *CVXPYLAYERS_OPTIONS]
    by = {r["method"]: r for r in rows}
    assert all(r["fwd_bwd_ms"] > 0 for r in rows)
    assert by["CvxpyQPLayer"]["x_err"] <= 1e-9  # the same QP, solved by the same solver
    assert all(by[k]["x_err"] <= 1e-2 for k in CVXPYLAYERS_OPTIONS)  # cone solvers, looser
    fastest = min(CVXPYLAYERS_OPTIONS, key=lambda k: by[k]["fwd_bwd_ms"])
    layer = by["CvxpyQPLayer"]
    assert layer["speedup"] == pytest.approx(by[fastest]["fwd_bwd_ms"] / layer["fwd_bwd_ms"])
    assert by[fastest]["note"] == "fastest cvxpylayers"
    judged = targets([{**r, "batch": 128} if r is layer else r for r in rows])
    assert [t["verdict"] for t in judged] == [
        "met" if layer["speedup"] >= SPEEDUP_TARGET else "MISSED",
        "met" if layer["vs_matrices"] <= OVERHEAD_TARGET else "MISSED",
    ]
    info = {"cpu": "x", "cores": 2, "torch": "t", "torch_threads": 1, "python": "3"}
    text = section(rows, {**info, "date": "d", "commit": "c"}, (0.0, 0.0), "cmd", "1")
    assert all(c in text for c in COLUMNS)
