"""Smoke run of the multi_attempt benchmark (tiny budget, temporary output)."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_benchmark_writes_consistent_results(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    import torch
    from benchmarks.multi_attempt import run

    threads = torch.get_num_threads()
    try:
        run.main(["--quick", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # the benchmark pins one thread
    payload = json.loads((tmp_path / "multi_attempt.json").read_text())
    assert payload["quick"]
    assert {r["method"] for r in payload["runs"]} == {"grpo", "naive", "cal", "cal-mix"}
    for r in payload["runs"]:
        assert all(0.0 <= p["verification"] <= 1.0 for p in r["curve"])
        assert all(p["pass1"] <= p["verification"] + 1e-12 for p in r["curve"])
    assert 0 < payload["optimum_verification"] <= 1
    rows = {(r["instance"], r["estimator"]): r for r in payload["exact"]}
    assert rows[("counterexample", "grpo (LOO)")]["|bias|"] < 1e-12
    assert rows[("counterexample", "naive (LOO)")]["|bias| / |grad|"] > 0.5
    assert (tmp_path / "multi_attempt.png").stat().st_size > 0
    assert "## Multi-attempt policy gradients" in (tmp_path / "multi_attempt.md").read_text()
