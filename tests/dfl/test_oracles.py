"""Oracles against independent references: the shortest-path DP against LPs (HiGHS and piqp),
branch and bound against brute force, Held-Karp against brute force over permutations, the
2-opt heuristic against Held-Karp, and bad inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dxopt import Cost, DxoptError
from dxopt.dfl import (
    CallableOracle,
    KnapsackOracle,
    LPOracle,
    Oracle,
    OracleError,
    ShortestPathOracle,
    SolutionPool,
    TSPOracle,
    flow_conservation,
    grid_graph,
    incidence_matrix,
)


def test_grid_graph_matches_pyepo_order_and_incidence():
    edges = grid_graph(2, 3)
    assert edges.tolist() == [[0, 1], [1, 2], [0, 3], [1, 4], [2, 5], [3, 4], [4, 5]]
    N = incidence_matrix(6, edges).toarray()
    assert (N.sum(0) == 0).all() and (N.min(0) == -1).all() and (N.max(0) == 1).all()
    dense = incidence_matrix(6, edges, layout="torch")
    sparse = incidence_matrix(6, edges, layout="torch_sparse")
    assert torch.equal(dense, sparse.to_dense())
    A, b = flow_conservation(6, edges, 0, 5, drop_redundant=False)
    assert b.tolist() == [-1, 0, 0, 0, 0, 1] and torch.equal(A, dense)
    A, b = flow_conservation(6, edges, 0, 5)  # the sink's (implied) row dropped
    assert b.tolist() == [-1, 0, 0, 0, 0] and torch.equal(A, dense[:5])


@pytest.mark.parametrize("solver", ["highs", "piqp"])
def test_shortest_path_dp_equals_lp(solver):
    oracle = ShortestPathOracle((5, 5))
    lp = oracle.as_lp(solver=solver)
    gen = torch.Generator().manual_seed(0)
    c = torch.rand(40, oracle.dim, generator=gen, dtype=torch.float64) - 0.3  # some negative
    x, x_lp = oracle(c), lp(c)
    assert torch.allclose(oracle.objective(c, x), lp.objective(c, x_lp), atol=1e-7)
    assert torch.allclose(x, x_lp.round(), atol=0)  # unique optimum for continuous costs
    A, b = flow_conservation(25, oracle.edges, 0, 24)
    assert torch.allclose(x @ A.T, b.expand(40, -1))
    assert oracle.cost == Cost(forwards=40) and oracle.calls == 1
    assert isinstance(oracle, Oracle) and isinstance(lp, Oracle)
    assert oracle.reset_cost() == Cost(forwards=40) and oracle.cost == Cost()


def test_shortest_path_general_dag_and_single_vector():
    edges = np.array([[0, 1], [0, 2], [1, 2], [1, 3], [2, 3]])
    oracle = ShortestPathOracle(None, edges=edges, num_nodes=4, source=0, sink=3)
    c = torch.tensor([1.0, 5.0, 1.0, 4.0, 1.0])
    assert oracle(c).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]  # 0-1-2-3 costs 3
    with pytest.raises(ValueError, match="cycle"):
        ShortestPathOracle(None, edges=[[0, 1], [1, 0]], num_nodes=2, source=0, sink=1)


def _brute_knapsack(values, weights, capacity):
    m = weights.shape[1]
    subsets = np.array(list(itertools.product([0.0, 1.0], repeat=m)))
    feasible = subsets[(subsets @ weights.T <= capacity + 1e-9).all(1)]
    return (values @ feasible.T).max(1)


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_knapsack_branch_and_bound_equals_brute_force(dim):
    rng = np.random.default_rng(dim)
    W = rng.integers(300, 800, (dim, 11)) / 100.0  # non-integer weights, as PyEPO's
    cap = np.full(dim, 15.0)
    oracle = KnapsackOracle(W, cap)
    values = rng.normal(2.0, 2.0, (60, 11))  # some negative values
    x = oracle(torch.tensor(values)).numpy()
    assert ((x @ W.T) <= cap + 1e-9).all()
    assert np.allclose((values * x).sum(1), _brute_knapsack(values, W, cap), atol=1e-9)
    low = KnapsackOracle(W, cap, sense="min")  # min c'x = max (-c)'x
    assert np.allclose(low(torch.tensor(-values)).numpy(), x)


def test_tsp_exact_equals_brute_force_and_heuristic_is_a_tour():
    m = 7
    gen = torch.Generator().manual_seed(1)
    c = torch.rand(15, m * (m - 1) // 2, generator=gen, dtype=torch.float64)
    exact, heur = TSPOracle(m, method="exact"), TSPOracle(m, method="heuristic")
    xe, xh = exact(c), heur(c)
    pairs = list(itertools.combinations(range(m), 2))
    index = {p: k for k, p in enumerate(pairs)}
    best = []
    for row in c:
        lengths = [
            sum(row[index[tuple(sorted((t[i], t[(i + 1) % m])))]] for i in range(m))
            for t in ((0, *p) for p in itertools.permutations(range(1, m)))
        ]
        best.append(min(lengths))
    assert torch.allclose(exact.objective(c, xe), torch.tensor(best, dtype=c.dtype))
    for x in (xe, xh):  # a Hamiltonian cycle: m edges, every node of degree 2, connected
        for row in x:
            chosen = [pairs[k] for k in torch.nonzero(row).flatten().tolist()]
            assert len(chosen) == m
            assert np.bincount(np.array(chosen).ravel(), minlength=m).tolist() == [2] * m
            seen, node = {0}, 0
            for _ in range(m - 1):
                node = next(v for e in chosen if node in e for v in e if v not in seen)
                seen.add(node)
            assert len(seen) == m
    assert (heur.objective(c, xh) >= exact.objective(c, xe) - 1e-12).all()
    coords = torch.rand(m, 2, generator=gen, dtype=torch.float64)
    from_coords = TSPOracle.edge_costs(coords=coords)
    assert torch.allclose(from_coords, TSPOracle.edge_costs(distances=torch.cdist(coords, coords)))
    with pytest.raises(ValueError, match="distances"):
        TSPOracle.edge_costs(distances=torch.rand(3, 3, dtype=torch.float64) + torch.eye(3))
    assert from_coords[index[(2, 5)]] == torch.linalg.norm(coords[2] - coords[5])


def test_lp_oracle_max_sense_and_callable_oracle():
    lp = LPOracle(A=torch.ones(1, 3), b=torch.ones(1), lb=0.0, ub=1.0, sense="max")
    c = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]])
    assert lp(c).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    onehot = CallableOracle(lambda v: torch.nn.functional.one_hot(v.argmin(), 3), dim=3)
    assert onehot(c).tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    assert onehot(c[0]).shape == (3,)


def test_solution_pool_best_and_dedup():
    pool = SolutionPool(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]))
    assert len(pool) == 2
    assert pool.add(torch.tensor([[1.0, 1.0], [0.0, 1.0]])) == 1
    c = torch.tensor([[1.0, 2.0], [-1.0, -2.0]])
    assert pool.best(c).tolist() == [[1.0, 0.0], [1.0, 1.0]]
    high = SolutionPool(pool.solutions, sense="max")
    assert high.best(c).tolist() == [[1.0, 1.0], [1.0, 0.0]]


def test_bad_inputs_name_the_argument():
    oracle = ShortestPathOracle((3, 3))
    with pytest.raises(ValueError, match="c: expected shape"):
        oracle(torch.zeros(2, 5))
    with pytest.raises(TypeError, match="c: expected a floating"):
        oracle(torch.zeros(2, oracle.dim, dtype=torch.int64))
    with pytest.raises(ValueError, match="c: expected finite"):
        oracle(torch.full((oracle.dim,), float("nan")))
    with pytest.raises(ValueError, match="weights"):
        KnapsackOracle(-np.ones((1, 3)), 1.0)
    with pytest.raises(ValueError, match="capacity"):
        KnapsackOracle(np.ones((2, 3)), [1.0, 0.0])
    with pytest.raises(ValueError, match="num_nodes"):
        TSPOracle(20, method="exact")
    with pytest.raises(ValueError, match="sense"):
        LPOracle(lb=np.zeros(2), ub=np.ones(2), sense="maximize")
    with pytest.raises(TypeError, match="fn"):
        CallableOracle(3, dim=2)
    with pytest.raises(ValueError, match="edges"):
        incidence_matrix(3, [[0, 5]])
    assert issubclass(OracleError, DxoptError)
    unreachable = ShortestPathOracle(None, edges=[[1, 0]], num_nodes=2, source=0, sink=1)
    with pytest.raises(OracleError, match="unreachable"):
        unreachable(torch.ones(1))
    infeasible = LPOracle(A=torch.ones(1, 2), b=torch.tensor([5.0]), lb=0.0, ub=1.0)
    with pytest.raises(OracleError):
        infeasible(torch.ones(2))
