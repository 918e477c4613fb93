"""The benchmark's --quick mode runs end to end and its figures are consistent."""

import json
import math
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_benchmark_writes_consistent_results(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # as `dxopt bench` does: repo root on sys.path
    from benchmarks.bilevel.run import main

    before = torch.get_num_threads()
    try:
        main(["--quick", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(before)
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["targets"]) == 4  # the run-time target is only judged on full runs
    for name in ("kappa_scaling", "separation", "frontier_staircase", "epsilon_scaling",
                 "regularization_task"):  # fmt: skip
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    # every Ji run converged and never beat the zero-chain lower bound T n
    for row in data["kappa_runs"] + data["epsilon_runs"]:
        assert row["status"] == "solved"
        assert row["calls"] >= row["lower_bound_Tn"]
        assert row["calls"] == row["grad_f"] + row["grad_g"] + row["hvp"] + row["jvp"]
    # the AGD slope is positive and finite; GD inner costs more at every shared kappa
    slope = data["fits"]["AID-CG+AGD"]["slope"]
    assert slope is not None and math.isfinite(slope) and slope > 0.5
    agd = {r["n"]: r["calls"] for r in data["kappa_runs"] if r["method"] == "AID-CG+AGD"}
    gd = {r["n"]: r["calls"] for r in data["kappa_runs"] if r["method"] == "AID-CG+GD"}
    assert gd and all(gd[n] > agd[n] for n in gd)
    # at fixed T the instance is invariant to eps
    fixed = data["fixed_T_runs"]
    assert len({r["calls"] for r in fixed}) == 1
    # the zero-chain frontier advances by at most one coordinate per call
    assert all(r["max_frontier_step"] <= 1 for r in data["frontier_runs"])
    # every method lowered the validation loss on the real task
    for row in data["task_runs"]:
        assert row["final_val_loss"] < row["start_val_loss"]
    assert "## Bilevel" in (tmp_path / "results.md").read_text()
