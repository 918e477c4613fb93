"""The real tasks of the JAIR decision-focused learning benchmark (Mandi, Kotary, Berden,
Mulamba, Bucarey, Guns & Fioretto, "Decision-focused learning: foundations, state of the art,
benchmark and future opportunities", JAIR 80 (2024) 1623-1701), on the data shipped in
``dxopt/dfl/jair_data`` (the benchmark repository's files, MIT licence: ``LICENSE`` there).

Data: Irish day-ahead electricity prices of the ICON energy challenge (2011-2013), 789 days of
48 half-hour slots, 8 features per slot (calendar fields and forecasts). Protocol (the
benchmark's): drop the day-id column, standardise the features with the mean and standard
deviation (``ddof=0``) of the first file's rows, reshape to ``(days, 48, 8)`` and
``(days, 48)``, concatenate the two files, shuffle the days by
``numpy.random.RandomState(seed).permutation`` (what ``sklearn.utils.shuffle(...,
random_state=seed)`` draws), then 550 train / 100 validation / 139 test days.

- :func:`jair_knapsack`: choose slots (items) of value = price and weight ``weights`` under
  one capacity (60, 120 or 180), a maximisation, solved by
  :class:`~dxopt.dfl.KnapsackOracle`.
- :func:`jair_scheduling`: energy-cost-aware scheduling (instances 1-3: 10, 15, 20 tasks),
  the MILP of Simonis et al.'s ICON challenge as the benchmark states it, solved by
  :class:`~dxopt.dfl.MILPOracle`: binary :math:`x_{fmt} = 1` when task :math:`f` starts at
  slot :math:`t` on machine :math:`m`, for :math:`E_f \\le t \\le L_f - D_f` only;
  :math:`\\sum_{m,t} x_{fmt} = 1`; for every machine, slot :math:`s` and resource :math:`r`,
  :math:`\\sum_f u_{fr} \\sum_{t \\in (s - D_f, s]} x_{fmt} \\le C_{mr}`; cost of
  :math:`x_{fmt}`: :math:`P_f \\sum_{s=t}^{t + D_f - 1} \\pi_s` for slot prices :math:`\\pi`.
  The costs are linear in the prices, :math:`c = T\\pi` (:attr:`JAIRTask.cost_map`), so a
  model predicting prices is trained through :meth:`JAIRTask.costs_from_prices`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt._core import check_choice, check_int
from dxopt.dfl.data import DFLData
from dxopt.dfl.milp import MILPOracle
from dxopt.dfl.oracles import KnapsackOracle

__all__ = ["JAIRTask", "jair_knapsack", "jair_prices", "jair_scheduling", "read_energy_instance"]

SLOTS = 48
SPLIT = (550, 100, 139)


def _file(name: str) -> Any:
    return resources.files("dxopt.dfl").joinpath("jair_data", name)


def jair_prices(
    *, seed: int = 0, standardize: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The benchmark's shuffled days: features ``(789, 48, 8)``, prices ``(789, 48)`` (float64)
    and the knapsack ``weights`` ``(48,)``; the first 550 days train, the next 100 validate,
    the last 139 test."""
    seed = check_int("seed", seed, minimum=0)
    with _file("icon_prices.npz").open("rb") as fh, np.load(fh) as data:
        x_train, x_test = data["X_1gtrain"][:, 1:], data["X_1gtest"][:, 1:]
        y_train, y_test, weights = data["y_train"], data["y_test"], data["weights"]
    if standardize:
        mean, std = x_train.mean(0), x_train.std(0)
        std = np.where(std > 0, std, 1.0)  # a constant column stays as is (centred)
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    p = x_train.shape[1]
    x = np.concatenate([x_train.reshape(-1, SLOTS, p), x_test.reshape(-1, SLOTS, p)])
    y = np.concatenate([y_train.reshape(-1, SLOTS), y_test.reshape(-1, SLOTS)])
    order = np.random.RandomState(seed).permutation(x.shape[0])
    return x[order], y[order], np.asarray(weights, dtype=float)


@dataclass(frozen=True)
class JAIRTask:
    """One task of the benchmark with its split and oracle.

    Attributes:
        name: ``"knapsack"`` or ``"scheduling"``; oracle: the exact oracle of the task.
        train, valid, test: :class:`~dxopt.dfl.DFLData` with ``features`` ``(days, 48, 8)``
            and ``costs`` in the oracle's space (the prices for the knapsack, :math:`T\\pi`
            for scheduling); :meth:`with_solutions` fills their optima.
        prices: the slot prices ``{"train": (550, 48), "valid": ..., "test": ...}``.
        cost_map: ``(d, 48)`` float64 :math:`T` with ``costs = prices @ T.T`` (the identity
            for the knapsack; :meth:`costs_from_prices` keeps it per dtype and device from
            its first use, so change it through ``dataclasses.replace``, not in place).
        params: the loader's arguments.
    """

    name: str
    oracle: Any
    train: DFLData
    valid: DFLData
    test: DFLData
    prices: dict[str, Tensor]
    cost_map: Tensor
    params: dict[str, Any] = field(default_factory=dict)
    # the transposed cost map per (dtype, device), None where it is the identity
    _maps: dict[Any, Tensor | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def costs_from_prices(self, prices: Tensor) -> Tensor:
        """The oracle's cost vectors ``(..., d)`` of slot prices ``(..., 48)``
        (differentiable: a model predicting prices is trained through it). An identity map
        (the knapsack) returns ``prices`` itself, which equals ``prices @ I`` exactly."""
        if prices.shape[-1] != SLOTS:
            raise ValueError(f"prices: expected (..., {SLOTS}) slot prices, got {prices.shape}.")
        key = (prices.dtype, prices.device)
        if key not in self._maps:
            T = self.cost_map
            eye = T.shape == (SLOTS, SLOTS) and torch.equal(T, torch.eye(SLOTS, dtype=T.dtype))
            self._maps[key] = None if eye else T.to(prices.device, prices.dtype).T
        mapped = self._maps[key]
        return prices if mapped is None else prices @ mapped

    def with_solutions(self) -> JAIRTask:
        """A copy whose three splits carry the oracle's optimal solutions and objectives."""
        return dataclasses.replace(
            self, **{k: getattr(self, k).with_solutions(self.oracle) for k in _SPLITS}
        )


_SPLITS = ("train", "valid", "test")


def _split(
    name: str, oracle: Any, x: np.ndarray, y: np.ndarray, cost_map: np.ndarray, dtype: Any,
    params: dict[str, Any],
) -> JAIRTask:  # fmt: skip
    bounds = np.cumsum((0, *SPLIT))
    T = torch.as_tensor(cost_map, dtype=torch.float64)
    parts, prices = {}, {}
    for k, lo, hi in zip(_SPLITS, bounds[:-1], bounds[1:], strict=True):
        pi = torch.as_tensor(y[lo:hi])
        prices[k] = pi.to(dtype)
        costs = pi if name == "knapsack" else pi @ T.T
        parts[k] = DFLData(
            torch.as_tensor(x[lo:hi], dtype=dtype), costs.to(dtype), f"jair_{name}", params
        )
    return JAIRTask(name, oracle, cost_map=T, prices=prices, params=params, **parts)


def jair_knapsack(
    capacity: int = 60, *, seed: int = 0, standardize: bool = True, dtype: Any = torch.float32
) -> JAIRTask:
    """The benchmark's knapsack: 48 items (slots) of value = price and weight ``weights``
    (integers 3-8), one ``capacity`` (60, 120 or 180 in the benchmark; any positive number
    here), maximised by :class:`~dxopt.dfl.KnapsackOracle`; the split of :func:`jair_prices`
    under ``seed``."""
    if np.ndim(capacity) != 0 or not float(capacity) > 0:
        raise ValueError(
            f"capacity: expected one positive capacity (60, 120, 180), got {capacity!r}."
        )
    x, y, weights = jair_prices(seed=seed, standardize=standardize)
    oracle = KnapsackOracle(weights[None], float(capacity))
    params = {"capacity": capacity, "seed": seed, "standardize": standardize}
    return _split("knapsack", oracle, x, y, np.eye(SLOTS), dtype, params)


@dataclass(frozen=True)
class EnergyInstance:
    """An energy-cost-aware scheduling instance (the ICON format; see the module).

    Attributes: ``slots`` (48), ``capacity`` ``(machines, resources)``, ``duration``,
    ``earliest``, ``latest`` (``(tasks,)`` ints), ``power`` ``(tasks,)``, ``use``
    ``(tasks, resources)``."""

    slots: int
    capacity: np.ndarray
    duration: np.ndarray
    earliest: np.ndarray
    latest: np.ndarray
    power: np.ndarray
    use: np.ndarray


def read_energy_instance(text: str) -> EnergyInstance:
    """Parse an instance file's text (``q``; resources; machines with their capacities; tasks
    ``f D E L P`` with their resource use)."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    q, resources_, machines = int(lines[0][0]), int(lines[1][0]), int(lines[2][0])
    row = 3
    capacity = np.zeros((machines, resources_))
    for m in range(machines):
        capacity[m] = [float(v) for v in lines[row + 1][:resources_]]
        row += 2
    tasks = int(lines[row][0])
    row += 1
    dur, early, late = (np.zeros(tasks, dtype=np.int64) for _ in range(3))
    power, use = np.zeros(tasks), np.zeros((tasks, resources_))
    for f in range(tasks):
        _, d, e, l_, p = lines[row]
        dur[f], early[f], late[f], power[f] = int(d), int(e), int(l_), float(p)
        use[f] = [float(v) for v in lines[row + 1][:resources_]]
        row += 2
    if 1440 % q or 1440 // q != SLOTS:
        raise ValueError(f"q: expected 30-minute slots (q = 30, {SLOTS} a day), got q = {q}.")
    return EnergyInstance(SLOTS, capacity, dur, early, late, power, use)


def scheduling_model(inst: EnergyInstance) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The MILP of an instance as :class:`~dxopt.dfl.MILPOracle` arguments, the cost map
    ``T`` ``(d, 48)`` and the variables' ``(task, machine, start)`` triples ``(d, 3)``."""
    import scipy.sparse as sp

    machines, resources_ = inst.capacity.shape
    triples = [
        (f, m, t)
        for f in range(inst.duration.shape[0])
        for m in range(machines)
        for t in range(int(inst.earliest[f]), int(inst.latest[f] - inst.duration[f]) + 1)
    ]
    var = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    d, N = var.shape[0], inst.slots
    if not np.isin(np.arange(inst.duration.shape[0]), var[:, 0]).all():
        raise ValueError("instance: a task has no feasible start (latest - duration < earliest).")
    f_, m_, t_ = var.T
    T = np.zeros((d, N))
    rows, cols, vals = [], [], []  # resource rows: (m, s, r) -> m * N * R + s * R + r
    for j in range(d):
        run = np.arange(t_[j], t_[j] + inst.duration[f_[j]])
        T[j, run] = inst.power[f_[j]]
        for s in run:
            for r in range(resources_):
                if inst.use[f_[j], r]:
                    rows.append((m_[j] * N + s) * resources_ + r)
                    cols.append(j)
                    vals.append(inst.use[f_[j], r])
    A_ub = sp.csr_matrix((vals, (rows, cols)), shape=(machines * N * resources_, d))
    b_ub = np.repeat(inst.capacity[:, None, :], N, axis=1).reshape(-1)
    A_eq = sp.csr_matrix((np.ones(d), (f_, np.arange(d))), shape=(inst.duration.shape[0], d))
    kwargs = {"A_ub": A_ub, "b_ub": b_ub, "A_eq": A_eq, "b_eq": np.ones(A_eq.shape[0]),
              "bounds": (0, 1), "integrality": 1}  # fmt: skip
    return kwargs, T, var


def jair_scheduling(
    instance: int = 1,
    *,
    seed: int = 0,
    standardize: bool = True,
    dtype: Any = torch.float32,
    **oracle_options: Any,
) -> JAIRTask:
    """The benchmark's energy-cost-aware scheduling ``instance`` (1, 2, 3: 10, 15, 20 tasks)
    as a :class:`JAIRTask` whose oracle is a :class:`~dxopt.dfl.MILPOracle` (a minimisation;
    ``oracle_options`` go to it, e.g. ``time_limit``); the split of :func:`jair_prices`."""
    check_choice("instance", instance, (1, 2, 3))
    inst = read_energy_instance(_file(f"load{instance}.txt").read_text())
    kwargs, T, var = scheduling_model(inst)
    oracle = MILPOracle(**kwargs, sense="min", **oracle_options)
    x, y, _ = jair_prices(seed=seed, standardize=standardize)
    params = {"instance": instance, "seed": seed, "standardize": standardize,
              "variables": var}  # fmt: skip
    return _split("scheduling", oracle, x, y, T, dtype, params)
