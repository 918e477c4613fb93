"""Graph helpers for linear programs on networks: grid graphs, node-arc incidence matrices and
flow-conservation constraints, so nobody writes incidence matrices by hand.

A path from ``source`` to ``sink`` in a directed graph with arcs :math:`(u_k, v_k)` is a 0/1
flow :math:`x` with :math:`N x = b`, where :math:`N` is the node-arc incidence matrix
(:math:`N_{v k} = 1` if arc :math:`k` enters :math:`v`, :math:`-1` if it leaves :math:`v`) and
:math:`b = e_{\\text{sink}} - e_{\\text{source}}`. On a directed acyclic graph the polytope
:math:`\\{x : Nx = b,\\ 0 \\le x \\le 1\\}` has integral vertices (:math:`N` is totally
unimodular), so the LP :math:`\\min_x c^\\top x` over it is the shortest-path problem for any
sign of :math:`c` (Ahuja, Magnanti & Orlin, *Network Flows*, 1993, ch. 4).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import connected_components
from torch import Tensor

from dxopt._core import check_choice, check_int

__all__ = ["flow_conservation", "grid_graph", "incidence_matrix"]


def grid_graph(rows: int, cols: int) -> np.ndarray:
    """The arcs of the ``rows x cols`` grid DAG whose moves go right or down.

    Node ``(i, j)`` is numbered ``i * cols + j``; the source is node 0 (top left) and the sink
    node ``rows * cols - 1`` (bottom right). Arcs are listed row by row: the row's right moves
    ``(v, v + 1)``, then its down moves ``(v, v + cols)``; this is the edge order of PyEPO's
    shortest-path model (Tang & Khalil, arXiv 2206.14234), so cost vectors carry over.

    Returns:
        ``(num_arcs, 2)`` int64 array of ``(tail, head)``, ``num_arcs =
        rows (cols - 1) + cols (rows - 1)``.
    """
    rows = check_int("rows", rows)
    cols = check_int("cols", cols)
    arcs: list[tuple[int, int]] = []
    for i in range(rows):
        arcs.extend((i * cols + j, i * cols + j + 1) for j in range(cols - 1))
        if i < rows - 1:
            arcs.extend((i * cols + j, (i + 1) * cols + j) for j in range(cols))
    return np.asarray(arcs, dtype=np.int64).reshape(-1, 2)


def _check_edges(num_nodes: int, edges: np.ndarray | Tensor | list) -> np.ndarray:
    e = np.asarray(edges.cpu() if isinstance(edges, Tensor) else edges)
    if e.ndim != 2 or e.shape[1] != 2 or (e.size and not np.issubdtype(e.dtype, np.integer)):
        raise ValueError(
            f"edges: expected an (num_arcs, 2) integer array of (tail, head), got shape "
            f"{e.shape} and dtype {e.dtype}; build it with grid_graph() or np.array(..., int)."
        )
    if e.size and (e.min() < 0 or e.max() >= num_nodes):
        raise ValueError(
            f"edges: node numbers must lie in [0, {num_nodes}), got [{e.min()}, {e.max()}]; "
            "pass the right num_nodes."
        )
    return e.astype(np.int64, copy=False)


def incidence_matrix(
    num_nodes: int,
    edges: np.ndarray | Tensor | list,
    *,
    layout: str = "scipy",
    dtype: torch.dtype = torch.float64,
) -> sp.csr_matrix | Tensor:
    """The node-arc incidence matrix :math:`N` (``num_nodes x num_arcs``): column ``k`` has
    ``-1`` at the tail of arc ``k`` and ``+1`` at its head.

    Args:
        num_nodes: the number of nodes.
        edges: ``(num_arcs, 2)`` integer ``(tail, head)`` pairs.
        layout: ``"scipy"`` (a ``scipy.sparse.csr_matrix``), ``"torch"`` (a dense tensor) or
            ``"torch_sparse"`` (a torch sparse COO tensor).
        dtype: the torch dtype of the torch layouts.
    """
    num_nodes = check_int("num_nodes", num_nodes)
    check_choice("layout", layout, ("scipy", "torch", "torch_sparse"))
    e = _check_edges(num_nodes, edges)
    m = e.shape[0]
    rows = np.concatenate([e[:, 0], e[:, 1]])
    cols = np.concatenate([np.arange(m), np.arange(m)])
    vals = np.concatenate([-np.ones(m), np.ones(m)])
    mat = sp.csr_matrix((vals, (rows, cols)), shape=(num_nodes, m))
    if layout == "scipy":
        return mat
    if layout == "torch":
        return torch.as_tensor(mat.toarray(), dtype=dtype)
    coo = mat.tocoo()
    index = torch.as_tensor(np.vstack([coo.row, coo.col]), dtype=torch.int64)
    values = torch.as_tensor(coo.data, dtype=dtype)
    return torch.sparse_coo_tensor(index, values, (num_nodes, m), check_invariants=True).coalesce()


def flow_conservation(
    num_nodes: int,
    edges: np.ndarray | Tensor | list,
    source: int,
    sink: int,
    *,
    drop_redundant: bool = True,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, Tensor]:
    """Dense ``(A, b)`` of the unit-flow constraints :math:`A x = b` from ``source`` to
    ``sink``: the rows of :math:`N` (:func:`incidence_matrix`) and of :math:`b =
    e_{\\text{sink}} - e_{\\text{source}}`. Add ``lb = 0, ub = 1`` for the path polytope.

    The rows of :math:`N` over one weakly connected component of the graph sum to zero, so
    :math:`\\operatorname{rank} N = n - k` for :math:`k` components (the columns of a spanning
    forest are independent). With ``drop_redundant=True`` (the default) the row of the
    highest-numbered node of each component is dropped (on :func:`grid_graph` from corner to
    corner, the sink's row; an isolated node's zero row too): the dropped equation is minus
    the sum of its component's other equations, ``b`` included, so it is implied and the
    feasible set is the same, and the returned ``A`` has full row rank, as a QP's KKT backward
    (:class:`~dxopt.dfl.QPTL`) and interior-point solvers want; with the redundant row every
    QPTL problem fails LICQ and takes the slower degenerate backward. ``drop_redundant=False``
    returns all ``num_nodes`` rows (row ``v`` is node ``v``'s equation).

    Raises:
        ValueError: ``drop_redundant=True`` and ``source`` and ``sink`` lie in different
            components (no flow exists, and dropping a row would hide that).
    """
    num_nodes = check_int("num_nodes", num_nodes)
    source = check_int("source", source, minimum=0)
    sink = check_int("sink", sink, minimum=0)
    if source >= num_nodes or sink >= num_nodes or source == sink:
        raise ValueError(
            f"source, sink: expected two different nodes in [0, {num_nodes}), got {source} and "
            f"{sink}."
        )
    if not isinstance(drop_redundant, bool):
        raise TypeError(f"drop_redundant: expected a bool, got {type(drop_redundant).__name__}.")
    A = cast(Tensor, incidence_matrix(num_nodes, edges, layout="torch", dtype=dtype))
    b = torch.zeros(num_nodes, dtype=dtype)
    b[source] = -1.0
    b[sink] = 1.0
    if not drop_redundant:
        return A, b
    e = _check_edges(num_nodes, edges)
    adjacency = sp.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(num_nodes,) * 2)
    count, labels = connected_components(adjacency, directed=False)
    if labels[source] != labels[sink]:
        raise ValueError(
            f"source, sink: nodes {source} and {sink} are not connected (even ignoring arc "
            "directions), so no flow exists; check the edges, or pass drop_redundant=False for "
            "the full (infeasible) system."
        )
    last = np.full(count, -1, dtype=np.int64)
    np.maximum.at(last, labels, np.arange(num_nodes))
    keep = np.ones(num_nodes, dtype=bool)
    keep[last] = False
    index = torch.as_tensor(np.flatnonzero(keep))
    return A[index], b[index]
