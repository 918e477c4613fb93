"""Test helpers: an oracle over an explicit vertex list (exact by enumeration), and PyEPO's
``optModel`` interface over one of our oracles (PyEPO is a test-only reference)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from dxopt.dfl import CallableOracle


def subsets(d: int, k: int) -> torch.Tensor:
    """The 0/1 vectors of length ``d`` with ``k`` ones, ``(C(d, k), d)`` float64."""
    rows = [[1.0 if i in s else 0.0 for i in range(d)] for s in itertools.combinations(range(d), k)]
    return torch.tensor(rows, dtype=torch.float64)


def enum_oracle(V: torch.Tensor, sense: str = "min") -> CallableOracle:
    """``argmin`` (``argmax``) of ``c^T v`` over the rows ``v`` of ``V`` (first on ties)."""

    def fn(c: torch.Tensor) -> torch.Tensor:
        scores = c @ V.T
        return V[scores.argmin(1) if sense == "min" else scores.argmax(1)]

    return CallableOracle(fn, dim=V.shape[1], sense=sense, batched=True)


def enum_value(V: torch.Tensor, c: torch.Tensor, sense: str = "min") -> torch.Tensor:
    """The optimal value ``min_v c^T v`` (``max``) for each row of ``c``, by enumeration."""
    scores = c @ V.T
    return scores.amin(1) if sense == "min" else scores.amax(1)


def pyepo_model(oracle):  # type: ignore[no-untyped-def]
    """PyEPO's optModel interface over one of our oracles."""
    from pyepo import EPO
    from pyepo.model.opt import optModel

    class OracleModel(optModel):  # type: ignore[misc]
        def _getModel(self):  # type: ignore[no-untyped-def]
            if oracle.sense == "max":
                self.modelSense = EPO.MAXIMIZE
            return None, None

        def setObj(self, cost):  # type: ignore[no-untyped-def]
            self.cost = torch.as_tensor(np.asarray(cost), dtype=torch.float64)

        def solve(self):  # type: ignore[no-untyped-def]
            sol = oracle(self.cost)
            return sol.numpy(), float((sol * self.cost).sum())

        @property
        def num_cost(self):  # type: ignore[no-untyped-def]
            return oracle.dim

    return OracleModel()
