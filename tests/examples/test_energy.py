"""A tiny run of the energy demo: its optimal costs are recomputed, its regrets are
non-negative and the normalised regret their ratio; the two-stage model is the least-squares
fit (normal equations)."""

from __future__ import annotations

import json
import math

import torch
from examples.energy import run as demo

from dxopt.dfl import jair_scheduling


def test_least_squares_fit_satisfies_the_normal_equations():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, 8, generator=gen, dtype=torch.float64)
    beta = torch.randn(8, generator=gen, dtype=torch.float64)
    y = x @ beta + 3.0 + 0.1 * torch.randn(5, 48, generator=gen, dtype=torch.float64)
    model = demo.least_squares(x, y)
    resid = (demo.predict(model, x) - y).detach().reshape(-1)
    X = torch.cat([x.reshape(-1, 8), torch.ones(240, 1, dtype=torch.float64)], 1)
    assert torch.allclose(X.T @ resid, torch.zeros(9, dtype=torch.float64), atol=1e-8)


def test_tiny_demo_run_reports_true_regrets(tmp_path):
    summary = demo.run(instance=1, train_days=4, test_days=3, epochs=1, batch=2, lr=0.05, seed=0,
                       out_dir=tmp_path)  # fmt: skip
    assert set(summary["metrics"]) == {"two-stage (least squares)", "decision-focused (SPO+)"}
    task = jair_scheduling(1, seed=0, dtype=torch.float64)
    c = task.test.costs[:3]
    z = task.oracle.objective(c, task.oracle(c))
    assert torch.allclose(torch.tensor(summary["optimal_costs"], dtype=torch.float64), z,
                          rtol=1e-9)  # fmt: skip
    for name, row in summary["metrics"].items():
        reg = torch.tensor(summary["per_day_regret"][name], dtype=torch.float64)
        assert (reg >= -1e-6 * z.abs()).all(), name
        assert math.isclose(row["normalised regret"], float(reg.sum() / z.abs().sum()),
                            rel_tol=1e-9, abs_tol=1e-12)  # fmt: skip
        assert row["price MSE"] > 0
    assert len(summary["spo_curve"]) == 1 and math.isfinite(summary["spo_curve"][0])
    assert (tmp_path / "regret.png").stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text())["test_days"] == 3


def test_verdict_says_plainly_when_decision_focused_training_does_not_pay_off():
    def table(two_stage, spo):
        return {"two-stage": {"normalised regret": two_stage}, "spo": {"normalised regret": spo}}

    assert "paid off here" in demo.verdict(table(0.10, 0.09))
    assert "did not pay off" in demo.verdict(table(0.0251, 0.02508))  # -0.1%: no difference
    assert "did NOT pay off" in demo.verdict(table(0.10, 0.12))
