"""The dense-backward benchmark (benchmarks/qp_speed/dense.py) in its quick mode."""

from __future__ import annotations

from benchmarks.qp_speed.dense import COLUMNS, run_dense, section


def test_quick_run_times_every_case_and_judges_the_targets() -> None:
    rows = run_dense(quick=True, repeats=1)
    cases = [r["case"] for r in rows]
    assert cases == [
        "cholesky of P (torch)",
        "cholesky of P (scipy dpotrf)",
        "raw daqp",
        "dxopt forward",
        "penalty backward",
        "kkt backward",
        "fwd+bwd penalty",
        "fwd+bwd kkt",
    ]
    for r in rows:
        assert r["n"] == 200 and r["threads"] == 1 and r["seconds"] > 0
        unit = min(rows[0]["seconds"], rows[1]["seconds"])  # the faster Cholesky
        assert abs(r["x_cholesky"] * unit - r["seconds"]) <= 1e-12
        assert r["verdict"] in ("-", "met", "missed")
    backward = {r["case"]: r for r in rows if r["case"].endswith("backward")}
    for r in backward.values():
        assert r["verdict"] == ("met" if r["x_cholesky"] <= 3.0 else "missed")
        assert r["note"].startswith("schur")  # P = MM' + 1e-4 I is positive definite
    # both backwards are the exact adjoint after refinement: same gradients
    diff = float(backward["penalty backward"]["note"].split("grads vs kkt ")[1])
    assert diff <= 1e-8
    # about half of the 1.5 n rows are active on this family
    assert 0.3 * 300 <= rows[0]["k"] <= 300
    info = {"cpu": "x", "cores": 2, "torch": "t", "torch_threads": 1, "python": "3"}
    text = section(rows, {**info, "date": "d", "commit": "c"}, (0.0, 0.0), "cmd")
    assert all(c in text for c in COLUMNS)
