"""Solution oracles :math:`x(c) \\in \\arg\\min_{x \\in S} c^\\top x` (or ``argmax`` with
``sense="max"``) for decision-focused learning, all batched.

Every oracle takes ``c`` of shape ``(d,)`` or ``(B, d)`` (any float dtype and device; solved in
float64 on the CPU) and returns the solutions with the same shape, dtype and device, without
gradient (the contract: :mod:`dxopt.dfl.oracle_base`). It records what it cost in
:attr:`~OracleBase.cost` (a :class:`dxopt.Cost`:
``forwards`` counts the cost vectors solved, ``seconds`` the time spent solving).

- :class:`LPOracle` (in :mod:`dxopt.dfl.lp`): a linear program
  :math:`\\{Ax = b, Gx \\le h, lb \\le x \\le ub\\}`, solved by HiGHS' simplex (hot-started
  from the previous basis: vertex solutions) or by any :mod:`qpsolvers` backend, its answers
  certified as :mod:`dxopt.qp`'s.
- :class:`ShortestPathOracle`: shortest paths on a DAG (by default PyEPO's grid) by dynamic
  programming, exact and far cheaper than an LP solve.
- :class:`KnapsackOracle`: the 0/1 multi-dimensional knapsack by branch and bound (exact;
  optional node / time limits).
- :class:`TSPOracle`: the travelling salesman problem by Held-Karp (exact; the default up to
  12 nodes) or nearest neighbour + 2-opt (a heuristic, its answers marked uncertified).
- :class:`CallableOracle`: any user function ``solve(c) -> x``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

import dxopt.dfl._kernels as _kernels
from dxopt._core import (
    Status,
    check_choice,
    check_int,
    check_on_failure,
    check_positive,
    check_tensor,
    handle_failure,
)
from dxopt.dfl._checks import as_array
from dxopt.dfl.graphs import _check_edges, grid_graph
from dxopt.dfl.lp import LPOracle
from dxopt.dfl.oracle_base import Oracle, OracleBase, OracleError, Sense

__all__ = [
    "CallableOracle",
    "KnapsackOracle",
    "LPOracle",
    "Oracle",
    "OracleBase",
    "OracleError",
    "ShortestPathOracle",
    "TSPOracle",
]


def _topological_order(num_nodes: int, edges: np.ndarray) -> np.ndarray:
    """Kahn's algorithm; a ``ValueError`` when the graph has a cycle."""
    indeg = np.bincount(edges[:, 1], minlength=num_nodes)
    out_lists: list[list[int]] = [[] for _ in range(num_nodes)]
    for u, v in edges:
        out_lists[int(u)].append(int(v))
    stack = [v for v in range(num_nodes) if indeg[v] == 0]
    order: list[int] = []
    while stack:
        u = stack.pop()
        order.append(u)
        for v in out_lists[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                stack.append(v)
    if len(order) != num_nodes:
        raise ValueError(
            "edges: the graph has a directed cycle; ShortestPathOracle needs a DAG (use "
            "LPOracle with flow_conservation for general graphs with non-negative costs)."
        )
    return np.asarray(order, dtype=np.int64)


class ShortestPathOracle(OracleBase):
    """Shortest ``source -> sink`` paths on a DAG by dynamic programming (Bellman 1958), exact
    for costs of any sign, batched in one compiled call (:func:`_kernels.dag_shortest_paths`).

    By default the PyEPO grid: ``grid=(rows, cols)`` with moves right/down, arcs ordered by
    :func:`~dxopt.dfl.graphs.grid_graph`, source the top-left node, sink the bottom-right one.
    Or a general DAG with ``edges``, ``num_nodes``, ``source`` and ``sink``. The same problem as
    the LP over :func:`~dxopt.dfl.graphs.flow_conservation` with ``0 <= x <= 1``
    (:meth:`as_lp`), at a fraction of the cost. Ties go to the first arc met.
    """

    def __init__(
        self,
        grid: tuple[int, int] | None = (5, 5),
        *,
        edges: Any = None,
        num_nodes: int | None = None,
        source: int = 0,
        sink: int | None = None,
    ) -> None:
        if edges is None:
            if grid is None or len(grid) != 2:
                raise ValueError(f"grid: expected (rows, cols), got {grid!r}.")
            rows, cols = check_int("grid[0]", grid[0]), check_int("grid[1]", grid[1])
            edges_arr = grid_graph(rows, cols)
            num_nodes = rows * cols
            sink = num_nodes - 1 if sink is None else sink
        else:
            if num_nodes is None or sink is None:
                raise ValueError("edges: give num_nodes and sink with a general DAG.")
            num_nodes = check_int("num_nodes", num_nodes)
            edges_arr = _check_edges(num_nodes, edges)
        self.grid = grid if edges is None else None
        super().__init__(dim=edges_arr.shape[0])
        self.edges, self.num_nodes = edges_arr, num_nodes
        self.source = check_int("source", source, minimum=0)
        self.sink = check_int("sink", sink, minimum=0)
        self._order = _topological_order(num_nodes, edges_arr)
        by_head = np.argsort(edges_arr[:, 1], kind="stable")
        self._in_arc = by_head.astype(np.int64)
        counts = np.bincount(edges_arr[:, 1], minlength=num_nodes)
        self._in_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._tails = np.ascontiguousarray(edges_arr[:, 0])

    def _solve(self, c: np.ndarray) -> np.ndarray:
        x = np.zeros_like(c)
        failed = _kernels.dag_shortest_paths(
            c, self._order, self._in_ptr, self._in_arc, self._tails, self.source, self.sink, x
        )
        if failed:
            raise OracleError(f"ShortestPathOracle: the sink {self.sink} is unreachable.")
        return x

    def as_lp(self, *, solver: str = "auto") -> LPOracle:
        """The same problem as an :class:`LPOracle` (flow conservation, ``0 <= x <= 1``)."""
        from dxopt.dfl.graphs import flow_conservation

        A, b = flow_conservation(self.num_nodes, self.edges, self.source, self.sink)
        d = self.dim
        return LPOracle(A=A, b=b, lb=np.zeros(d), ub=np.ones(d), solver=solver)


class KnapsackOracle(OracleBase):
    """The 0/1 multi-dimensional knapsack :math:`\\max_x c^\\top x` s.t. :math:`Wx \\le C`,
    :math:`x \\in \\{0, 1\\}^m` (PyEPO's convention: ``c`` are item values, ``sense="max"``;
    with ``sense="min"`` it minimizes :math:`c^\\top x`, i.e. maximizes the values ``-c``).

    Exact, for any non-negative weights (integer or not), by depth-first branch and bound with
    the smallest single-constraint fractional bound (:func:`_kernels.knapsack_branch_and_bound`);
    its worst case is exponential in the number of items (a 2 x 50 knapsack with values
    correlated to the weights can take minutes), so ``node_limit`` / ``time_limit`` stop each
    sample's search with its incumbent, reported as ``Status.BUDGET_EXHAUSTED`` in
    :attr:`last_status` (``Status.SOLVED``: proven optimal) and handled by ``on_failure``.

    Args:
        weights: ``(dim, m)`` or ``(m,)`` non-negative item weights.
        capacity: ``(dim,)`` positive capacities (or a number for every dimension).
        node_limit: nodes per sample (``None``: no limit); time_limit: seconds per sample
            (``None``: none; the clock is read every 1024 nodes).
        on_failure: for samples stopped by a limit: ``"warn"`` (default; the incumbent, with a
            :class:`dxopt.DxoptWarning`), ``"raise"``, ``"ignore"`` or ``"nan"`` (NaN rows).

    :attr:`last_bound` holds, per sample of the last call, an upper bound on the optimal value
    (the root's fractional bound; the optimum itself when solved).
    """

    def __init__(
        self,
        weights: Any,
        capacity: Any,
        *,
        sense: Sense = "max",
        node_limit: int | None = None,
        time_limit: float | None = None,
        on_failure: str = "warn",
    ) -> None:
        W = as_array("weights", weights)
        if W.ndim == 1:
            W = W[None]
        if W.ndim != 2 or W.shape[1] == 0:
            raise ValueError(f"weights: expected a (dim, num_items) matrix, got shape {W.shape}.")
        if not np.isfinite(W).all() or (W < 0).any():
            raise ValueError("weights: expected finite non-negative weights, got negative/NaN.")
        cap = as_array("capacity", capacity)
        if cap.ndim == 0:
            cap = np.full(W.shape[0], float(cap))
        if cap.shape != (W.shape[0],):
            raise ValueError(
                f"capacity: expected a number or one capacity per weight row, shape "
                f"({W.shape[0]},) for weights of shape {W.shape} (dim, num_items), got shape "
                f"{cap.shape}; pass weights as (dim, num_items)."
            )
        if not np.isfinite(cap).all() or (cap <= 0).any():
            raise ValueError(f"capacity: expected positive finite capacities, got {cap}.")
        super().__init__(dim=W.shape[1], sense=sense)
        self.weights, self.capacity = np.ascontiguousarray(W), cap.copy()
        self.node_limit = None if node_limit is None else check_int("node_limit", node_limit)
        self.time_limit = None if time_limit is None else check_positive("time_limit", time_limit)
        self.on_failure = check_on_failure(on_failure, ("raise", "warn", "ignore", "nan"))
        self.exact = node_limit is None and time_limit is None
        self.last_bound = np.zeros(0)

    def _solve(self, c: np.ndarray) -> np.ndarray:
        B = c.shape[0]
        x = np.zeros_like(c)
        values = np.ascontiguousarray(c if self.sense == "max" else -c)
        code, bound, nodes = np.zeros(B, np.int64), np.zeros(B), np.zeros(B, np.int64)
        _kernels.knapsack_branch_and_bound(
            values, self.weights, self.capacity, x, self.node_limit or 0,
            float(self.time_limit or 0.0), code, bound, nodes,
        )  # fmt: skip
        self.last_bound = bound if self.sense == "max" else -bound
        stopped = np.flatnonzero(code)
        # None: every sample proven optimal (the base records Status.SOLVED for each)
        self._status = (
            tuple(Status.SOLVED if k == 0 else Status.BUDGET_EXHAUSTED for k in code)
            if stopped.size
            else None
        )
        if stopped.size:
            why = "node_limit" if code[stopped[0]] == 1 else "time_limit"
            if self.on_failure == "nan":
                x[stopped] = np.nan
            else:
                handle_failure(
                    self.on_failure,
                    f"KnapsackOracle: {stopped.size} of {B} samples stopped at {why} (first: "
                    f"sample {stopped[0]}) with their incumbent, not a proven optimum; raise "
                    "node_limit / time_limit, or use MILPOracle (HiGHS) for hard instances.",
                    error=OracleError,
                    status=Status.BUDGET_EXHAUSTED,
                    stacklevel=4,
                )
        return x


class TSPOracle(OracleBase):
    """The symmetric travelling salesman problem on ``num_nodes`` nodes; ``c`` holds the edge
    costs of the pairs ``i < j`` in lexicographic order (``(0,1), (0,2), ..., (1,2), ...``, the
    order of :func:`scipy.spatial.distance.pdist` and of PyEPO's TSP data) and ``x`` the 0/1
    edges of the tour.

    ``method="exact"`` is the Held-Karp dynamic program, :math:`O(2^m m^2)` time and
    :math:`O(2^m m)` memory, allowed up to 16 nodes; ``method="heuristic"`` is **a heuristic**:
    the best of ``starts`` nearest-neighbour tours, each improved by 2-opt, a valid tour
    without an optimality guarantee (on 8 nodes, 3-53% of its tours are suboptimal, by up to
    9%). ``method="auto"`` (default) is exact up to :attr:`EXACT_AUTO_MAX` = 12 nodes (about
    a millisecond a tour) and the heuristic beyond. :attr:`last_status` marks each answer:
    ``Status.SOLVED`` (Held-Karp, certified) or ``Status.INACCURATE`` (the heuristic's,
    uncertified), and the regrets of :mod:`dxopt.dfl.metrics` refuse uncertified answers.
    """

    #: the largest ``num_nodes`` solved exactly under ``method="auto"``.
    EXACT_AUTO_MAX = 12

    def __init__(
        self, num_nodes: int, *, method: str = "auto", starts: int = 10, max_iter: int = 100
    ) -> None:
        self.num_nodes = check_int("num_nodes", num_nodes, minimum=3)
        method = check_choice("method", method, ("auto", "heuristic", "exact"))
        if method == "auto":
            method = "exact" if num_nodes <= self.EXACT_AUTO_MAX else "heuristic"
        self.method = method
        if method == "exact" and num_nodes > 16:
            raise ValueError(
                f"num_nodes: method='exact' takes at most 16 nodes, got {num_nodes}; use "
                "method='heuristic' (uncertified tours)."
            )
        self.starts = check_int("starts", starts)
        self.max_iter = check_int("max_iter", max_iter)
        super().__init__(dim=num_nodes * (num_nodes - 1) // 2)
        self.exact = method == "exact"

    @staticmethod
    def edge_costs(*, coords: Tensor | None = None, distances: Tensor | None = None) -> Tensor:
        """The edge-cost vector ``(m(m-1)/2,)`` (the pairs ``i < j`` in this oracle's order)
        from node ``coords`` ``(m, k)`` (Euclidean distances) or a symmetric ``distances``
        matrix ``(m, m)``; give exactly one."""
        if (coords is None) == (distances is None):
            raise ValueError("coords, distances: give exactly one of them.")
        if coords is not None:
            check_tensor("coords", coords, ndim=2, floating=True)
            D = torch.cdist(coords, coords)
        else:
            D = check_tensor("distances", distances, ndim=2, floating=True)
            if D.shape[0] != D.shape[1] or not torch.allclose(D, D.T):
                raise ValueError(
                    f"distances: expected a symmetric (m, m) matrix, got shape {tuple(D.shape)}"
                    " (or an asymmetric one); this oracle solves the symmetric TSP."
                )
        i, j = torch.triu_indices(D.shape[0], D.shape[0], offset=1)
        return D[i, j]

    def _solve(self, c: np.ndarray) -> np.ndarray:
        x = np.zeros_like(c)
        if self.method == "exact":
            _kernels.tsp_held_karp(c, self.num_nodes, x)
        else:
            _kernels.tsp_heuristic(c, self.num_nodes, self.starts, self.max_iter, x)
            self._status = (Status.INACCURATE,) * c.shape[0]
        return x


class CallableOracle(OracleBase):
    """Any solver ``fn(c) -> x`` as an oracle.

    Args:
        fn: called with a float64 CPU tensor, ``(d,)`` per cost vector (a Python loop), or the
            whole ``(B, d)`` batch with ``batched=True``; returns array-likes of the same shape.
        dim: the dimension ``d``.
        sense: ``"min"`` (default) or ``"max"``: what ``fn`` does. A wrong sense makes SPO+
            losses and regrets negative, impossible with an exact solver, so
            :class:`~dxopt.dfl.SPOPlus` and :func:`~dxopt.dfl.regret` raise a ``ValueError``
            naming ``sense`` when they see one.
        exact: whether ``fn`` returns optima (default ``True``); ``False`` marks every answer
            uncertified (``Status.INACCURATE``), so regrets refuse them and the sign checks
            above are skipped.
    """

    def __init__(
        self,
        fn: Any,
        *,
        dim: int,
        sense: Sense = "min",
        batched: bool = False,
        exact: bool = True,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable solve(c) -> x, got {type(fn).__name__}.")
        super().__init__(dim=dim, sense=sense)
        self.fn, self.batched, self.exact = fn, batched, bool(exact)

    def _solve(self, c: np.ndarray) -> np.ndarray:
        ct = torch.from_numpy(c)
        if self.batched:
            x = np.asarray(self.fn(ct), dtype=float)
        else:
            x = np.stack([np.asarray(self.fn(row), dtype=float) for row in ct])
        if x.shape != c.shape:
            raise ValueError(f"fn: returned shape {x.shape} for costs of shape {c.shape}.")
        if not self.exact:
            self._status = (Status.INACCURATE,) * c.shape[0]
        return x
