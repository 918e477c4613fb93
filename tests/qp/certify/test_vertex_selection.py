"""Issue 35 item 2, the rest: general dependent inequality rows and samples too big for the
dense selection.

(i) Rows :math:`e_1, e_2, e_1 + e_2` all active at :math:`x = (h_1, h_2)` (``h_3 = h_1 + h_2``):
the multipliers form the segment :math:`\\{(r_1 - t, r_2 - t, t): 0 \\le t \\le r_1\\}`,
:math:`r = -(x + q)`. Before, each backend returned its own point of it (daqp the vertex
``t = 0``, piqp/clarabel interior points, torch the other vertex) and the backward
differentiated the vertex of its rule whatever was returned. Now every backend returns the
rule's vertex, the one minimising the l1 norm of the row-normalised multipliers
:math:`\\sum_i \\nu_i\\|g_i\\|_2` (computed here by enumerating the vertices of the segment:
independent of the library), and the Jacobian of the returned multipliers matches kink-aware
float64 finite differences. (ii) A sample whose dense active rows exceed ``DENSE_SELECTION``
entries kept the backend's multipliers silently; it now warns where its rows are dependent
(the limit monkeypatched so the test is small).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from tests.qp.certify.test_multiplier_selection import SOLVERS, _case_a, _check_jacobian

import dxopt.qp as dqp
import dxopt.qp.certify.multipliers as multipliers

F64 = torch.float64
G3 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def _data(theta: torch.Tensor, sparse: bool) -> dict[str, torch.Tensor]:
    """theta = (q1, q2, h1, h2); the third row's bound h1 + h2 keeps all three rows active."""
    q, h12 = theta[..., :2], theta[..., 2:]
    h = torch.cat([h12, h12.sum(-1, keepdim=True)], -1)
    G = torch.tensor(G3, dtype=F64)
    return {"P": torch.eye(2, dtype=F64), "q": q, "G": G.to_sparse() if sparse else G, "h": h}


def _reference(theta: np.ndarray) -> np.ndarray:
    """The minimum-cost vertex of the multiplier set by enumeration: every pair of rows (a
    basis of R^2), its multipliers, the feasible ones, the least sum of nu_i ||g_i||_2."""
    q, h12 = theta[:2], theta[2:]
    r = -(h12 + q)  # x = (h1, h2), P = I
    norms = np.linalg.norm(G3, axis=1)
    best, best_cost = None, np.inf
    for pair in itertools.combinations(range(3), 2):
        nu = np.zeros(3)
        nu[list(pair)] = np.linalg.solve(G3[list(pair)].T, r)
        if (nu >= 0).all() and nu @ norms < best_cost:
            best, best_cost = nu, nu @ norms
    assert best is not None
    return best


THETA = [-2.0, -6.0, 1.0, 1.0]  # r = (1, 5): the segment (1 - t, 5 - t, t), vertex t = 1


@pytest.mark.parametrize("sparse", [False, True])
def test_general_dependency_one_vertex_on_every_backend(sparse: bool) -> None:
    theta = torch.tensor(THETA, dtype=F64)
    ref = _reference(theta.numpy())
    np.testing.assert_allclose(ref, [0.0, 4.0, 1.0], atol=1e-12)  # the enumeration itself
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        for solver in SOLVERS:
            if sparse and solver in ("daqp", "torch", "dual_active_set"):
                continue  # dense-only backends
            sol = dqp.solve(**_data(theta, sparse), solver=solver)
            assert sol.status[0] == dqp.QPStatus.SOLVED
            np.testing.assert_allclose(sol.x.numpy(), [1.0, 1.0], atol=1e-7)
            np.testing.assert_allclose(sol.ineq_duals.numpy(), ref, rtol=0, atol=1e-7,
                                       err_msg=solver)  # fmt: skip


@pytest.mark.parametrize("solver", SOLVERS)
def test_general_dependency_jacobian_is_that_of_the_returned_vertex(solver: str) -> None:
    """Every entry of d nu / d(q, h) against one-sided differences of the returned entries
    (off the kinks: r1 = 1 > 0 and r2 - r1 = 4 > 0), and no warning that the multipliers'
    derivative is another selection's."""
    theta = torch.tensor(THETA, dtype=F64)

    def f(t: torch.Tensor) -> torch.Tensor:
        sol = dqp.solve(**_data(t, False), solver=solver)
        assert all(s == dqp.QPStatus.SOLVED for s in sol.status)
        return sol.ineq_duals

    np.testing.assert_allclose(f(theta).numpy(), _reference(theta.numpy()), atol=1e-7)
    _check_jacobian(f, theta)
    t = theta.clone().requires_grad_(True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.autograd.grad(f(t) @ torch.tensor([1.0, 2.0, 4.0], dtype=F64), t)
    assert not any("other than the returned" in str(w.message) for w in seen)


def test_general_dependency_batched_matches_the_enumeration() -> None:
    """A batch (the dense general path, not the lean one): each sample its own vertex."""
    theta = torch.tensor([THETA, [-1.5, -2.5, 0.5, 0.25], [-4.0, -2.0, 1.0, 1.0]], dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        for solver in ("piqp", "clarabel", "daqp"):
            sol = dqp.solve(**_data(theta, False), solver=solver)
            for k in range(theta.shape[0]):
                np.testing.assert_allclose(
                    sol.ineq_duals[k].numpy(), _reference(theta[k].numpy()), atol=1e-7,
                    err_msg=f"{solver} sample {k}",
                )  # fmt: skip


@pytest.mark.parametrize("solver", ["piqp", "daqp"])
def test_too_big_for_the_selection_warns(solver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """(ii) With ``DENSE_SELECTION`` below the sample's entries, the dependent equality rows
    A = [a1; a2; a1 + a2] keep the backend's multipliers and the forward says so; the
    independent control says nothing."""
    monkeypatch.setattr(multipliers, "DENSE_SELECTION", 1)
    theta = torch.tensor([0.3, -0.2, 0.5, 1.0, 2.0], dtype=F64)
    with pytest.warns(dqp.QPDegenerateWarning, match="too big for the multiplier selection"):
        dqp.solve(**_case_a(theta), solver=solver)
    G = torch.eye(2, dtype=F64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dqp.solve(torch.eye(2, dtype=F64), torch.tensor([-2.0, -3.0], dtype=F64), G=G,
                  h=torch.ones(2, dtype=F64), solver=solver)  # fmt: skip
    assert not any("too big" in str(w.message) for w in seen)


def test_the_backward_still_warns_where_another_vertex_is_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the selection is skipped (limit monkeypatched), piqp's interior multipliers stay:
    a multiplier cotangent then gets the warning that the derivative is the vertex's, and a
    loss through x alone gets none (its gradient, zero here since x is pinned, is exact)."""
    monkeypatch.setattr(multipliers, "DENSE_SELECTION", 1)
    theta = torch.tensor(THETA, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        sol = dqp.solve(**_data(theta, False), solver="piqp")
    assert float(sol.ineq_duals[0]) > 1e-3  # an interior point of the segment, not the vertex
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (gx,) = torch.autograd.grad(sol.x.sum(), theta, retain_graph=True)
    assert not any("other than the returned" in str(w.message) for w in seen)
    torch.testing.assert_close(gx, torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=F64), rtol=0,
                               atol=1e-9)  # fmt: skip
    with pytest.warns(dqp.QPDegenerateWarning, match="other than the returned"):
        torch.autograd.grad(sol.ineq_duals.sum(), theta)
