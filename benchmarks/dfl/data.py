"""The benchmark's problem instances, drawn with PyEPO's own generators.

Both libraries train on the same arrays: ``pyepo.data.shortestpath.genData`` and
``pyepo.data.knapsack.genData`` (Tang & Khalil, arXiv 2206.14234, section 5; the definitions
that ``dxopt.dfl.data`` re-implements) draw ``num_train + num_test`` samples with the run's
seed; the first ``num_train`` train, the rest test. The true decisions ``w*`` and objectives
``z*`` of the training set come from PyEPO's solver model (``pyepo.data.dataset.optDataset``),
and both libraries use those labels.

- ``sp``: shortest path on the 5 x 5 grid (40 arcs, north and east moves), 5 features.
- ``ks``: 2-D knapsack, 32 items, capacity 20 in each dimension, 5 features (maximise value).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

PROBLEMS = ("sp", "ks")
NUM_FEAT = 5
GRID = (5, 5)
KS_ITEMS, KS_DIM, KS_CAPACITY = 32, 2, 20.0


@dataclass(frozen=True)
class Instance:
    """One (problem, deg, seed) data set: float32 tensors, training labels from PyEPO."""

    problem: str
    deg: int
    seed: int
    noise: float
    x_train: torch.Tensor  # (n, p)
    c_train: torch.Tensor  # (n, d)
    w_train: torch.Tensor  # (n, d) true optimal decisions
    z_train: torch.Tensor  # (n, 1) true optimal objectives
    x_test: torch.Tensor
    c_test: torch.Tensor
    weights: np.ndarray | None  # knapsack item weights (dim, items)
    capacity: np.ndarray | None  # knapsack capacities (dim,)
    minimize: bool

    @property
    def num_vars(self) -> int:
        return int(self.c_train.shape[1])


def _quiet(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with its tqdm bars and banners (PyEPO's dataset, Gurobi's licence line) muted."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def pyepo_backend() -> str:
    """PyEPO's solver backend here: ``"gurobi"`` (its default; the pip licence covers these
    sizes) when gurobipy imports, else ``"ortools"``."""
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return "ortools"
    return "gurobi"


def pyepo_model(
    problem: str, weights: np.ndarray | None = None, capacity: np.ndarray | None = None
) -> Any:
    """PyEPO's optimisation model of ``problem`` on :func:`pyepo_backend`."""
    import pyepo

    backend = pyepo_backend()
    if problem == "sp":
        model = _quiet(pyepo.model.shortestPathModel, GRID, backend=backend)
    elif problem == "ks":
        model = _quiet(pyepo.model.knapsackModel, weights, capacity, backend=backend)
    else:
        raise ValueError(f"problem: expected one of {PROBLEMS}, got {problem!r}.")
    return model


def instance_from(
    train: Any,
    x_test: Any,
    c_test: Any,
    *,
    problem: str,
    deg: int,
    seed: int,
    noise: float,
    weights: Any,
    capacity: Any,
    minimize: bool,
) -> Instance:
    """An :class:`Instance` from PyEPO's training ``optDataset`` (features, costs, optimal
    solutions and objectives, as float32) and the test features and costs."""
    f32 = torch.float32
    return Instance(
        problem=problem,
        deg=deg,
        seed=seed,
        noise=noise,
        x_train=train.feats.to(f32),
        c_train=train.costs.to(f32),
        w_train=train.sols.to(f32),
        z_train=train.objs.to(f32).reshape(-1, 1),
        x_test=torch.as_tensor(x_test, dtype=f32),
        c_test=torch.as_tensor(c_test, dtype=f32),
        weights=weights,
        capacity=capacity,
        minimize=minimize,
    )


def make_instance(
    problem: str,
    deg: int,
    seed: int,
    *,
    num_train: int = 1000,
    num_test: int = 1000,
    noise: float = 0.5,
) -> tuple[Instance, Any, Any]:
    """The data set of ``(problem, deg, seed)``, PyEPO's model of the problem and PyEPO's
    training ``optDataset`` (its solution pool seeds PyEPO's NCE)."""
    import pyepo

    n = num_train + num_test
    weights = capacity = None
    if problem == "sp":
        x, c = pyepo.data.shortestpath.genData(
            n, NUM_FEAT, GRID, deg=deg, noise_width=noise, seed=seed
        )
    elif problem == "ks":
        weights, x, c = pyepo.data.knapsack.genData(
            n, NUM_FEAT, KS_ITEMS, dim=KS_DIM, deg=deg, noise_width=noise, seed=seed
        )
        capacity = np.full(KS_DIM, KS_CAPACITY)
    else:
        raise ValueError(f"problem: expected one of {PROBLEMS}, got {problem!r}.")
    model = pyepo_model(problem, weights, capacity)
    train = _quiet(pyepo.data.dataset.optDataset, model, x[:num_train], c[:num_train])
    inst = instance_from(
        train,
        x[num_train:],
        c[num_train:],
        problem=problem,
        deg=deg,
        seed=seed,
        noise=noise,
        weights=weights,
        capacity=capacity,
        minimize=problem == "sp",
    )
    return inst, model, train
