"""Compiled (numba) kernels of the combinatorial oracles: shortest paths on a DAG by dynamic
programming, 0/1 multi-dimensional knapsack by branch and bound, and the TSP heuristic
(nearest neighbour + 2-opt) with an exact Held-Karp DP for small instances.

Each kernel loops over a batch inside one compiled call (no per-sample Python), and writes the
0/1 solutions into a preallocated ``(B, d)`` array. ``cache=True`` stores the compiled code on
disk for later processes.
"""

from __future__ import annotations

import time
from typing import Any

import numba
import numpy as np
from numba import njit

_jit: Any = njit(cache=True, nogil=True)


@_jit
def dag_shortest_paths(
    c: np.ndarray,
    order: np.ndarray,
    in_ptr: np.ndarray,
    in_arc: np.ndarray,
    tails: np.ndarray,
    source: int,
    sink: int,
    x: np.ndarray,
) -> int:
    """Shortest ``source -> sink`` paths for each row of ``c`` (arc costs, any sign) on a DAG
    given by a topological ``order`` and, per node ``v``, its incoming arcs
    ``in_arc[in_ptr[v]:in_ptr[v + 1]]``. Bellman's recursion
    :math:`d(v) = \\min_{(u, v)} d(u) + c_{uv}` in topological order, then backtracking. Writes
    0/1 arc indicators into ``x`` (zeroed by the caller). Returns the number of rows whose sink
    is unreachable (0 when all solved)."""
    num_nodes = order.shape[0]
    dist = np.empty(num_nodes)
    pred = np.empty(num_nodes, dtype=np.int64)
    failed = 0
    for s in range(c.shape[0]):
        dist[:] = np.inf
        pred[:] = -1
        dist[source] = 0.0
        for v in order:
            if v == source:
                continue
            best = np.inf
            arg = -1
            for k in range(in_ptr[v], in_ptr[v + 1]):
                a = in_arc[k]
                d = dist[tails[a]] + c[s, a]
                if d < best:
                    best = d
                    arg = a
            dist[v] = best
            pred[v] = arg
        v = sink
        steps = 0
        while v != source and steps <= num_nodes:
            a = pred[v]
            if a < 0:
                failed += 1
                break
            x[s, a] = 1.0
            v = tails[a]
            steps += 1
    return failed


@_jit
def _fractional_bound(
    values: np.ndarray,
    weights: np.ndarray,
    rem: np.ndarray,
    order: np.ndarray,
    dim_orders: np.ndarray,
    depth: int,
) -> float:
    """Upper bound on the value of items ``order[depth:]`` within the remaining capacities: the
    smallest over the constraints of the single-constraint fractional (LP) knapsack bound
    (Dantzig 1957), each computed greedily in that constraint's value/weight order."""
    bound = np.inf
    for k in range(weights.shape[0]):
        cap = rem[k]
        total = 0.0
        for p in dim_orders[k]:
            if p < depth:
                continue
            item = order[p]
            w = weights[k, item]
            if w <= cap:
                cap -= w
                total += values[item]
            else:
                total += values[item] * cap / w
                break
        bound = min(bound, total)
    return bound


@njit(cache=True)
def _now() -> float:
    with numba.objmode(t="float64"):
        t = time.perf_counter()
    return t


@njit(cache=True)  # no nogil: the time limit reads the clock through object mode
def knapsack_branch_and_bound(
    values: np.ndarray,
    weights: np.ndarray,
    capacity: np.ndarray,
    x: np.ndarray,
    max_nodes: int,
    time_limit: float,
    status: np.ndarray,
    bound: np.ndarray,
    nodes: np.ndarray,
) -> None:
    """Exact 0/1 multi-dimensional knapsack :math:`\\max_x v^\\top x` s.t. :math:`Wx \\le C`,
    :math:`x \\in \\{0,1\\}^m` for each row of ``values`` by depth-first branch and bound
    (items with :math:`v_j \\le 0` or too heavy alone are never taken; the bound is
    :func:`_fractional_bound`; a node is pruned when its bound cannot beat the incumbent).
    Writes 0/1 solutions into ``x`` (zeroed by the caller).

    Per row, the search stops after ``max_nodes`` nodes (``<= 0``: no limit) or ``time_limit``
    seconds (``<= 0``: none; the clock is read every 1024 nodes) with the incumbent (feasible:
    the search starts from the empty set). ``status[s]`` is 0 (optimal), 1 (node limit) or 2
    (time limit); ``bound[s]`` the root's fractional bound (an upper bound on the optimum;
    the optimum itself when ``status[s] == 0``); ``nodes[s]`` the nodes explored."""
    k_dim, m = weights.shape
    tol = 1e-9 * max(1.0, capacity.max())
    scale = np.empty(m)
    for j in range(m):
        s = 0.0
        for k in range(k_dim):
            s += weights[k, j] / capacity[k]
        scale[j] = s
    for s in range(values.shape[0]):
        v = values[s]
        cand = np.empty(m, dtype=np.int64)
        n = 0
        for j in range(m):
            fits = v[j] > 0.0
            for k in range(k_dim):
                if weights[k, j] > capacity[k] + tol:
                    fits = False
            if fits:
                cand[n] = j
                n += 1
        status[s] = 0
        nodes[s] = 0
        bound[s] = 0.0
        if n == 0:
            continue
        cand = cand[:n]
        ratio = np.empty(n)
        for p in range(n):
            j = cand[p]
            ratio[p] = -v[j] / scale[j] if scale[j] > 0.0 else -np.inf
        order = cand[np.argsort(ratio, kind="mergesort")]
        dim_orders = np.empty((k_dim, n), dtype=np.int64)
        for k in range(k_dim):
            rk = np.empty(n)
            for p in range(n):
                w = weights[k, order[p]]
                rk[p] = -v[order[p]] / w if w > 0.0 else -np.inf
            dim_orders[k] = np.argsort(rk, kind="mergesort")
        choice = np.full(n, -1, dtype=np.int64)
        best_choice = np.zeros(n, dtype=np.int64)
        rem = capacity.copy()
        value = 0.0
        best = 0.0
        depth = 0
        bound[s] = _fractional_bound(v, weights, rem, order, dim_orders, 0)
        start = _now() if time_limit > 0.0 else 0.0
        count = 0
        while True:
            count += 1
            if max_nodes > 0 and count > max_nodes:
                status[s] = 1
                break
            if time_limit > 0.0 and count % 1024 == 0 and _now() - start > time_limit:
                status[s] = 2
                break
            backtrack = False
            if depth == n:
                if value > best:
                    best = value
                    for p in range(n):
                        best_choice[p] = 1 if choice[p] == 1 else 0
                backtrack = True
            elif choice[depth] == -1:
                if value + _fractional_bound(v, weights, rem, order, dim_orders, depth) <= best:
                    backtrack = True
                else:
                    item = order[depth]
                    fits = True
                    for k in range(k_dim):
                        if weights[k, item] > rem[k] + tol:
                            fits = False
                    if fits:
                        choice[depth] = 1
                        value += v[item]
                        for k in range(k_dim):
                            rem[k] -= weights[k, item]
                    else:
                        choice[depth] = 0
                    depth += 1
            if backtrack:
                while True:
                    depth -= 1
                    if depth < 0:
                        break
                    if choice[depth] == 1:
                        item = order[depth]
                        choice[depth] = 0
                        value -= v[item]
                        for k in range(k_dim):
                            rem[k] += weights[k, item]
                        depth += 1
                        break
                    choice[depth] = -1
                if depth < 0:
                    break
        nodes[s] = count
        if status[s] == 0:
            bound[s] = best
        for p in range(n):
            if best_choice[p] == 1:
                x[s, order[p]] = 1.0


@_jit
def _tour_length(dist: np.ndarray, tour: np.ndarray) -> float:
    total = 0.0
    m = tour.shape[0]
    for i in range(m):
        total += dist[tour[i], tour[(i + 1) % m]]
    return total


@_jit
def _two_opt(dist: np.ndarray, tour: np.ndarray, max_iter: int) -> None:
    """2-opt local search (Croes 1958): reverse ``tour[i+1 : j+1]`` while that shortens it."""
    m = tour.shape[0]
    for _ in range(max_iter):
        improved = False
        for i in range(m - 2):
            for j in range(i + 2, m if i > 0 else m - 1):
                a, b = tour[i], tour[i + 1]
                c, d = tour[j], tour[(j + 1) % m]
                delta = dist[a, c] + dist[b, d] - dist[a, b] - dist[c, d]
                if delta < -1e-12:
                    tour[i + 1 : j + 1] = tour[i + 1 : j + 1][::-1].copy()
                    improved = True
        if not improved:
            break


@_jit
def _edge_matrix(c_row: np.ndarray, m: int, dist: np.ndarray) -> None:
    e = 0
    for i in range(m):
        dist[i, i] = 0.0
        for j in range(i + 1, m):
            dist[i, j] = c_row[e]
            dist[j, i] = c_row[e]
            e += 1


@_jit
def _write_tour(tour: np.ndarray, m: int, out: np.ndarray) -> None:
    for p in range(m):
        i, j = tour[p], tour[(p + 1) % m]
        if i > j:
            i, j = j, i
        # index of the pair (i, j), i < j, in the order (0,1), (0,2), ..., (1,2), ...
        out[i * m - i * (i + 1) // 2 + (j - i - 1)] = 1.0


@_jit
def tsp_heuristic(c: np.ndarray, m: int, starts: int, max_iter: int, x: np.ndarray) -> None:
    """For each row of edge costs (pairs ``i < j`` in lexicographic order), the best of
    ``starts`` nearest-neighbour tours (Rosenkrantz, Stearns & Lewis 1977) each improved by
    2-opt. A heuristic: no optimality guarantee."""
    dist = np.empty((m, m))
    tour = np.empty(m, dtype=np.int64)
    best_tour = np.empty(m, dtype=np.int64)
    visited = np.empty(m, dtype=np.bool_)
    for s in range(c.shape[0]):
        _edge_matrix(c[s], m, dist)
        best = np.inf
        for start in range(min(starts, m)):
            visited[:] = False
            tour[0] = start
            visited[start] = True
            for p in range(1, m):
                prev = tour[p - 1]
                nxt = -1
                nd = np.inf
                for q in range(m):
                    if not visited[q] and (nxt < 0 or dist[prev, q] < nd):
                        nxt = q
                        nd = dist[prev, q]
                tour[p] = nxt
                visited[nxt] = True
            _two_opt(dist, tour, max_iter)
            length = _tour_length(dist, tour)
            if length < best:
                best = length
                best_tour[:] = tour
        _write_tour(best_tour, m, x[s])


@_jit
def tsp_held_karp(c: np.ndarray, m: int, x: np.ndarray) -> None:
    """Exact TSP for each row of edge costs by the Held-Karp dynamic program (1962),
    :math:`O(2^m m^2)` time: for small ``m`` only."""
    dist = np.empty((m, m))
    full = 1 << (m - 1)
    cost = np.empty((full, m - 1))
    parent = np.empty((full, m - 1), dtype=np.int64)
    tour = np.empty(m, dtype=np.int64)
    for s in range(c.shape[0]):
        _edge_matrix(c[s], m, dist)
        cost[:] = np.inf
        for j in range(m - 1):
            cost[1 << j, j] = dist[0, j + 1]
            parent[1 << j, j] = -1
        for mask in range(1, full):
            for j in range(m - 1):
                if not (mask >> j) & 1 or cost[mask, j] == np.inf:
                    continue
                for k in range(m - 1):
                    if (mask >> k) & 1:
                        continue
                    nm = mask | (1 << k)
                    val = cost[mask, j] + dist[j + 1, k + 1]
                    if val < cost[nm, k]:
                        cost[nm, k] = val
                        parent[nm, k] = j
        best = np.inf
        last = 0
        for j in range(m - 1):
            val = cost[full - 1, j] + dist[j + 1, 0]
            if val < best:
                best = val
                last = j
        mask = full - 1
        tour[0] = 0
        for p in range(m - 1, 0, -1):
            tour[p] = last + 1
            prev = parent[mask, last]
            mask ^= 1 << last
            last = prev
        _write_tour(tour, m, x[s])
