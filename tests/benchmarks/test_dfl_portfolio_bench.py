"""Smoke run of the DFL benchmark's portfolio row (benchmarks/dfl/portfolio.py, --quick):
both libraries train SPO+ on the same data to the same test regret (both oracles are exact, so
the trajectories agree up to solver tolerance), and the smooth layer trains too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyepo")
pytest.importorskip("gurobipy")
from benchmarks.dfl import portfolio


@pytest.mark.slow
def test_portfolio_row_quick(tmp_path: Path) -> None:
    payload = portfolio.main(["--quick", "--out", str(tmp_path), "--methods", "SPO+", "QPTL"])
    saved = json.loads((tmp_path / "portfolio.json").read_text())
    assert saved["runs"] == payload["runs"] and (tmp_path / "portfolio.md").stat().st_size > 0
    rows = {(r["method"], r["library"]): r for r in payload["runs"]}
    assert set(rows) == {("SPO+", "pyepo"), ("SPO+", "dxopt"), ("QPTL", "dxopt")}
    for row in rows.values():
        assert 0.0 < row["test_regret"] < 1.0
    assert rows[("SPO+", "dxopt")]["solves_per_epoch"] == 64  # 64 training samples
    assert rows[("SPO+", "pyepo")]["solves_per_epoch"] == 64
    a, b = rows[("SPO+", "dxopt")]["test_regret"], rows[("SPO+", "pyepo")]["test_regret"]
    assert abs(a - b) <= 1e-3 * max(a, b)
