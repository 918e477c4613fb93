"""``warm_start=`` with a previous :class:`dxopt.qp.QPSolution` (``solve``, ``QPLayer``): the
warm answer is the cold one, a bad warm start still gives the right answer and status, and a
failed warm daqp solve is retried cold in the fallback chain."""

from __future__ import annotations

import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.api.solve import solve_with
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.solvers.chain import FallbackChain
from dxopt.qp.solvers.daqp import DaqpPoint

F64 = torch.float64


def _problem(batch: int | None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, m = 6, 8
    lead = () if batch is None else (batch,)
    L = torch.randn(*lead, n, n, dtype=F64, generator=g)
    P = L @ L.transpose(-1, -2) + 0.5 * torch.eye(n, dtype=F64)
    q = torch.randn(*lead, n, dtype=F64, generator=g)
    G = torch.randn(m, n, dtype=F64, generator=g)
    h = 0.2 * torch.rand(m, dtype=F64, generator=g)
    return P, q, G, h


def _assert_same(warm: dqp.QPSolution, cold: dqp.QPSolution) -> None:
    assert warm.status == cold.status and all(s is dqp.QPStatus.SOLVED for s in cold.status)
    torch.testing.assert_close(warm.x, cold.x, rtol=0, atol=1e-9)
    assert warm.ineq_duals is not None and cold.ineq_duals is not None
    torch.testing.assert_close(warm.ineq_duals, cold.ineq_duals, rtol=0, atol=1e-8)


@pytest.mark.parametrize(("batch", "solver"), [(None, "auto"), (5, "daqp"), (5, "piqp")])
def test_warm_from_previous_solution_equals_cold(batch, solver):
    P, q, G, h = _problem(batch)
    first = dqp.solve(P, q, G=G, h=h, solver=solver)
    assert first.ineq_duals is not None and (first.ineq_duals > 1e-8).any()  # active rows
    q2 = q + 1e-2 * torch.sin(torch.arange(q.numel(), dtype=F64)).reshape(q.shape)
    cold = dqp.solve(P, q2, G=G, h=h, solver=solver)
    warm = dqp.solve(P, q2, G=G, h=h, warm_start=first, solver=solver)
    _assert_same(warm, cold)


def test_batched_warm_start_keeps_the_compiled_batch_solver():
    """``solver="auto"`` on a batch: the compiled solver keeps the batch, started from the
    previous solution's working sets (not turned into daqp's slower per-sample route)."""
    P, q, G, h = _problem(8)
    first = dqp.solve(P, q, G=G, h=h)
    warm = dqp.solve(P, q, G=G, h=h, warm_start=first)
    assert first.info.solver == warm.info.solver == "dual_active_set"
    assert all(warm.info.warm_started) and sum(warm.info.iterations) == 0  # the same problem
    _assert_same(warm, first)


def test_bad_warm_start_still_gives_the_cold_answer():
    P, q, G, h = _problem(4, seed=1)
    cold = dqp.solve(P, q, G=G, h=h, solver="daqp")
    far = dqp.solve(P, -q, G=G, h=h, solver="daqp")  # another problem's: another active set
    _assert_same(dqp.solve(P, q, G=G, h=h, warm_start=far, solver="daqp"), cold)
    far = type(far)(1e3 * torch.ones_like(far.x), None, far.ineq_duals, far.status, far.info)
    _assert_same(dqp.solve(P, q, G=G, h=h, warm_start=far, solver="daqp"), cold)
    _assert_same(
        dqp.solve(P[0], q[0], G=G, h=h, warm_start=far.x[0]), dqp.solve(P[0], q[0], G=G, h=h)
    )


def test_layer_takes_a_previous_solution():
    P, q, G, h = _problem(3, seed=2)
    layer = dqp.QPLayer(solver="daqp")
    qg = q.clone().requires_grad_()
    first = layer(P, qg, G=G, h=h)
    warm = layer(P, qg, G=G, h=h, warm_start=first)
    _assert_same(warm, first)
    (grad_warm,) = torch.autograd.grad(warm.x.sum(), qg)
    (grad_cold,) = torch.autograd.grad(first.x.sum(), qg)
    torch.testing.assert_close(grad_warm, grad_cold, rtol=0, atol=1e-9)


def test_failed_warm_daqp_start_is_retried_cold(monkeypatch):
    """A daqp solve that fails from the warm start alone: the chain retries it cold, so the
    sample is still daqp's (without the retry it falls to the next backend of the chain)."""
    real = FallbackChain._call_daqp

    def warm_fails(self, i, kw, init):
        if init is not None:
            return DaqpPoint(None, None, None, -1)
        return real(self, i, kw, init)

    monkeypatch.setattr(FallbackChain, "_call_daqp", warm_fails)
    P, q, G, h = _problem(2, seed=3)
    options = QPOptions(solver="daqp")
    cold = solve_with(P, q, None, None, G, h, None, None, None, options, route="general")
    warm = solve_with(P, q, None, None, G, h, None, None, cold, options, route="general")
    _assert_same(warm, cold)
    assert warm.info.sample_solvers == ("daqp", "daqp")


def test_warm_start_of_the_wrong_type_is_refused():
    P, q, G, h = _problem(None)
    with pytest.raises(TypeError, match=r"warm_start: expected a tensor .* got list"):
        dqp.solve(P, q, G=G, h=h, warm_start=[0.0] * 6)  # type: ignore[arg-type]


@pytest.mark.parametrize("solver", ["auto", "daqp"])
def test_cvxpy_layer_takes_its_previous_solution(monkeypatch, solver):
    """The canonical QP's previous solutions reach ``dxopt.qp.solve`` as warm starts (the
    spy sees them), and the answer is the cold one."""
    cp = pytest.importorskip("cvxpy")
    import dxopt.qp.api.layer as layer_module

    x = cp.Variable(3)
    theta = cp.Parameter(3)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(x) + theta @ x), [x >= 0, cp.sum(x) <= 1])
    layer = dqp.CvxpyQPLayer(problem, parameters=[theta], variables=[x], solver=solver)
    values = torch.tensor([[-0.3, 0.4, -2.0], [-2.0, -1.0, 0.5]], dtype=F64)
    cold = layer.solve(values)
    seen = []
    real = layer_module.solve_with

    def spy(*args, **kwargs):
        seen.append(args[8])
        return real(*args, **kwargs)

    monkeypatch.setattr(layer_module, "solve_with", spy)
    warm = layer.solve(values + 1e-3, warm_start=cold)
    assert seen and seen[0] is cold.solutions[0]
    again = layer.solve(values + 1e-3)
    assert warm.status == again.status
    torch.testing.assert_close(warm.values[0], again.values[0], rtol=0, atol=1e-9)
    with pytest.raises(TypeError, match="warm_start: expected this layer's previous"):
        layer.solve(values, warm_start=cold.solutions[0])  # type: ignore[arg-type]
