"""Issue 28 item 3: INFEASIBLE and UNBOUNDED only with a checked certificate.

Before, a sample that no attempt certified was classified by re-solving with the requested
backend and the user's options: osqp with ``max_iter=1`` on feasible problems came back
INFEASIBLE, and a strictly convex problem with cond(P) = 1e12 came back UNBOUNDED. Now a
Farkas ray or a direction of unbounded descent is checked (:mod:`dxopt.qp.certify.certificates`);
without one the status is MAX_ITER, INACCURATE or FAILED with what to change."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import dxopt.qp as dqp
from dxopt.qp.certify.certificates import check_descent, check_farkas, diagnose
from dxopt.qp.problem.types import QPStatus

F64 = torch.float64


def _t(a: np.ndarray | None) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(np.asarray(a, dtype=np.float64))


def _feasible_case(seed: int) -> dict[str, np.ndarray]:
    """n = 3, strictly convex, with an equality row; x0 is strictly feasible."""
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((3, 3))
    x0 = rng.standard_normal(3)
    G = rng.standard_normal((4, 3))
    A = rng.standard_normal((1, 3))
    return {
        "P": M @ M.T + 0.1 * np.eye(3),
        "q": rng.standard_normal(3),
        "A": A,
        "b": A @ x0,
        "G": G,
        "h": G @ x0 + rng.random(4) + 0.1,
    }


def _solve(data: dict[str, np.ndarray], **kw: object) -> dqp.QPSolution:
    P, q = _t(data["P"]), _t(data["q"])
    rest = {k: _t(data.get(k)) for k in ("A", "b", "G", "h")}
    return dqp.solve(P, q, **rest, on_failure="nan", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(10))
def test_an_iteration_limit_is_max_iter_never_infeasible(seed: int) -> None:
    """The issue's case (old code: INFEASIBLE on every one of these feasible problems)."""
    sol = _solve(
        _feasible_case(seed),
        solver="osqp",
        solver_options={"max_iter": 1},
        fallback=False,
        polish=False,
    )
    assert sol.status == (QPStatus.MAX_ITER,)
    assert torch.isnan(sol.x).all()
    # the same problem solves with the default chain
    assert _solve(_feasible_case(seed), solver="osqp").status == (QPStatus.SOLVED,)


def test_the_error_says_what_to_change() -> None:
    data = _feasible_case(0)
    with pytest.raises(dqp.QPSolveError, match="raise max_iter in solver_options") as err:
        P, q = _t(data["P"]), _t(data["q"])
        rest = {k: _t(data[k]) for k in ("A", "b", "G", "h")}
        dqp.solve(
            P, q, **rest, solver="osqp", solver_options={"max_iter": 1}, fallback=False,
            polish=False,
        )  # fmt: skip
    assert "Fix the data" not in str(err.value) and "fix the data" not in str(err.value)


def test_strictly_convex_ill_conditioned_problem_is_never_unbounded() -> None:
    """cond(P) = 1e12, the minimiser at x2 = -1e12: daqp gives up (its flag: unbounded), the
    old code said UNBOUNDED; P is positive definite, so no descent direction exists."""
    data = {
        "P": np.diag([1.0, 1e-12]),
        "q": np.array([1.0, 1.0]),
        "G": np.array([[1.0, 0.0]]),
        "h": np.array([1.0]),
    }
    sol = _solve(data, solver="daqp", fallback=False)
    assert sol.status[0] not in (QPStatus.UNBOUNDED, QPStatus.INFEASIBLE)
    assert sol.status == (QPStatus.INACCURATE,)
    with pytest.raises(dqp.QPSolveError, match="rescale"):
        dqp.solve(_t(data["P"]), _t(data["q"]), G=_t(data["G"]), h=_t(data["h"]),
                  solver="daqp", fallback=False)  # fmt: skip
    # the chain solves it (an interior point reaches the far minimiser)
    assert _solve(data).status == (QPStatus.SOLVED,)


@pytest.mark.parametrize("solver", ["daqp", "osqp", "piqp", "clarabel", "proxqp"])
@pytest.mark.parametrize("scale", [1.0, 1e6, 1e-6])
def test_an_infeasible_problem_is_infeasible_with_a_checked_ray(solver: str, scale: float):
    """x1 >= 1 and x1 + x2 <= 0 and x2 >= 0 (rows scaled by 1e6 / 1e-6): infeasible for every
    backend, with or without the fallback chain."""
    G = np.array([[-1.0, 0.0], [1.0, 1.0], [0.0, -1.0], [1.0, -1.0]]) * scale
    h = np.array([-1.0, 0.0, 0.0, 5.0]) * scale
    data = {"P": np.eye(2), "q": np.array([0.3, -0.2]), "G": G, "h": h}
    for fallback in (False, True):
        sol = _solve(data, solver=solver, fallback=fallback)
        assert sol.status == (QPStatus.INFEASIBLE,), (solver, fallback)


def test_osqp_gives_its_own_ray_which_is_checked() -> None:
    G = np.array([[-1.0, 0.0], [1.0, 0.0]])
    h = np.array([-1.0, 0.0])  # x1 >= 1 and x1 <= 0
    data = {"P": np.eye(2), "q": np.zeros(2), "G": G, "h": h}
    with pytest.raises(dqp.QPSolveError, match="from the backend, checked"):
        P, q = _t(data["P"]), _t(data["q"])
        dqp.solve(P, q, G=_t(G), h=_t(h), solver="osqp", fallback=False)


@pytest.mark.parametrize("solver", ["clarabel", "piqp", "osqp", "daqp"])
def test_unbounded_only_with_a_direction_and_a_feasible_point(solver: str) -> None:
    """P singular (PSD) with a descent direction in its null space: UNBOUNDED; the same with
    an infeasible row added: INFEASIBLE (no feasible point to descend from)."""
    P = np.diag([1.0, 0.0])
    data = {"P": P, "q": np.array([0.0, -1.0]), "G": np.array([[-1.0, 0.0]]), "h": np.zeros(1)}
    assert _solve(data, solver=solver, fallback=False).status == (QPStatus.UNBOUNDED,)
    bad = dict(data, G=np.array([[-1.0, 0.0], [1.0, 0.0]]), h=np.array([-1.0, 0.0]))
    assert _solve(bad, solver=solver, fallback=False).status == (QPStatus.INFEASIBLE,)


def test_a_sparse_infeasible_problem_stays_sparse_and_is_infeasible() -> None:
    n = 3000
    idx = torch.arange(n).repeat(2, 1)
    P = torch.sparse_coo_tensor(idx, torch.ones(n, dtype=F64), (n, n))
    G = torch.sparse_coo_tensor(idx, -torch.ones(n, dtype=F64), (n, n))  # x >= 1 ...
    A = torch.ones(1, n, dtype=F64).to_sparse()  # ... and 1'x = 1
    q, h, b = torch.zeros(n, dtype=F64), -torch.ones(n, dtype=F64), torch.ones(1, dtype=F64)
    sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, on_failure="nan", fallback=False)
    assert sol.status == (QPStatus.INFEASIBLE,)


def test_check_farkas_accepts_exact_rays_and_refuses_near_misses() -> None:
    G = np.array([[-1.0, 0.0], [1.0, 1.0], [0.0, -1.0]])
    h = np.array([-1.0, 0.0, 0.0])
    y = np.array([1.0, 1.0, 1.0])  # G'y = 0, h'y = -1
    assert check_farkas(G, h, None, None, y, np.zeros(0))
    assert check_farkas(G, h, None, None, 1e-9 * y, np.zeros(0))  # scale free
    assert not check_farkas(G, h, None, None, -y, np.zeros(0))  # y < 0
    assert not check_farkas(G, h, None, None, y + np.array([0, 1e-4, 0]), np.zeros(0))  # G'y != 0
    assert not check_farkas(G, h + np.array([1.0, 0, 0]), None, None, y, np.zeros(0))  # h'y = 0
    assert not check_farkas(G, h, None, None, np.zeros(3), np.zeros(0))  # no ray
    # with equalities: x1 = 1 and x1 <= 0; sparse data give the same verdict
    A, b, G1, h1 = np.array([[1.0, 0.0]]), np.array([1.0]), np.array([[1.0, 0.0]]), np.zeros(1)
    for conv in (np.asarray, sp.csr_matrix):
        assert check_farkas(conv(G1), h1, conv(A), b, np.array([1.0]), np.array([-1.0]))
        assert not check_farkas(conv(G1), h1, conv(A), b, np.array([1.0]), np.array([1.0]))


def test_check_descent_refuses_curvature_and_ascent() -> None:
    P, q, G = np.diag([1.0, 0.0]), np.array([0.0, -1.0]), np.array([[-1.0, 0.0]])
    assert check_descent(P, q, G, None, np.array([0.0, 1.0]))
    assert not check_descent(P, q, G, None, np.array([0.0, -1.0]))  # ascent
    assert not check_descent(P, q, G, None, np.array([1.0, 1.0]))  # Pd != 0
    assert not check_descent(P, q, np.array([[0.0, 1.0]]), None, np.array([0.0, 1.0]))  # Gd > 0
    assert not check_descent(P, q, G, np.array([[0.0, 1.0]]), np.array([0.0, 1.0]))  # Ad != 0


def test_diagnose_without_any_evidence_is_failed_and_strict_convexity_blocks_unbounded():
    args = {"P": np.eye(2), "q": np.array([-1.0, 0.0]), "A": None, "b": None, "G": None, "h": None}
    verdict = diagnose(args, claims=[], hit_cap=False, had_point=False, eps_abs=1e-9)
    assert verdict.status is QPStatus.FAILED
    # a (wrong) claimed direction for a positive definite P is never accepted
    fake = [{"claim": "x", "dual_inf_cert": np.array([1.0, 0.0])}]
    verdict = diagnose(args, claims=fake, hit_cap=False, had_point=False, eps_abs=1e-9)
    assert verdict.status is QPStatus.INACCURATE


@pytest.mark.parametrize("cond", [1e9, 1e12])
def test_the_torch_path_never_calls_a_strictly_convex_problem_unbounded(cond: float) -> None:
    """solver="torch": its interior point's own test (absolute, no convexity check) said
    UNBOUNDED for cond(P) = 1e9 and 1e12 (old code); its verdicts now go through the CPU
    path's checked certificates, and real infeasible/unbounded problems keep their status."""
    data = {
        "P": np.diag([1.0, 1.0 / cond]),
        "q": np.array([1.0, 1.0]),
        "G": np.array([[1.0, 0.0]]),
        "h": np.array([1.0]),
    }
    sol = _solve(data, solver="torch")
    assert sol.status == (QPStatus.SOLVED,)
    torch.testing.assert_close(sol.x, torch.tensor([-1.0, -cond], dtype=F64), rtol=1e-6, atol=0)
    strict = _solve(data, solver="torch", fallback=False)
    assert strict.status[0] not in (QPStatus.UNBOUNDED, QPStatus.INFEASIBLE)
    bad = {"P": np.eye(2), "q": np.ones(2), "G": np.array([[-1.0, 0.0], [1.0, 0.0]])}
    assert _solve(bad | {"h": np.array([-1.0, 0.0])}, solver="torch").status == (
        QPStatus.INFEASIBLE,
    )
    ray = {"P": np.diag([1.0, 0.0]), "q": np.array([0.0, -1.0]), "G": np.array([[-1.0, 0.0]])}
    assert _solve(ray | {"h": np.zeros(1)}, solver="torch").status == (QPStatus.UNBOUNDED,)


@pytest.mark.parametrize("solver", ["auto", "piqp", "clarabel", "daqp"])
@pytest.mark.parametrize("sparse", [False, True])
def test_an_unbounded_lp_raises_no_numpy_warning(solver: str, sparse: bool) -> None:
    """Issue 35 item 5: min -1'x s.t. x >= 0 is UNBOUNDED; the polish's refinement on its
    inconsistent singular system used to print numpy overflow RuntimeWarnings from
    linalg/sparse.py on every call (the divergence is detected, not warned about)."""
    n = 3
    P = torch.zeros(n, n, dtype=torch.float64)
    G = -torch.eye(n, dtype=torch.float64)
    if sparse:
        P, G = P.to_sparse(), G.to_sparse()
    q, h = -torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = dqp.solve(P, q, G=G, h=h, solver=solver, on_failure="nan")
    assert sol.status == (QPStatus.UNBOUNDED,)
    assert bool(torch.isnan(sol.x).all())
