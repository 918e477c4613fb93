"""flow_conservation's full-rank form against the full node-arc system: full row rank, the
same equations (every dropped row is a combination of the kept ones, right-hand side
included), the same LP optimum on random costs, and a refusal where dropping would hide an
infeasible system."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch

from dxopt.dfl import flow_conservation, grid_graph


def _random_graph(seed: int) -> tuple[int, np.ndarray, int, int]:
    """12 nodes: a random DAG on nodes 0-6 (source 0, sink 6, a path 0-1-...-6 so the sink is
    reachable), a second component on nodes 7-10 and the isolated node 11."""
    rng = np.random.default_rng(seed)
    path = [(v, v + 1) for v in range(6)]
    extra = [(u, v) for u in range(7) for v in range(u + 2, 7) if rng.uniform() < 0.4]
    other = [(7, 8), (8, 9), (7, 10), (10, 9)]
    return 12, np.array(path + extra + other), 0, 6


CASES = [(25, grid_graph(5, 5), 0, 24), _random_graph(0), _random_graph(1)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_full_rank_and_the_same_equations(case):
    n, edges, s, t = CASES[case]
    A_full, b_full = flow_conservation(n, edges, s, t, drop_redundant=False)
    A, b = flow_conservation(n, edges, s, t)
    components = 1 if case == 0 else 3  # the grid; or the DAG, nodes 7-10 and node 11
    assert A_full.shape[0] == n and A.shape[0] == n - components
    assert torch.linalg.matrix_rank(A_full).item() == n - components
    assert torch.linalg.matrix_rank(A).item() == A.shape[0]  # full row rank
    # the full system's rows are combinations of the kept rows, b included: same equations
    aug, aug_full = torch.cat([A, b[:, None]], 1), torch.cat([A_full, b_full[:, None]], 1)
    coef = torch.linalg.lstsq(aug.T, aug_full.T).solution
    torch.testing.assert_close(coef.T @ aug, aug_full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_lp_optimum_on_random_costs(case):
    n, edges, s, t = CASES[case]
    forms = [flow_conservation(n, edges, s, t, drop_redundant=d) for d in (False, True)]
    rng = np.random.default_rng(case)
    for _ in range(5):
        c = rng.uniform(-0.5, 1.0, len(edges))  # some negative costs: the bounds bind
        values = []
        for A, b in forms:
            res = scipy.optimize.linprog(
                c, A_eq=A.numpy(), b_eq=b.numpy(), bounds=(0, 1), method="highs"
            )
            assert res.status == 0
            values.append(res.fun)
        assert abs(values[0] - values[1]) <= 1e-9 * (1 + abs(values[0]))


def test_disconnected_source_and_sink_are_refused():
    n, edges, _, _ = _random_graph(0)
    with pytest.raises(ValueError, match="not connected"):
        flow_conservation(n, edges, 0, 9)  # the sink lies in the other component
    A, b = flow_conservation(n, edges, 0, 9, drop_redundant=False)  # the full (infeasible) form
    assert A.shape[0] == n and b.sum() == 0
    with pytest.raises(TypeError, match="drop_redundant"):
        flow_conservation(n, edges, 0, 6, drop_redundant=1)
