"""The standard synthetic data sets of decision-focused learning, written from their published
definitions (Elmachtoub & Grigas, "Smart predict, then optimize", Management Science 2022,
section 6; Tang & Khalil, "PyEPO", arXiv 2206.14234, section 5), with the same distributions
as PyEPO's generators (checked statistically in ``tests/dfl/test_data.py``; the draws differ:
our own ``numpy.random.default_rng(seed)`` stream, except for ``shortest_path`` and ``knapsack``
with ``stream="pyepo"``, which reproduce PyEPO's ``genData`` exactly, defaults included).

Common structure: features :math:`x_i \\sim N(0, I_p)`, a random matrix :math:`B` with
Bernoulli(1/2) entries fixed for the data set, a polynomial of degree ``deg`` (the
misspecification of a linear model grows with it) and multiplicative noise
:math:`\\varepsilon \\sim U[1 - \\bar\\varepsilon, 1 + \\bar\\varepsilon]` (``noise_width``):

- shortest path: :math:`c_{ij} = \\big[(\\tfrac{1}{\\sqrt p}(Bx_i)_j + 3)^{\\deg} + 1\\big]
  / 3.5^{\\deg} \\cdot \\varepsilon_{ij}` on the arcs of :func:`~dxopt.dfl.graphs.grid_graph`;
- knapsack: values :math:`\\lceil 5 [(\\tfrac{1}{\\sqrt p}(Bx_i)_j + 3)^{\\deg} + 1] / 3.5^{\\deg}
  \\varepsilon_{ij} \\rceil`, weights uniform on :math:`\\{3.00, 3.01, \\dots, 7.99\\}`;
- TSP: Euclidean distances of nodes (half uniform on :math:`[-2, 2]^2`, half :math:`N(0, I_2)`)
  plus :math:`(\\tfrac{1}{\\sqrt p}(B' x_i)_e + 3)^{\\deg} / 3^{\\deg - 1} \\varepsilon_{ie}`,
  :math:`B' = B \\odot U[-2, 2]`, rounded to 4 decimals;
- portfolio (returns, a maximisation): :math:`r_i = (0.05 \\tfrac{1}{\\sqrt p} Bx_i +
  0.1^{1/\\deg})^{\\deg} + L f_i + 0.01\\tau\\,\\epsilon_i`, :math:`L \\sim U[-0.0025\\tau,
  0.0025\\tau]`, covariance :math:`LL^\\top + (0.01\\tau)^2 I`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from dxopt._core import check_int, check_positive

__all__ = ["DFLData", "knapsack", "portfolio", "shortest_path", "tsp"]


@dataclass(frozen=True)
class DFLData:
    """A data set of features and true cost vectors (and what the problem needs).

    Attributes:
        features: ``(N, p)``; costs: ``(N, d)``.
        problem: its name; params: the generator's arguments.
        solutions, objectives: ``(N, d)`` / ``(N,)`` optimal decisions and values, once
            :meth:`with_solutions` filled them (``None`` before).
        weights, capacity: knapsack ``(dim, d)`` and ``(dim,)``; coords: TSP ``(m, 2)``;
            covariance: portfolio ``(d, d)``.
    """

    features: Tensor
    costs: Tensor
    problem: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    solutions: Tensor | None = None
    objectives: Tensor | None = None
    weights: Tensor | None = None
    capacity: Tensor | None = None
    coords: Tensor | None = None
    covariance: Tensor | None = None

    def __len__(self) -> int:
        return int(self.features.shape[0])

    def with_solutions(self, oracle: Any) -> DFLData:
        """A copy with ``solutions = oracle(costs)`` and their ``objectives`` (one batched call)."""
        x = oracle(self.costs)
        return dataclasses.replace(self, solutions=x, objectives=oracle.objective(self.costs, x))

    def subset(self, index: slice | Tensor | np.ndarray) -> DFLData:
        """The samples ``index`` (shared fields such as ``weights`` are kept)."""
        per_sample = ("features", "costs", "solutions", "objectives")
        return dataclasses.replace(
            self,
            **{k: getattr(self, k)[index] for k in per_sample if getattr(self, k) is not None},
        )

    def dataset(self) -> TensorDataset:
        """A ``TensorDataset`` of ``(features, costs, solutions, objectives)`` (PyEPO's
        ``optDataset`` order); needs :meth:`with_solutions` first."""
        if self.solutions is None or self.objectives is None:
            raise ValueError("dataset: call with_solutions(oracle) first to fill the solutions.")
        return TensorDataset(self.features, self.costs, self.solutions, self.objectives)


def _check_common(num_data: int, num_feat: int, deg: int, noise_width: float) -> None:
    check_int("num_data", num_data)
    check_int("num_feat", num_feat)
    check_int("deg", deg)
    check_positive("noise_width", noise_width, allow_zero=True)
    if noise_width > 1:
        raise ValueError(
            f"noise_width: expected a number in [0, 1] (the noise is U[1 - w, 1 + w]), got "
            f"{noise_width}."
        )


def _poly(x: np.ndarray, B: np.ndarray, deg: int) -> np.ndarray:
    """:math:`(\\tfrac{1}{\\sqrt p} x B^\\top + 3)^{\\deg}`."""
    return (x @ B.T / np.sqrt(x.shape[1]) + 3.0) ** deg


def _t(a: np.ndarray, dtype: torch.dtype) -> Tensor:
    return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)


_PYEPO_DEFAULTS: dict[str, Any] = {"noise_width": 0.0, "seed": 135, "dim": 1}
_OWN_DEFAULTS: dict[str, Any] = {"noise_width": 0.5, "seed": 0, "dim": 2}


def _stream(stream: str, **given: Any) -> tuple[Any, dict[str, Any]]:
    """The random stream (``"dxopt"``: ``numpy.random.default_rng(seed)``; ``"pyepo"``: PyEPO's
    ``numpy.random.RandomState(seed)``, drawn in PyEPO's order) and the arguments left ``None``
    filled with that stream's defaults."""
    if stream not in ("dxopt", "pyepo"):
        raise ValueError(f"stream: expected 'dxopt' or 'pyepo', got {stream!r}.")
    defaults = _PYEPO_DEFAULTS if stream == "pyepo" else _OWN_DEFAULTS
    args = {k: defaults[k] if v is None else v for k, v in given.items()}
    seed = args["seed"]
    rng = np.random.RandomState(seed) if stream == "pyepo" else np.random.default_rng(seed)
    return rng, args


def shortest_path(
    num_data: int,
    num_feat: int,
    *,
    grid: tuple[int, int] = (5, 5),
    deg: int = 1,
    noise_width: float | None = None,
    seed: int | None = None,
    stream: str = "dxopt",
    dtype: torch.dtype = torch.float32,
) -> DFLData:
    """Shortest path on the ``grid`` (Elmachtoub & Grigas 2022; PyEPO's ``shortestpath``):
    ``costs`` ``(N, d)`` on the arcs of :func:`~dxopt.dfl.graphs.grid_graph` (``d = 40`` for
    5x5); solve with :class:`~dxopt.dfl.oracles.ShortestPathOracle` ``(grid)``.

    ``stream="pyepo"`` reproduces ``pyepo.data.shortestpath.genData(num_data, num_feat, grid,
    deg, noise_width, seed)`` exactly (PyEPO's ``RandomState`` draws, in its order) with
    PyEPO's defaults ``noise_width=0``, ``seed=135``. The default ``stream="dxopt"`` draws the
    same distributions from ``numpy.random.default_rng(seed)`` (other numbers for the same
    seed) with the defaults ``noise_width=0.5``, ``seed=0``."""
    _check_common(num_data, num_feat, deg, 0.0 if noise_width is None else noise_width)
    rows, cols = check_int("grid[0]", grid[0]), check_int("grid[1]", grid[1])
    d = rows * (cols - 1) + cols * (rows - 1)
    rng, args = _stream(stream, noise_width=noise_width, seed=seed)
    width = args["noise_width"]
    B = rng.binomial(1, 0.5, (d, num_feat))
    x = rng.normal(0.0, 1.0, (num_data, num_feat))
    eps = rng.uniform(1 - width, 1 + width, (num_data, d))
    c = (_poly(x, B, deg) + 1.0) / 3.5**deg * eps
    params = {"grid": (rows, cols), "deg": deg, "noise_width": width, "seed": args["seed"],
              "stream": stream}  # fmt: skip
    return DFLData(_t(x, dtype), _t(c.astype(np.float32) if stream == "pyepo" else c, dtype),
                   "shortest_path", params)  # fmt: skip


def knapsack(
    num_data: int,
    num_feat: int,
    num_items: int,
    *,
    dim: int | None = None,
    capacity: float = 20.0,
    deg: int = 1,
    noise_width: float | None = None,
    seed: int | None = None,
    stream: str = "dxopt",
    dtype: torch.dtype = torch.float32,
) -> DFLData:
    """The ``dim``-dimensional 0/1 knapsack (PyEPO's ``knapsack``; a maximisation): integer
    item values ``costs`` ``(N, num_items)``, ``weights`` ``(dim, num_items)`` shared by the data
    set and ``capacity`` ``(dim,)`` (20 each, as in PyEPO's experiments; PyEPO's generator
    leaves it to the model); solve with :class:`~dxopt.dfl.oracles.KnapsackOracle`
    ``(weights, capacity)``.

    ``stream="pyepo"`` reproduces ``pyepo.data.knapsack.genData(num_data, num_feat,
    num_items, dim, deg, noise_width, seed)`` exactly, with PyEPO's defaults ``dim=1``,
    ``noise_width=0``, ``seed=135``; the default ``stream="dxopt"`` draws the same
    distributions from ``numpy.random.default_rng(seed)`` with ``dim=2``, ``noise_width=0.5``,
    ``seed=0``."""
    _check_common(num_data, num_feat, deg, 0.0 if noise_width is None else noise_width)
    check_int("num_items", num_items)
    check_positive("capacity", capacity)
    rng, args = _stream(stream, noise_width=noise_width, seed=seed, dim=dim)
    dim, width = check_int("dim", args["dim"]), args["noise_width"]
    if stream == "pyepo":
        weights = rng.choice(range(300, 800), size=(dim, num_items)) / 100
    else:
        weights = rng.integers(300, 800, (dim, num_items)) / 100.0
    B = rng.binomial(1, 0.5, (num_items, num_feat))
    x = rng.normal(0.0, 1.0, (num_data, num_feat))
    eps = rng.uniform(1 - width, 1 + width, (num_data, num_items))
    c = np.ceil(5.0 * (_poly(x, B, deg) + 1.0) / 3.5**deg * eps)
    params = {"num_items": num_items, "dim": dim, "deg": deg, "noise_width": width,
              "seed": args["seed"], "stream": stream}  # fmt: skip
    return DFLData(
        _t(x, dtype), _t(c, dtype), "knapsack", params,
        weights=_t(weights, torch.float64), capacity=torch.full((dim,), float(capacity)),
    )  # fmt: skip


def tsp(
    num_data: int,
    num_feat: int,
    num_nodes: int,
    *,
    deg: int = 1,
    noise_width: float = 0.5,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> DFLData:
    """The symmetric TSP (PyEPO's ``tsp``): ``costs`` ``(N, m(m-1)/2)`` on the pairs ``i < j``
    in lexicographic order, ``coords`` ``(m, 2)``; solve with
    :class:`~dxopt.dfl.oracles.TSPOracle` ``(num_nodes)``."""
    _check_common(num_data, num_feat, deg, noise_width)
    m = check_int("num_nodes", num_nodes, minimum=3)
    rng = np.random.default_rng(seed)
    coords = np.concatenate([rng.uniform(-2, 2, (m // 2, 2)), rng.standard_normal((m - m // 2, 2))])
    i, j = np.triu_indices(m, k=1)
    dist = np.linalg.norm(coords[i] - coords[j], axis=1)
    E = dist.shape[0]
    B = rng.binomial(1, 0.5, (E, num_feat)) * rng.uniform(-2, 2, (E, num_feat))
    x = rng.standard_normal((num_data, num_feat))
    eps = rng.uniform(1 - noise_width, 1 + noise_width, (num_data, E))
    c = np.around(dist + _poly(x, B, deg) / 3.0 ** (deg - 1) * eps, decimals=4)
    params = {"num_nodes": m, "deg": deg, "noise_width": noise_width, "seed": seed}
    return DFLData(_t(x, dtype), _t(c, dtype), "tsp", params, coords=_t(coords, torch.float64))


def portfolio(
    num_data: int,
    num_feat: int,
    num_assets: int,
    *,
    deg: int = 1,
    noise_level: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> DFLData:
    """Portfolio returns with a factor model (PyEPO's ``portfolio``; a maximisation of the
    return under a risk bound, a second-order cone program, not an LP: solve it with
    :class:`dxopt.dfl.PortfolioOracle`): ``costs`` are
    the returns ``(N, num_assets)``, ``covariance`` ``(num_assets, num_assets)``."""
    _check_common(num_data, num_feat, deg, 0.0)
    m = check_int("num_assets", num_assets)
    tau = check_positive("noise_level", noise_level, allow_zero=True)
    rng = np.random.default_rng(seed)
    B = rng.binomial(1, 0.5, (m, num_feat))
    L = rng.uniform(-2.5e-3 * tau, 2.5e-3 * tau, (m, num_feat))
    x = rng.standard_normal((num_data, num_feat))
    r = (0.05 * x @ B.T / np.sqrt(num_feat) + 0.1 ** (1.0 / deg)) ** deg
    f = rng.standard_normal((num_data, num_feat))
    e = rng.standard_normal((num_data, m))
    r = r + f @ L.T + 0.01 * tau * e
    cov = L @ L.T + (0.01 * tau) ** 2 * np.eye(m)
    params = {"num_assets": m, "deg": deg, "noise_level": tau, "seed": seed}
    return DFLData(
        _t(x, dtype), _t(r, dtype), "portfolio", params, covariance=_t(cov, torch.float64)
    )
