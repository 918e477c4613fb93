"""The lean single path's per-call shortcuts give what the long way gives: the pointer copy
(dxopt.qp.lean.fused.copy_in) the numpy-view copy's arrays and statuses bit for bit, the fused
certificate the two kernels' results, the call without an input that requires grad the outputs
of the call with one, and the one-sample diagnostics record the batch record's fields."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.backward.kkt import KKTBackward
from dxopt.qp.backward.penalty import PenaltyBackward
from dxopt.qp.lean import small as _small
from dxopt.qp.lean import small_backward as _sb
from dxopt.qp.lean.fused import copy_in, readable
from dxopt.qp.lean.lean_check import SYMMETRY_TOL
from dxopt.qp.problem.types import BackwardDiagnostics

NAMES = ("P", "q", "A", "b", "G", "h")


def _problem(n: int, m: int, p: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((n, n))
    x0 = rng.standard_normal(n)
    data = {"P": M @ M.T + 0.5 * np.eye(n), "q": rng.standard_normal(n)}
    if p:
        data["A"] = rng.standard_normal((p, n))
        data["b"] = data["A"] @ x0
    if m:
        data["G"] = rng.standard_normal((m, n))
        data["h"] = data["G"] @ x0 + rng.uniform(0.0, 1.0, m) * (rng.random(m) < 0.5)
    return {k: torch.tensor(data[k], dtype=torch.float64) if k in data else None for k in NAMES}


def _views(data: dict) -> tuple:
    return _small._copy_views(tuple(data[k] for k in NAMES))


def _same(a: tuple, b: tuple) -> None:
    assert a[0] == b[0]
    for u, v in zip(a[1:], b[1:]):
        assert u.shape == v.shape and u.dtype == v.dtype
        assert np.array_equal(u, v)


@pytest.mark.parametrize(("n", "m", "p"), [(10, 5, 0), (6, 0, 2), (7, 4, 3), (1, 1, 0), (5, 0, 0)])
def test_copy_in_equals_the_view_copy(n: int, m: int, p: int) -> None:
    data = _problem(n, m, p, seed=n + 10 * m + 100 * p)
    got = copy_in(*(data[k] for k in NAMES), SYMMETRY_TOL[torch.float64])
    assert got is not None and got[0] == 0
    _same(got, _views(data))
    assert np.array_equal(got[1], data["P"].numpy())
    if m:
        assert np.array_equal(got[3][:m], data["G"].numpy())
        assert np.array_equal(got[4][:m], data["h"].numpy())
        assert np.array_equal(got[5], np.abs(data["G"].numpy()).max(axis=1))
    if p:
        assert np.array_equal(got[3][m:], data["A"].numpy())
        assert np.array_equal(got[4][m:], data["b"].numpy())


def test_copy_in_statuses_are_prepares() -> None:
    """NaN/Inf (1), an asymmetric P (2), a zero row of G (3): the same status both ways."""
    base = _problem(6, 3, 1, seed=3)
    cases = []
    bad = dict(base, q=base["q"].clone())
    bad["q"][2] = float("nan")
    cases.append((bad, 1))
    bad = dict(base, h=base["h"].clone())
    bad["h"][0] = float("inf")
    cases.append((bad, 1))
    bad = dict(base, P=base["P"].clone())
    bad["P"][0, 1] += 1e-3
    cases.append((bad, 2))
    bad = dict(base, G=base["G"].clone())
    bad["G"][1] = 0.0
    cases.append((bad, 3))
    for data, status in cases:
        got = copy_in(*(data[k] for k in NAMES), SYMMETRY_TOL[torch.float64])
        assert got is not None and got[0] == status
        assert _views(data)[0] == status


def test_copy_in_declines_what_it_cannot_read() -> None:
    """Non-contiguous, negative-bit, float32 and sparse inputs: ``None`` (the numpy views)."""
    data = _problem(5, 3, 0, seed=1)
    tol = SYMMETRY_TOL[torch.float64]
    P, q, G, h = data["P"], data["q"], data["G"], data["h"]
    wide = torch.zeros(3, 10, dtype=torch.float64)
    wide[:, ::2] = G
    assert not readable(wide[:, ::2])
    assert copy_in(P, q, None, None, wide[:, ::2], h, tol) is None
    assert copy_in(P.t(), q, None, None, G, h, tol) is None  # column-major
    offset = copy_in(P, q, None, None, G[1:], h[1:], tol)  # contiguous rows at an offset: read
    assert offset is not None and np.array_equal(offset[3], G[1:].numpy())
    assert copy_in(torch._neg_view(-P), q, None, None, G, h, tol) is None
    assert copy_in(P.float(), q.float(), None, None, G.float(), h.float(), tol) is None
    assert copy_in(P.to_sparse(), q, None, None, G, h, tol) is None


def test_solve_through_the_view_copy_is_the_same() -> None:
    """A problem given as views copy_in does not read solves to the same bits."""
    data = _problem(8, 4, 2, seed=5)
    sol = dqp.solve(data["P"], data["q"], A=data["A"], b=data["b"], G=data["G"], h=data["h"])
    wide = torch.zeros(4, 16, dtype=torch.float64)
    wide[:, ::2] = data["G"]
    other = dqp.solve(data["P"], data["q"], A=data["A"], b=data["b"], G=wide[:, ::2], h=data["h"])
    assert other.info.route == sol.info.route == "lean_single"
    assert torch.equal(sol.x, other.x) and torch.equal(sol.ineq_duals, other.ineq_duals)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_outputs_without_grad_are_the_graphs(dtype: torch.dtype) -> None:
    """No input requires grad (or grad mode off): no node, the same outputs bit for bit."""
    data = {k: None if v is None else v.to(dtype) for k, v in _problem(9, 5, 2, 2).items()}
    leaves = {k: None if v is None else v.clone().requires_grad_() for k, v in data.items()}
    with_graph = dqp.solve(**leaves)
    plain = dqp.solve(**data)
    with torch.no_grad():
        off = dqp.solve(**leaves)
    assert with_graph.x.grad_fn is not None
    for sol in (plain, off):
        assert sol.info.route == "lean_single"
        for key in ("x", "eq_duals", "ineq_duals"):
            out, ref = getattr(sol, key), getattr(with_graph, key)
            assert out.grad_fn is None and not out.requires_grad
            assert out.dtype == dtype and torch.equal(out, ref.detach())


def test_a_dead_functorch_wrapper_still_gets_its_gradient() -> None:
    """An input leaked out of a torch.func transform whose wrapper does not require grad but
    whose value does is unwrapped before the shortcut looks: its gradient still flows."""
    data = _problem(6, 3, 0, seed=4)
    q = data["q"].clone().requires_grad_()
    leaked = []

    def f(y: torch.Tensor) -> torch.Tensor:
        leaked.append(q + 0.0 * y.sum())  # q's graph inside the transform's level
        return (y * y).sum()

    torch.func.grad(f)(torch.ones(2, dtype=torch.float64))
    wrapper = leaked[0]
    sol = dqp.solve(data["P"], wrapper, G=data["G"], h=data["h"])
    ref = dqp.solve(data["P"], q, G=data["G"], h=data["h"])
    w = torch.arange(6, dtype=torch.float64)
    (g,) = torch.autograd.grad((w * ref.x).sum(), q)
    assert sol.x.requires_grad
    (g2,) = torch.autograd.grad((w * sol.x).sum(), q)
    assert torch.equal(g, g2)


METHODS = [PenaltyBackward(), PenaltyBackward(beta=1e-7), PenaltyBackward(beta_min=1e-10)]


@pytest.mark.parametrize("method", [*METHODS, KKTBackward()])
def test_one_sample_record_is_the_batch_record(method: object) -> None:
    regular = _sb.regular_settings(method)
    one, batch = BackwardDiagnostics(), BackwardDiagnostics()
    _sb._record_one(one, 3.5e-15, 2, 4, 2.5e-14, regular)
    _sb.record_diagnostics(batch, method, 3.5e-15, 2, (4,), (2.5e-14,), regular)
    assert dataclasses.asdict(one) == dataclasses.asdict(batch)
    assert list(vars(one)) == list(vars(batch))  # the fields in their order
    assert one.method == method.name and one.n_active == (4,)


@pytest.mark.parametrize("seed", range(6))
def test_certify_exact_is_the_two_kernels(seed: int) -> None:
    """At daqp's points (and at a perturbed, uncertified one): the same ``ok``, residuals and
    copies as certify_point, and may_be_dependent's answer where it applies."""
    from dxopt.qp.certify.tolerances import RELATIVE_FLOOR, ROUNDOFF
    from dxopt.qp.lean.fused import certify_exact
    from dxopt.qp.solvers.kernels.certify import certify_point, may_be_dependent

    n, m, p = 6, 4 + seed % 3, seed % 2
    data = _problem(n, m, p, seed=seed)
    if seed == 5:  # a degenerate vertex: two copies of an active row (row 1: 7.09 > 0)
        data["G"] = torch.cat([data["G"], data["G"][1:2]])
        data["h"] = torch.cat([data["h"], data["h"][1:2]])
        m += 1
    _, Pn, qn, C, upper, g_inf = _views(data)
    lower, sense = _small.daqp_bounds(m, p)
    x, _, flag, info = _small.daqp_module().solve(Pn, qn, C, upper, lower, sense, eps_prox=0.0)
    assert flag in (1, 2)
    duals, working = info["lam"], np.zeros(0, dtype=bool)
    found = []
    for point in (x, x + 1e-3):
        outs = [(np.empty(n), np.empty(p), np.empty(m)) for _ in range(2)]
        args = (Pn, qn, C, upper, m, point, duals, working, g_inf, 1e-9, RELATIVE_FLOOR, ROUNDOFF)
        ok, primal, dual, dependent = certify_exact(*args, *outs[0])
        assert (ok, primal, dual) == certify_point(*args, *outs[1])
        for a, b in zip(*outs):
            assert np.array_equal(a, b)
        want = ok and may_be_dependent(C, upper, m, point, duals, 1e-9, RELATIVE_FLOOR)
        assert dependent == want
        found.append((ok, dependent))
    assert found[0] == (True, seed == 5)  # daqp's point; the copied row: maybe dependent
    assert found[1] == (False, False)  # the perturbed point does not certify
