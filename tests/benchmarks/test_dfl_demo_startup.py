"""The demo start-up benchmark's report: the target is judged on the demo runs' wall time, and
``_timed`` measures a real child process (the full measurement installs torch: run by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from benchmarks.dfl import demo_startup


def test_report_judges_each_demo_run_against_three_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = {
        "install": {"wall_s": 300.0, "cpu_s": 50.0},
        "cold": {"wall_s": 200.0, "cpu_s": 60.0},
        "warm": {"wall_s": 14.0, "cpu_s": 13.0},
        "wheel": "dxopt-0.2.0-py3-none-any.whl",
    }
    monkeypatch.setattr(demo_startup, "measure", lambda work, spec: fake)
    monkeypatch.setattr(demo_startup, "results_dir", lambda area: tmp_path)
    demo_startup.main(["--no-md"])
    rows = {r["run"]: r for r in json.loads((tmp_path / "demo_startup.json").read_text())["rows"]}
    assert rows["cold"]["met"] is False and rows["warm"]["met"] is True
    assert rows["install"]["met"] is None  # the install is reported, not judged
    text = (tmp_path / "demo_startup.md").read_text()
    assert "| cold | 200 |" in text and (tmp_path / "demo_startup.png").stat().st_size > 0


def test_timed_measures_a_child_and_raises_on_failure(tmp_path: Path) -> None:
    spent = demo_startup._timed(
        [
            sys.executable,
            "-c",
            "import time; t = time.process_time()\nwhile time.process_time() - t < 0.2: pass",
        ],
        cwd=tmp_path,
    )
    assert spent["wall_s"] >= 0.2 and spent["cpu_s"] >= 0.15
    with pytest.raises(RuntimeError, match="failed"):
        demo_startup._timed([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path)
