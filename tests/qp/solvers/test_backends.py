"""The backend table (dxopt.qp.solvers.backends) is the single source of what the forward, the
fallback chain, the lean route and the router know about a backend: every entry is checked
against qpsolvers and against the routes, and an entry changed or added in the table (a fake
one here) changes every reader."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest
import qpsolvers
import scipy.sparse as sp
import torch

import dxopt.qp as dqp
import dxopt.qp.lean.small as small
import dxopt.qp.solvers.backends as backends
import dxopt.qp.solvers.chain as chain
from dxopt.qp.api.route import auto_solver, plan
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.solvers.attempts import fallback_chain
from dxopt.qp.solvers.backends import BACKENDS, Backend, backend, backend_kwargs
from dxopt.qp.solvers.forward import default_solver
from dxopt.qp.solvers.routing import AUTO, DENSE_FALLBACK_MAX_N, numpy_views

INSTALLED = [b for b in BACKENDS.values() if b.name in qpsolvers.available_solvers]
D = torch.float64


def _box_qp() -> tuple[torch.Tensor, ...]:
    """min 1/2 |x|^2 - c'x, c = (1, 2, 3, 4), s.t. x <= 0.5, sum(x) = 0.5. Stationarity
    x = c - t - nu gives x_i = min(c_i - t, 1/2); t = 1.75 makes the sum 0.5: x = (-0.75, 0.25,
    0.5, 0.5), nu = (0, 0, 0.75, 1.75), no weakly active row."""
    n = 4
    P = torch.eye(n, dtype=D)
    q = -torch.arange(1.0, n + 1, dtype=D)
    G, h = torch.eye(n, dtype=D), torch.full((n,), 0.5, dtype=D)
    A, b = torch.ones(1, n, dtype=D), torch.tensor([0.5], dtype=D)
    return P, q, A, b, G, h


X_STAR = np.array([-0.75, 0.25, 0.5, 0.5])
NU_STAR = np.array([0.0, 0.0, 0.75, 1.75])
MU_STAR = np.array([1.75])


def _solve(data: tuple[torch.Tensor, ...], **kw: object) -> dqp.QPSolution:
    return dqp.solve(*data[:2], **dict(zip("AbGh", data[2:])), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("entry", INSTALLED, ids=lambda b: b.name)
def test_every_entry_matches_qpsolvers(entry: Backend) -> None:
    """The entry's formats agree with qpsolvers' own lists, and its settings (the tolerance
    keys) are ones the backend takes: through the one qpsolvers attempt and its polish the
    closed-form solution comes back certified."""
    if entry.sparse_only:
        assert entry.name not in qpsolvers.dense_solvers
    if entry.dense_only:
        assert entry.name not in qpsolvers.sparse_solvers
    P, q, A, b, G, h = (t.numpy() for t in _box_qp())
    args = {"P": entry.matrix(P), "q": q, "A": entry.matrix(A), "b": b, "G": entry.matrix(G),
            "h": h}  # fmt: skip
    assert sp.issparse(args["P"]) is entry.sparse_only
    kw = backend_kwargs(entry.name, 1e-9, 0.0, None)
    assert set(kw) == {*entry.abs_keys, *entry.rel_keys, *entry.fixed}
    pt = backends.qpsolvers_attempt(entry.name, args, kwargs=kw, init=None, record_warnings=True)
    assert pt.found and pt.x is not None and pt.y is not None and pt.z is not None
    assert pt.y.shape == (1,) and pt.z.shape == (4,)
    pol = backends.polish_attempt(
        args, pt.x, pt.y, pt.z, eps_abs=1e-9, eps_rel=0.0, enabled=True, force=False,
        exact_working_set=entry.exact_working_set, g_inf=None, a_inf=None,
    )  # fmt: skip
    assert pol.certificate.ok and pol.certificate.settled
    np.testing.assert_allclose(pol.x, X_STAR, atol=1e-8)
    np.testing.assert_allclose(pol.mu, MU_STAR, atol=1e-7)
    np.testing.assert_allclose(pol.nu, NU_STAR, atol=1e-7)


@pytest.mark.parametrize("entry", INSTALLED, ids=lambda b: b.name)
def test_routes_and_chain_follow_the_table(entry: Backend) -> None:
    """The lean single route takes exactly the ``lean`` entries; the fallback chain's other
    backends are the ``fallback`` entries in their order, a dense-only one left out of a large
    sparse problem; the batch fast path and the PSD certificate follow ``exact_working_set``
    and ``call``."""
    data = _box_qp()
    options = QPOptions(solver=entry.name)
    route = plan(data, options, dqp.PenaltyBackward(), warm_start=None)
    if entry.lean:
        assert (route.name, route.solver) == ("lean_single", entry.name)
    else:
        assert route.name == "general"
    problem = canonical_problem(*data)
    names = [a.solver for a in fallback_chain(problem, entry.name, 1e-9)]
    others = [b.name for b in backends.fallback_backends() if b.name in qpsolvers.available_solvers]
    assert names == [entry.name, *[s for s in others if s != entry.name], entry.name]
    sol = _solve(data, solver=entry.name)
    np.testing.assert_allclose(sol.x.numpy(), X_STAR, atol=1e-8)
    assert sol.info.sample_solvers == (entry.name,)
    views = numpy_views(problem, entry.name)
    assert sp.issparse(views["P"]) is entry.sparse_only


def test_a_large_sparse_problem_leaves_dense_only_backends_out() -> None:
    n = DENSE_FALLBACK_MAX_N + 1
    eye = torch.eye(n, dtype=D).to_sparse()
    problem = canonical_problem(eye, torch.ones(n, dtype=D), G=eye, h=torch.ones(n, dtype=D))
    names = [a.solver for a in fallback_chain(problem, "piqp", 1e-9)]
    assert all(not backend(s).dense_only for s in names)
    assert "clarabel" in names


@pytest.mark.parametrize(("n", "dense_in_chain"), [(500, True), (1500, False), (2172, False)])
def test_daqp_joins_a_sparse_chain_only_where_its_dense_solve_is_cheap(
    n: int, dense_in_chain: bool
) -> None:
    # raw daqp takes 63-72 s on sparse Maros-Meszaros problems of n = 2118-2172 at one
    # thread (QPILOTNO: 359 s inside a failing forward under load), 0.9 s at n = 1000
    if "daqp" not in qpsolvers.available_solvers:
        pytest.skip("daqp not installed")
    eye = torch.eye(n, dtype=D).to_sparse()
    problem = canonical_problem(eye, torch.ones(n, dtype=D), G=eye, h=torch.ones(n, dtype=D))
    names = [a.solver for a in fallback_chain(problem, "piqp", 1e-9)]
    assert ("daqp" in names) is dense_in_chain, names
    assert "clarabel" in names and names[0] == names[-1] == "piqp"


def test_a_changed_and_a_fake_entry_change_every_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """One edit of the table is seen by the router, the chain, the views and the batch fast
    path: proxqp made non-lean, CSC-only and a last fallback; a fake backend registered."""
    fake = Backend("fakeqp", abs_keys=("tol",), formats=("dense",))
    changed = dataclasses.replace(BACKENDS["proxqp"], lean=False, formats=("sparse",), fallback=9)
    table = MappingProxyType({**BACKENDS, "proxqp": changed, "fakeqp": fake})
    monkeypatch.setattr(backends, "BACKENDS", table)
    data = _box_qp()
    route = plan(data, QPOptions(solver="proxqp"), dqp.PenaltyBackward(), warm_start=None)
    assert route.name == "general"
    problem = canonical_problem(*data)
    names = [a.solver for a in fallback_chain(problem, "daqp", 1e-9)]
    assert names[-2:] == ["proxqp", "daqp"]  # the last fallback, then daqp's looser stop
    assert sp.issparse(numpy_views(problem, "proxqp")["P"])
    assert backend("fakeqp") is fake
    assert backend_kwargs("fakeqp", 1e-7, 0.0, {"x": 1}) == {"tol": 1e-7, "x": 1}
    assert not sp.issparse(numpy_views(problem, "fakeqp")["P"])
    # an installed qpsolvers backend without an entry: the default record
    monkeypatch.setattr(backends, "BACKENDS", MappingProxyType({"daqp": BACKENDS["daqp"]}))
    assert backend("piqp") == Backend("piqp")
    assert backend_kwargs("piqp", 1e-9, 0.0, None) == {}


def test_bad_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="call: expected 'daqp' or 'qpsolvers'"):
        Backend("x", call="cvxpy")
    with pytest.raises(ValueError, match="formats: expected a non-empty subset"):
        Backend("x", formats=("csr",))
    with pytest.raises(ValueError, match="formats"):
        Backend("x", formats=())


def test_relative_tolerance_floor_per_entry() -> None:
    for entry in BACKENDS.values():
        kw = entry.tolerances(1e-9, 0.0)
        assert all(kw[k] == 1e-9 for k in entry.abs_keys)
        assert all(kw[k] == backends.BACKEND_RELATIVE_FLOOR for k in entry.rel_keys)
        assert all(entry.tolerances(1e-9, 1e-6)[k] == 1e-6 for k in entry.rel_keys)


def test_one_auto_rule() -> None:
    """The router's ``"auto"`` on raw inputs and ``default_solver`` on the canonical problem
    are the same rule: dense -> daqp, a large LP -> piqp, sparse -> piqp."""
    P, q, A, b, G, h = _box_qp()
    n = 70
    lp = (torch.zeros(n, n, dtype=D), torch.ones(n, dtype=D), None, None,
          -torch.eye(n, dtype=D), torch.zeros(n, dtype=D))  # fmt: skip
    cases = {
        "dense": (P, q, A, b, G, h),
        "lp": lp,
        "sparse": (P.to_sparse(), q, A, b, G, h),
    }
    for kind, data in cases.items():
        assert auto_solver(data) == default_solver(canonical_problem(*data)) == AUTO[kind]
    off_cpu = dataclasses.replace(canonical_problem(P, q), device=torch.device("meta"))
    assert default_solver(off_cpu) == AUTO["device"]


def test_chain_and_lean_route_share_the_one_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both the lean single route (small dense, piqp) and the fallback chain (sparse, piqp)
    call :func:`qpsolvers_attempt`."""
    calls: list[str] = []
    original = backends.qpsolvers_attempt

    def spy(solver, args, **kw):  # type: ignore[no-untyped-def]
        calls.append(solver)
        return original(solver, args, **kw)

    monkeypatch.setattr(backends, "qpsolvers_attempt", spy)
    monkeypatch.setattr(chain, "qpsolvers_attempt", spy)
    monkeypatch.setattr(small, "qpsolvers_attempt", spy)
    P, q, A, b, G, h = _box_qp()
    lean = _solve((P, q, A, b, G, h), solver="piqp")
    assert lean.info.route == "lean_single" and calls == ["piqp"]
    general = _solve((P.to_sparse(), q, A, b, G, h), solver="piqp")
    assert general.info.route == "general" and calls == ["piqp", "piqp"]
    np.testing.assert_allclose(lean.x.numpy(), X_STAR, atol=1e-8)
    np.testing.assert_allclose(general.x.numpy(), X_STAR, atol=1e-8)
