"""Smoke run of ``dxopt bench dfl --suite jair --quick`` on the knapsack (tiny: 1 seed, 2 epochs,
16 days), and dxopt's oracles against PyEPO's Gurobi model on the same costs of both tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("pyepo")
pytest.importorskip("gurobipy")
from benchmarks.dfl import run
from benchmarks.dfl.jair_suite import COLUMNS, load_task, pyepo_model, pyepo_optimum

from dxopt import cli


def test_jair_quick_writes_the_columns(tmp_path: Path) -> None:
    args = ["--suite", "jair", "--quick", "--out", str(tmp_path), "--tasks", "knapsack-60"]
    payload = run.main([*args, "--methods", "2S", "SPO+", "QPTL"])
    saved = json.loads((tmp_path / "jair.json").read_text())
    assert saved["columns"] == list(COLUMNS)
    assert (tmp_path / "jair.md").stat().st_size > 0 and (tmp_path / "jair.png").exists()
    rows = saved["rows"]
    assert len(rows) == len(payload["rows"]) == 5  # 2S, SPO+ in both libraries, QPTL in dxopt
    for r in rows:
        assert set(COLUMNS) <= set(r)
        assert 0.0 <= r["regret"] < 10.0 and r["seconds_per_epoch"] > 0
    spo = {r["library"]: r for r in rows if r["method"] == "SPO+"}
    assert spo["pyepo"]["oracle_calls"] == spo["dxopt"]["oracle_calls"] == 16  # one per day
    assert saved["verdicts"] == []  # --quick: no verdicts


@pytest.mark.parametrize(("name", "option"), [("knapsack", 60), ("scheduling", 1)])
def test_dxopt_and_pyepo_agree_on_the_optimum(name: str, option: int) -> None:
    inst = load_task(name, seed=0, num_train=3, option=option, num_test=1)
    optmodel = pyepo_model(inst)
    gen = torch.Generator().manual_seed(0)
    # the true costs and random ones (the oracle must not only be right on the data's costs)
    costs = torch.cat(
        [
            inst.c_train.double(),
            inst.c_train.double()[:2]
            * torch.rand(2, inst.num_vars, generator=gen, dtype=torch.float64),
        ]
    )
    oracle = inst.task.oracle
    x = oracle(costs)
    z = (x * costs).sum(1)
    for i in range(costs.shape[0]):
        _, obj = pyepo_optimum(optmodel, costs[i])
        assert abs(obj - float(z[i])) <= 1e-6 * max(1.0, abs(obj)), (i, obj, float(z[i]))


def test_cli_bench_dfl_jair_quick(tmp_path: Path) -> None:
    """``dxopt bench dfl --suite jair --quick`` through the ``dxopt`` entry point: the columns,
    the new methods in both libraries with NCE's oracle calls equal (one shared Bernoulli
    stream), and dxopt's and PyEPO's optimal objectives equal on the same test costs."""
    methods = ["SPO+", "NCE", "PG"]
    argv = ["bench", "dfl", "--suite", "jair", "--quick", "--out", str(tmp_path)]
    cli.main([*argv, "--tasks", "knapsack-60", "--methods", *methods])
    saved = json.loads((tmp_path / "jair.json").read_text())
    assert saved["columns"] == list(COLUMNS) and saved["quick"] is True
    rows = {(r["method"], r["library"]): r for r in saved["rows"]}
    assert set(rows) == {(m, lib) for m in methods for lib in ("pyepo", "dxopt")}
    for m in methods:
        pe, dx = rows[m, "pyepo"], rows[m, "dxopt"]
        assert pe["oracle_calls"] == dx["oracle_calls"], m
        assert abs(pe["regret"] - dx["regret"]) <= 1e-6, m  # ties aside, the same training
    assert rows["PG", "dxopt"]["oracle_calls"] == 32  # two costs per day, 16 days
    agree = saved["optimum_agreement"]["knapsack-60"]
    assert agree["days"] == 16 and agree["max_rel_diff"] <= 1e-9


def test_main_suite_refuses_jair_only_methods(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.main(["--methods", "SPO+", "PG", "--quick"])
    assert "run in --suite jair only" in capsys.readouterr().err
