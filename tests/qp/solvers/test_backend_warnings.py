"""A backend's own warnings from an infeasible sample's attempts do not reach the user
(issue 35 item 11): dxopt certifies the point and reports the status itself."""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt.qp as dqp


@pytest.mark.parametrize("solver", ["clarabel", "piqp", "auto"])
def test_an_infeasible_sample_gives_its_status_without_backend_warnings(solver: str) -> None:
    P = torch.eye(2, dtype=torch.float64)
    q = torch.zeros(2, dtype=torch.float64)
    G = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    h = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)  # x0 <= -1 and x0 >= 1
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sol = dqp.solve(P, q, G=G, h=h, solver=solver, on_failure="nan")
    assert [str(w.message) for w in seen] == []  # (an error filter would turn them into crashes)
    assert sol.status == (dqp.QPStatus.INFEASIBLE, dqp.QPStatus.SOLVED)
    assert torch.isnan(sol.x[0]).all() and torch.allclose(
        sol.x[1], torch.zeros(2, dtype=torch.float64)
    )
