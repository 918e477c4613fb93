"""A tiny run of the shortest-path demo, and the QPTL layer it trains through."""

from __future__ import annotations

import json
import math
import warnings

import torch
from examples.shortest_path import run as demo
from torch import nn

from dxopt import dfl
from dxopt.qp import QPDegenerateWarning


def test_tiny_run_learns_and_reports_every_method(tmp_path):
    summary = demo.run(
        degs=[1, 6], seeds=[0], num_train=64, num_test=100, epochs=2, out_dir=tmp_path
    )
    oracle = dfl.ShortestPathOracle(demo.GRID)
    for deg in (1, 6):
        _, test_set = demo.make_data(deg, 0, 64, 100, oracle)
        torch.manual_seed(0)
        untrained = demo.held_out_regret(nn.Linear(demo.NUM_FEAT, oracle.dim), test_set, oracle)
        for method in demo.METHODS:
            (regret,) = summary["regrets"][method][str(deg)]
            assert math.isfinite(regret) and regret >= 0
            if deg == 6:  # eight Adam steps: below the random start, the DFL ones by > 10%
                bound = untrained if method == "two-stage" else 0.9 * untrained
                assert regret < bound, (method, deg, regret, untrained)
        assert set(summary["verdicts"][str(deg)]) == {"SPO+", "QPTL"}
        assert all("one seed" in v for v in summary["verdicts"][str(deg)].values())
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["regrets"] == summary["regrets"]
    assert (tmp_path / "regret.png").stat().st_size > 0


def test_demo_qptl_layer_is_the_path_polytope_and_tends_to_the_shortest_path():
    oracle = dfl.ShortestPathOracle(demo.GRID)
    c = dfl.shortest_path(8, demo.NUM_FEAT, deg=2, seed=3).costs.to(torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QPDegenerateWarning)
        x = demo.qptl_layer(1e-4)(c)
    path = oracle(c)
    # eps -> 0: the smoothed decision is the shortest path (these costs have no ties)
    torch.testing.assert_close(x, path, atol=1e-3, rtol=0)
    # and a path: one unit of flow leaves the source and reaches the sink
    A, b = dfl.flow_conservation(25, dfl.grid_graph(5, 5), 0, 24)
    torch.testing.assert_close(x @ A.T, b.expand(8, -1), atol=1e-6, rtol=0)


def test_verdict_needs_more_than_noise():
    assert demo.verdict([0.10, 0.11, 0.09], [0.20, 0.21, 0.19]).startswith("BETTER")
    assert demo.verdict([0.30, 0.31, 0.29], [0.20, 0.21, 0.19]).startswith("WORSE")
    assert demo.verdict([0.10, 0.30, 0.20], [0.20, 0.20, 0.20]).startswith("no clear")
    assert "one seed" in demo.verdict([0.1], [0.2])
