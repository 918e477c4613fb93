"""The shared regular-adjoint ladder, the exact fallback as a value, the degenerate policy as a
list of attempts and its one warnings collector (issue 29 item 6; issue 30: warn once per
call, at the user's line)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _ref_problems import relative_error
from qp_zoo import complementary_qp

import dxopt.qp as dqp
import dxopt.qp.backward.base as base
from dxopt.qp.backward.regular import RegularBudget
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.contracts import AdjointInput, ForwardFactors
from dxopt.qp.problem.types import BackwardDiagnostics

F64 = torch.float64


def _degenerate_qp() -> tuple[torch.Tensor, ...]:
    """Two copies of ``x1 <= 0`` active at the solution (LICQ fails) and a row with slack."""
    P = torch.eye(2, dtype=F64)
    q = torch.tensor([-1.0, -2.0], dtype=F64)
    G = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
    h = torch.tensor([0.0, 0.0, 5.0, 5.0], dtype=F64)
    return P, q, G, h


def _mine(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, dqp.QPDegenerateWarning)]


@pytest.mark.parametrize("method", [dqp.KKTBackward(), dqp.PenaltyBackward()])
def test_both_methods_climb_the_one_ladder_with_their_budget(monkeypatch, method) -> None:
    """KKT and penalty share :func:`dxopt.qp.backward.regular.regular_adjoint`; they differ
    only in the budget (the penalty's max_refinement/refine_tol, the KKT's fixed steps). The
    adjoint is the exact reduced-KKT one at the known solution."""
    seen = []
    real = base.regular_adjoint

    def spy(data, active, budget):  # type: ignore[no-untyped-def]
        seen.append(budget)
        return real(data, active, budget)

    monkeypatch.setattr(base, "regular_adjoint", spy)
    prob = complementary_qp(8, m=6, p=2, seed=1)
    grad_x = torch.linspace(-1.0, 1.0, 8, dtype=F64)
    adj_in = AdjointInput(
        problem=canonical_problem(*prob.args()),
        x=prob.x[None],  # type: ignore[index]
        eq_duals=prob.eq_duals[None],  # type: ignore[index]
        ineq_duals=prob.ineq_duals[None],  # type: ignore[index]
        grad_x=grad_x[None],
        grad_eq=torch.zeros(1, 2, dtype=F64),
        grad_ineq=torch.zeros(1, 6, dtype=F64),
        ok=torch.ones(1, dtype=torch.bool),
    )
    diagnostics = BackwardDiagnostics()
    out = method.solve_adjoint(adj_in, diagnostics)
    assert seen == [method.regular_budget()]
    assert diagnostics.linear_solver == "schur" and diagnostics.method == method.name
    P, G, A = prob.P, prob.G, prob.A
    assert G is not None and A is not None
    J = out.active.used[0]
    C = torch.cat([G[J], A])
    k = C.shape[0]
    K = torch.zeros(8 + k, 8 + k, dtype=F64)
    K[:8, :8], K[:8, 8:], K[8:, :8] = P, C.T, C
    exact = torch.linalg.solve(K, torch.cat([grad_x, torch.zeros(k, dtype=F64)]))
    assert relative_error(out.u[0], exact[:8]) <= 1e-10
    assert relative_error(torch.cat([out.w_ineq[0, J], out.w_eq[0]]), exact[8:]) <= 1e-10


def test_budgets_and_exact_fallback_are_values() -> None:
    kkt = dqp.KKTBackward(max_residual=1e-7)
    pen = dqp.PenaltyBackward(max_refinement=7, refine_tol=1e-12)
    assert kkt.regular_budget() == RegularBudget(1e-13, 5, 1e-7)
    assert pen.regular_budget() == RegularBudget(1e-12, 7, 1e-8)
    assert dqp.PenaltyBackward(max_refinement=0).regular_budget() is None  # plain dXPP
    assert kkt.exact_fallback() is None
    exact = dqp.PenaltyBackward(linear_solver="sparse", max_residual=1e-6).exact_fallback()
    assert exact == dqp.KKTBackward(linear_solver="sparse", max_residual=1e-6)


def test_degenerate_policy_is_a_list_of_attempts() -> None:
    names = [a.name for a in dqp.KKTBackward().degenerate_attempts()]
    assert names == ["rule", "weak_kept", "pseudo_inverse"]
    assert [a.name for a in dqp.PenaltyBackward(degenerate="raise").degenerate_attempts()] == [
        "rule"
    ]


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_failed_attempts_leave_no_warning_and_the_last_one_warns_once(backward: str) -> None:
    """P singular on the null space of the active rows (x2 free in [-1, 1]). A loss constant
    on that face (x1 = -q1): the kkt rule attempt fails and the pseudo-inverse answers, only
    its warning issued, once, at this file's line (the penalty's jittered solve meets the
    system to round-off with the same minimum-norm adjoint). A loss that is not (x1 + x2) is
    refused (issue 35 item 1), and the failed attempts leave no warning either."""
    P = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    G = torch.tensor([[0.0, 1.0], [0.0, -1.0]], dtype=F64)
    q = torch.tensor([-0.3, 0.0], dtype=F64, requires_grad=True)
    sol = dqp.solve(P, q, G=G, h=torch.ones(2, dtype=F64), backward=backward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol.x[0].backward()
    mine = _mine(caught)
    torch.testing.assert_close(q.grad, torch.tensor([-1.0, 0.0], dtype=F64))
    if backward == "kkt":
        assert [("Moore-Penrose" in str(w.message)) for w in mine] == [True]
        assert mine[0].filename == __file__
        assert sol.info.backward.pseudo_inverse == (True,)
    q2 = q.detach().clone().requires_grad_()
    sol = dqp.solve(P, q2, G=G, h=torch.ones(2, dtype=F64), backward=backward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(dqp.QPBackwardError, match="not unique"):
            sol.x.sum().backward()
    assert not _mine(caught)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_vjp_warns_once_per_call_at_the_callers_line(backward: str) -> None:
    P, q, G, h = _degenerate_qp()
    h = h.expand(3, 4).clone().requires_grad_()  # a batch: still one warning per call
    sol = dqp.solve(P, q, G=G, h=h, backward=backward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol.x.sum().backward()
    mine = _mine(caught)
    assert len(mine) == 1, [str(w.message) for w in mine]
    assert mine[0].filename == __file__
    assert sol.info.backward.dependent_rows == (1, 1, 1)  # the counts stay in sol.info
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=dqp.QPDegenerateWarning)  # the off switch
        dqp.solve(P, q, G=G, h=h.detach().requires_grad_()).x.sum().backward()
    assert not _mine(caught)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_jvp_warns_once_per_call_at_the_callers_line(backward: str) -> None:
    """Regression: the forward-mode tangent named ``_core/validate.py`` (the keyword-only
    wrapper) and warned twice (the tangent solve and the rule's record)."""
    P, q, G, h = _degenerate_qp()

    def x_of(hh: torch.Tensor) -> torch.Tensor:
        return dqp.solve(P, q, G=G, h=hh, backward=backward).x

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, dx = torch.func.jvp(x_of, (h,), (torch.ones(4, dtype=F64),))
    mine = _mine(caught)
    assert len(mine) == 1, [(w.filename, str(w.message)) for w in mine]
    assert mine[0].filename == __file__
    assert torch.isfinite(dx).all()


def test_forward_factors_take_samples_by_index_and_mask() -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in ((4, 3, 3), (4, 5, 3), (4, 2), (4, 2, 2))]
    factors = ForwardFactors(*arrays)
    picked = factors.take(np.array([2, 0]))
    mask = factors.take(np.array([True, False, True, False]))
    for got, by_mask, a in zip(
        (picked.chol_P, picked.rows, picked.working_set, picked.schur_chol),
        (mask.chol_P, mask.rows, mask.working_set, mask.schur_chol),
        arrays,
    ):
        np.testing.assert_array_equal(got, a[[2, 0]])
        np.testing.assert_array_equal(by_mask, a[[0, 2]])
    with pytest.raises(AttributeError):
        factors.chol_P = arrays[0]  # type: ignore[misc]  # frozen
