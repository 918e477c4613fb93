"""Smoke runs of ``dxopt bench dfl --quick`` (benchmarks/dfl): both libraries train, the
exact-oracle methods give the same trajectories in both, and the oracle calls are counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyepo")
from benchmarks.dfl import run
from benchmarks.dfl.methods import HYPER

NUM_TRAIN = 100  # --quick's training set


def _quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> dict:
    def forbidden(*_: object) -> None:
        raise AssertionError("--quick must leave BENCHMARKS.md alone")

    monkeypatch.setattr(run, "update_benchmarks_md", forbidden)
    payload = run.main(["--quick", "--out", str(tmp_path), *args])
    for name in ("dfl.json", "dfl.md"):
        assert (tmp_path / name).stat().st_size > 0
    saved = json.loads((tmp_path / "dfl.json").read_text())
    assert len(saved["runs"]) == len(payload["runs"])
    return payload


def _by(runs: list[dict], **keys) -> dict:
    sel = [r for r in runs if all(r[k] == v for k, v in keys.items())]
    assert len(sel) == 1, (keys, len(sel))
    return sel[0]


def test_exact_methods_match_pyepo_run_for_run(tmp_path: Path, monkeypatch) -> None:
    payload = _quick(tmp_path, monkeypatch, "--problems", "sp", "--methods", "2S", "SPO+", "DBB")
    runs = payload["runs"]
    assert {(r["problem"], r["method"], r["library"]) for r in runs} == {
        ("sp", m, lib) for m in ("2S", "SPO+", "DBB") for lib in run.LIBRARIES
    }
    problem = "sp"
    for method in ("2S", "SPO+", "DBB"):
        pe = _by(runs, problem=problem, method=method, library="pyepo")
        dx = _by(runs, problem=problem, method=method, library="dxopt")
        # same data, initial weights and batches, exact oracles on both sides: the same
        # decisions, so the same test regret (ties aside, which these costs do not have)
        assert 0 <= dx["regret"] < 2 and dx["regret"] == pytest.approx(pe["regret"], abs=1e-4)
        assert dx["train_loss"] == pytest.approx(pe["train_loss"], rel=1e-3, abs=1e-5)
        calls = {"2S": 0, "SPO+": NUM_TRAIN, "DBB": 2 * NUM_TRAIN}[method]
        assert pe["calls_per_epoch"] == dx["calls_per_epoch"] == calls
        assert dx["s_per_epoch"] > 0 and len(dx["epoch_seconds"]) == 3
    rows = {(r["problem"], r["method"]): r for r in payload["speed"]}
    assert rows[("sp", "SPO+")]["PyEPO calls/epoch"] == NUM_TRAIN
    # a --quick run is a smoke run: no target verdicts at a smoke budget
    assert {r["within spread"] for r in payload["regret"]} == {"smoke run"}
    text = (tmp_path / "dfl.md").read_text()
    assert "| sp | DBB | 6 |" in text and "Load average" in text


@pytest.mark.slow
def test_knapsack_and_the_sampled_and_smooth_methods(tmp_path: Path, monkeypatch) -> None:
    payload = _quick(
        tmp_path, monkeypatch, "--problems", "ks", "--methods", "DBB", "PFYL", "NCE", "QPTL"
    )
    runs = payload["runs"]
    hp = HYPER["ks"]
    pe, dx = (_by(runs, method="DBB", library=lib) for lib in ("pyepo", "dxopt"))
    assert dx["regret"] == pytest.approx(pe["regret"], abs=1e-4)  # exact oracles both
    assert pe["calls_per_epoch"] == dx["calls_per_epoch"] == 2 * NUM_TRAIN
    for library in run.LIBRARIES:
        pfy = _by(runs, method="PFYL", library=library)
        assert pfy["calls_per_epoch"] == hp["PFYL"].n_samples * NUM_TRAIN
        nce = _by(runs, method="NCE", library=library)
        assert 0 <= nce["calls_per_epoch"] <= NUM_TRAIN  # the pool answers most batches
        assert 0 <= pfy["regret"] < 2 and 0 <= nce["regret"] < 2
    qptl = _by(runs, method="QPTL", library="dxopt")
    assert qptl["calls_per_epoch"] == NUM_TRAIN and 0 <= qptl["regret"] < 2
    assert not [r for r in runs if r["method"] == "QPTL" and r["library"] == "pyepo"]
    # QPTL has no PyEPO counterpart: no verdict, not a pass
    (row,) = [r for r in payload["regret"] if r["method"] == "QPTL"]
    assert row["within spread"] == "-" and row["PyEPO regret"] == "-"


def test_merged_records_replace_reruns_and_name_their_commits() -> None:
    def rec(commit: str, method: str, seed: int, regret: float) -> dict:
        keys = {"problem": "sp", "deg": 6, "seed": seed, "method": method, "library": "dxopt"}
        return {**keys, "regret": regret}

    old = {
        "machine": {"commit": "aaa"},
        "runs": [rec("", m, s, 0.1) for m in ("2S", "NCE") for s in (0, 1)],
    }
    new = {"machine": {"commit": "bbb"}, "runs": [rec("", "NCE", s, 0.2) for s in (0, 1, 2)]}
    runs = run.merge_runs([old, new])
    assert len(runs) == 5  # NCE seeds 0, 1 replaced by the later record, seed 2 added
    assert {(r["method"], r["seed"], r["commit"], r["regret"]) for r in runs} == {
        ("2S", 0, "aaa", 0.1), ("2S", 1, "aaa", 0.1),
        ("NCE", 0, "bbb", 0.2), ("NCE", 1, "bbb", 0.2), ("NCE", 2, "bbb", 0.2),
    }  # fmt: skip
    assert run.provenance_note(runs).endswith(
        "commit aaa: 2S seeds 0 1 | commit bbb: NCE seeds 0 1 2."
    )
    assert (
        run.coverage_note(runs) == "Not every row has all of seeds 0 1 2: sp 2S deg 6: seeds 0 1."
    )
    assert run.coverage_note(runs[2:]) is None


def test_method_time_is_paired_with_the_two_stage_control_of_its_own_process() -> None:
    from benchmarks.dfl.report import speed_rows

    def rec(method: str, library: str, seconds: float, record: int, seed: int = 0) -> dict:
        return {
            "problem": "sp", "deg": 6, "seed": seed, "method": method, "library": library,
            "s_per_epoch": seconds, "calls_per_epoch": 0, "record": record,
        }  # fmt: skip

    runs = [
        rec("2S", "pyepo", 0.010, 0), rec("NCE", "pyepo", 0.020, 0),
        rec("2S", "dxopt", 0.010, 0), rec("NCE", "dxopt", 0.012, 0),
        # seed 1: its two-stage control ran in another process (record 1): not paired
        rec("2S", "pyepo", 0.5, 1, seed=1), rec("NCE", "pyepo", 0.020, 0, seed=1),
        rec("2S", "dxopt", 0.5, 1, seed=1), rec("NCE", "dxopt", 0.012, 0, seed=1),
        # DBB trains with batch 128 on sp: a quarter of the control's steps, no pairing
        rec("DBB", "pyepo", 0.2, 0), rec("DBB", "dxopt", 0.005, 0),
    ]  # fmt: skip
    rows = {r["method"]: r for r in speed_rows(runs)}
    nce = rows["NCE"]
    assert nce["speed-up"] == pytest.approx(0.020 / 0.012)
    assert nce["PyEPO method s/epoch"] == pytest.approx(0.010)  # seed 0 only
    assert nce["dxopt method s/epoch"] == pytest.approx(0.002)
    assert nce["method speed-up"] == pytest.approx(5.0)
    # a method costing nothing on top of the shared loop would be 2x faster, no more
    assert nce["ceiling"] == pytest.approx(2.0)
    assert rows["2S"]["method speed-up"] is None and rows["2S"]["ceiling"] is None
    dbb = rows["DBB"]
    assert dbb["speed-up"] == pytest.approx(40.0) and dbb["ceiling"] is None
    assert dbb["PyEPO method s/epoch"] is None and dbb["method speed-up"] is None
