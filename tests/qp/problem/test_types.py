"""The result types: the fast constructors of the lean paths make what the dataclasses make."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.problem.types import BackwardDiagnostics, QPInfo, QPSolution, QPStatus


def _values(cls: type) -> dict:
    """A distinct value for every field of ``cls``."""
    x = torch.arange(3.0, dtype=torch.float64)
    info = QPInfo("daqp", 0.5, (1e-12,), (2e-12,))
    pool = {
        "solver": "daqp", "solve_time": 0.25, "primal_residual": (1e-13,),
        "dual_residual": (3e-13,), "backward": BackwardDiagnostics(method="kkt"),
        "sample_solvers": ("daqp",), "sample_tolerances": (1e-9,), "polished": (True,),
        "route": "lean_single", "relax_shift": (0.5,), "iterations": (7,), "warm_started": (True,),
        "x": x, "eq_duals": x + 1, "ineq_duals": x + 2, "status": (QPStatus.SOLVED,),
        "info": info, "lb_duals": x + 3, "ub_duals": x + 4,
    }  # fmt: skip
    return {f.name: pool[f.name] for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls", [QPInfo, QPSolution])
def test_every_field_constructor_equals_the_dataclass(cls: Any) -> None:
    values = _values(cls)
    # the fast constructor takes exactly the dataclass's fields, in order
    params = list(inspect.signature(cls.from_every_field).parameters)
    assert params == [f.name for f in dataclasses.fields(cls)]
    fast, slow = cls.from_every_field(**values), cls(**values)
    assert type(fast) is cls
    for name, value in values.items():
        assert getattr(fast, name) is value
    if cls is QPInfo:  # (QPSolution holds tensors: == would compare them elementwise)
        assert fast == slow and repr(fast) == repr(slow)
    assert vars(fast).keys() == vars(slow).keys()
    for name in values:  # frozen, as the dataclass's own instances
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(fast, name, None)
    again = pickle.loads(pickle.dumps(fast))
    assert type(again) is cls and vars(again).keys() == vars(fast).keys()


def test_lean_path_returns_the_documented_types() -> None:
    P = torch.eye(3, dtype=torch.float64)
    q = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    G, h = torch.ones(1, 3, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    sol = dqp.solve(P, q, G=G, h=h)
    assert type(sol) is QPSolution and type(sol.info) is QPInfo
    assert sol.info.solver == "daqp" and sol.status == (QPStatus.SOLVED,)
    assert sol.eq_duals is None and sol.ineq_duals is not None and sol.lb_duals is None
    assert dataclasses.replace(sol.info, solver="x").solver == "x"
    assert dataclasses.asdict(sol.info)["sample_solvers"] == ("daqp",)
