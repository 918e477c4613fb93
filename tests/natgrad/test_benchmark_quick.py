"""Smoke run of the natgrad benchmark (``--quick``) with checks on what it writes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmark_writes_consistent_results(tmp_path):
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.common import BENCHMARKS_MD
    from benchmarks.natgrad.run import METHODS, main

    before = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else None
    payload = main(["--quick", "--problems", "poisson2d", "--out", str(tmp_path)])
    assert (BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else None) == before
    data = json.loads((tmp_path / "natgrad.json").read_text())
    assert (tmp_path / "natgrad_error_vs_time.png").stat().st_size > 1000
    assert "## Natgrad (smoke run)" in (tmp_path / "natgrad.md").read_text()
    runs = data["runs"]
    assert sorted(r["method"] for r in runs) == sorted(METHODS)
    initial = {r["trace"]["error"][0] for r in runs}
    assert len(initial) == 1  # same seed, same network for every method
    for r in runs:
        assert r["steps"] >= 1 and not r["diverged"]
        assert math.isfinite(r["final_error"])
        assert r["train_time_s"] >= r["budget_s"]  # ran to its budget
        assert r["trace"]["time"] == sorted(r["trace"]["time"])
    # ENGD's line search only accepts loss decreases; the fit must improve on the test grid.
    engd = next(r for r in runs if r["method"] == "ENGD")
    assert engd["best_error"] < engd["trace"]["error"][0]
    # a smoke run gives no target verdicts and says it is one
    assert payload["targets"] == [] and payload["smoke"] is True
    text = (tmp_path / "natgrad.md").read_text()
    assert "smoke run" in text.lower() and "PASS" not in text and "MISSED" not in text
