"""Smoke run of the linearize benchmark (``--quick``) with checks on what it writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmark_writes_consistent_results(tmp_path):
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.common import BENCHMARKS_MD
    from benchmarks.linearize.methods import METHODS
    from benchmarks.linearize.run import main
    from benchmarks.linearize.tasks import TASKS

    before = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else None
    payload = main(["--quick", "--out", str(tmp_path)])
    assert (BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else None) == before
    data = json.loads((tmp_path / "linearize.json").read_text())
    assert "## Linearize" in (tmp_path / "linearize.md").read_text()
    for name in ("linearize_addition.png", "linearize_disentanglement.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert len(TASKS) >= 4
    assert sorted(r["method"] for r in data["runs"]) == sorted(METHODS)
    for r in data["runs"]:
        for key in ("single_mean", "add_abs", "neg_target", "neg_control"):
            assert 0.0 <= r[key] <= 1.0
        assert set(r["single"]) == set(TASKS)
        assert r["tau_norm"] > 0
        # Negation keeps the control accuracy constraint (alpha = 0 is always feasible).
        for neg in r["negation"].values():
            assert neg["alpha"] in data["grids"]["negation"]
        assert 0.0 <= r["xi"] <= 2.0
    # The linearized model stores theta_0 and delta: twice the weights of the others.
    cost = data["cost"]
    for m in ("standard", "delta", "delta_no_curv"):
        assert cost["linear"]["weight_bytes"] == 2 * cost[m]["weight_bytes"]
    assert [c["status"] in ("HOLDS", "DOES NOT HOLD") for c in payload["claims"]] == [True] * 6
