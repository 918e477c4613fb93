"""The README's dxopt.dfl example runs as written (docs/readme/dfl.md)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

PART = Path(__file__).resolve().parents[2] / "docs" / "readme" / "dfl.md"


def test_readme_example_runs_and_learns(capsys):
    blocks = re.findall(r"```python\n(.*?)```", PART.read_text(), flags=re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    exec(compile(blocks[0], str(PART), "exec"), namespace)
    regret = namespace["dfl"].normalized_regret(
        namespace["oracle"], namespace["model"](namespace["data"].features), namespace["data"].costs
    )
    assert 0 < float(regret) < 0.5  # one epoch of SPO+ from a random linear model
    assert namespace["spo"].cost.forwards == 1000
    assert isinstance(regret, torch.Tensor)
    assert "Cost(forwards=1000)" in capsys.readouterr().out


def test_readme_portfolio_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", PART.read_text(), flags=re.S)
    namespace: dict = {}
    exec(compile(blocks[1], str(PART), "exec"), namespace)
    dfl, oracle = namespace["dfl"], namespace["oracle"]
    data = namespace["data"]
    regret = dfl.normalized_regret(oracle, namespace["model"](data.features), data.costs)
    assert 0 < float(regret) < 1
    assert all(st.ok for st in oracle.last_status)
    assert namespace["spo"].cost.forwards == 64  # one SPO+ solve per sample of the epoch
    assert "Status.SOLVED" in capsys.readouterr().out
