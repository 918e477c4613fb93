"""Issue 30: pure LPs (P = 0) under ``solver="auto"``.

DAQP solves an LP by proximal-point iterations whose number grows with the size; measured
(:func:`dxopt.qp.solvers.forward.routes_lp_to_piqp`), piqp is faster from about n = 100 and daqp
below
n = 64, so "auto" sends pure LPs with n >= 65 to piqp. An LP's solution is piecewise constant
in q and, at a nondegenerate vertex, x = G_J^{-1} h_J: the gradients are checked against that
exact reference, and a solution on a face (not unique) is flagged, never silently wrong."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.solvers.forward import LP_PIQP_MIN_N

F64 = torch.float64


def _lp(n: int, seed: int) -> dict[str, torch.Tensor]:
    """min q'x s.t. Gx <= h (1.5 n generic rows), |x - x0| <= 10: a generic LP, so its solution
    is a nondegenerate vertex."""
    rng = np.random.default_rng(seed)
    m = int(1.5 * n)
    G = rng.standard_normal((m, n))
    x0 = rng.standard_normal(n)
    return {
        "P": torch.zeros(n, n, dtype=F64),
        "q": torch.from_numpy(rng.standard_normal(n)),
        "G": torch.from_numpy(G),
        "h": torch.from_numpy(G @ x0 + 1.0),
        "lb": torch.from_numpy(x0 - 10.0),
        "ub": torch.from_numpy(x0 + 10.0),
    }


def _grads(data: dict[str, torch.Tensor], w: torch.Tensor, solver: str) -> tuple:
    q = data["q"].clone().requires_grad_()
    h = data["h"].clone().requires_grad_()
    sol = dqp.solve(data["P"], q, G=data["G"], h=h, lb=data["lb"], ub=data["ub"], solver=solver)
    (w * sol.x).sum().backward()
    return sol, q.grad, h.grad


@pytest.mark.parametrize("seed", range(3))
def test_a_larger_lp_goes_to_piqp_with_the_same_solution_and_exact_gradients(seed: int):
    n = LP_PIQP_MIN_N + 5
    data = _lp(n, seed)
    w = torch.from_numpy(np.random.default_rng(100 + seed).standard_normal(n))
    auto, gq, gh = _grads(data, w, "auto")
    assert auto.info.solver == "piqp" and auto.status == (dqp.QPStatus.SOLVED,)
    ref, gq_ref, gh_ref = _grads(data, w, "daqp")
    torch.testing.assert_close(auto.x, ref.x, rtol=0, atol=1e-8)
    # the exact reference: n active rows of [G; -I; I] at the vertex, x = C_J^{-1} d_J
    x = ref.x.detach().numpy()
    C = np.vstack([data["G"].numpy(), -np.eye(n), np.eye(n)])
    d = np.concatenate([data["h"].numpy(), -data["lb"].numpy(), data["ub"].numpy()])
    active = np.flatnonzero(d - C @ x <= 1e-7)
    assert active.size == n  # a nondegenerate vertex
    u = np.linalg.solve(C[active].T, w.numpy())  # dL/dd_J = C_J^{-T} w
    expected_h = np.zeros(data["h"].numel())
    rows = active[active < expected_h.size]
    expected_h[rows] = u[: rows.size]
    for got_q, got_h in ((gq, gh), (gq_ref, gh_ref)):
        torch.testing.assert_close(got_q, torch.zeros(n, dtype=F64), rtol=0, atol=1e-9)
        torch.testing.assert_close(got_h, torch.from_numpy(expected_h), rtol=1e-7, atol=1e-8)


def test_a_small_lp_keeps_daqp_and_a_qp_is_not_rerouted() -> None:
    data = _lp(LP_PIQP_MIN_N - 25, 0)
    sol = dqp.solve(data["P"], data["q"], G=data["G"], h=data["h"], lb=data["lb"], ub=data["ub"])
    assert sol.info.solver in ("daqp", "dual_active_set")  # measured faster below n = 64
    big = _lp(LP_PIQP_MIN_N + 5, 1)
    P = 1e-3 * torch.eye(big["q"].numel(), dtype=F64)  # a QP, however flat
    qp = dqp.solve(P, big["q"], G=big["G"], h=big["h"], lb=big["lb"], ub=big["ub"])
    assert qp.info.solver != "piqp"


@pytest.mark.parametrize("n", [2, 3, LP_PIQP_MIN_N])
def test_an_lp_solved_on_a_face_is_flagged_not_silently_differentiated(n: int) -> None:
    """min -1'x s.t. 1'x <= 1, x >= 0: every point of the simplex is optimal and x is not a
    function of q. A loss that is constant on the face (1'x = h) has the exact gradient 1; one
    that is not (w'x) has no derivative: its least-squares adjoint does not solve the adjoint
    system (residual of order 1), so it is refused naming the non-unique solution (issue 35
    item 1: it was returned with a warning)."""

    def run(w: torch.Tensor) -> tuple:
        q = torch.full((n,), -1.0, dtype=F64, requires_grad=True)
        h = torch.ones(1, dtype=F64, requires_grad=True)
        G, lb = torch.ones(1, n, dtype=F64), torch.zeros(n, dtype=F64)
        sol = dqp.solve(torch.zeros(n, n, dtype=F64), q, G=G, h=h, lb=lb)
        assert sol.status == (dqp.QPStatus.SOLVED,)
        torch.testing.assert_close(sol.x.sum(), torch.tensor(1.0, dtype=F64))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (w * sol.x).sum().backward()
        return sol, q.grad, h.grad, caught

    sol, gq, gh, _ = run(torch.ones(n, dtype=F64))
    torch.testing.assert_close(gh, torch.ones(1, dtype=F64))  # 1'x = h on the whole face
    torch.testing.assert_close(gq, torch.zeros(n, dtype=F64), rtol=0, atol=1e-9)  # q: none
    assert sol.info.backward.residual <= 1e-10
    w = torch.arange(1.0, n + 1.0, dtype=F64)
    with pytest.raises(dqp.QPBackwardError, match=r"not unique.*not constant on it"):
        run(w)
