"""Degenerate problems get a documented gradient (flagged and warned), not an exception;
``degenerate="raise"`` keeps the strict behaviour; the backward protocol is an extension point."""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt.qp as dqp

F64 = torch.float64


def _flat_qp(sparse: bool):
    """min 1/2 x1^2 + q'x s.t. -1 <= x2 <= 1 with q2 = 0: every x2 in [-1, 1] is optimal (P is
    singular on the null space of the (empty) active set)."""
    P = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    G = torch.tensor([[0.0, 1.0], [0.0, -1.0]], dtype=F64)
    h = torch.ones(2, dtype=F64)
    if sparse:
        P, G = P.to_sparse(), G.to_sparse()
    return P, torch.tensor([-0.3, 0.0], dtype=F64), G, h


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_non_unique_solution_gets_the_pseudo_inverse_adjoint_on_both_paths(backward: str):
    """A loss constant on the face of solutions (2 x1: x1 = -q1 is unique) gets the
    Moore-Penrose adjoint, which solves the adjoint system exactly, on both paths."""
    grads = []
    for sparse in (False, True):
        P, q, G, h = _flat_qp(sparse)
        q = q.clone().requires_grad_()
        sol = dqp.solve(P, q, G=G, h=h, backward=backward)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (sol.x @ torch.tensor([2.0, 0.0], dtype=F64)).backward()
        flagged = sol.info.backward.pseudo_inverse == (True,)
        assert flagged == any("Moore-Penrose" in str(w.message) for w in caught)
        # the dense penalty's jittered solve meets the system to round-off (no fallback)
        assert flagged or (backward, sparse) == ("penalty", False)
        assert sol.info.backward.residual <= 1e-12
        grads.append(q.grad.clone())  # type: ignore[union-attr]
    # x1 = -q1 exactly: dL/dq1 = -2; the x2 part is the minimum-norm element, 0
    torch.testing.assert_close(grads[0], torch.tensor([-2.0, 0.0], dtype=F64))
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_loss_not_constant_on_the_face_is_refused(backward: str):
    """Issue 35 item 1: 2 x1 + 5 x2 with x2 anywhere in [-1, 1] has no derivative (x2 jumps
    from -1 to 1 as q2 crosses 0); the least-squares adjoint leaves a residual of order 1 and
    was returned as a gradient. It is refused, naming the non-unique solution."""
    for sparse in (False, True):
        P, q, G, h = _flat_qp(sparse)
        q = q.clone().requires_grad_()
        sol = dqp.solve(P, q, G=G, h=h, backward=backward)
        with pytest.raises(dqp.QPBackwardError, match=r"not unique.*not constant on it"):
            (sol.x @ torch.tensor([2.0, 5.0], dtype=F64)).backward()


@pytest.mark.parametrize("method", [dqp.KKTBackward, dqp.PenaltyBackward])
def test_degenerate_raise_keeps_the_strict_behaviour(method):
    P, q, G, h = _flat_qp(False)
    q = q.clone().requires_grad_()
    sol = dqp.solve(P, q, G=G, h=h, backward=method(degenerate="raise"))
    with pytest.raises(dqp.QPBackwardError):
        sol.x.sum().backward()
    with pytest.raises(ValueError, match="degenerate: expected one of"):
        method(degenerate="maybe")


@pytest.mark.parametrize("solver", ["daqp", "piqp"])
def test_weak_rows_pin_an_lp_vertex(solver: str):
    """min x1 s.t. x1 >= 0, x2 >= 0, x2 <= 0: only x1 >= 0 has a multiplier; x2 = 0 is pinned
    by two weakly active rows. x stays 0 under any small change of q, so dx/dq = 0."""
    P = torch.zeros(2, 2, dtype=F64)
    G = torch.tensor([[-1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=F64)
    h = torch.zeros(3, dtype=F64)
    q = torch.tensor([1.0, 0.0], dtype=F64, requires_grad=True)
    sol = dqp.solve(P, q, G=G, h=h, backward="kkt", solver=solver)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        (sol.x @ torch.tensor([1.0, 3.0], dtype=F64)).backward()
    assert sol.info.backward.pseudo_inverse == (False,)
    if solver == "daqp":  # zero multipliers on the x2 rows: weak, kept to pin x2
        assert sol.info.backward.weak_kept
    torch.testing.assert_close(q.grad, torch.zeros(2, dtype=F64))


@pytest.mark.parametrize("solver", ["daqp", "piqp", "clarabel"])
def test_licq_detection_does_not_depend_on_the_backend(solver: str):
    """A duplicated active row: daqp puts the whole multiplier on one copy, interior points
    split it; the backward sees the same dependent active set and returns the same gradient."""
    P = torch.eye(2, dtype=F64)
    G = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=F64)
    h = torch.ones(2, dtype=F64, requires_grad=True)
    q = torch.tensor([-1.0, -1.0], dtype=F64, requires_grad=True)
    sol = dqp.solve(P, q, G=G, h=h, solver=solver)
    with pytest.warns(dqp.QPDegenerateWarning, match="linearly dependent"):
        (sol.x @ torch.tensor([1.0, 0.0], dtype=F64)).backward()
    assert not sol.info.backward.licq
    # x = (1 + h - ... )/2 on the face x1 + x2 = h: dx1/dh = 1/2 split over both copies
    torch.testing.assert_close(h.grad, torch.tensor([0.25, 0.25], dtype=F64))
    torch.testing.assert_close(q.grad, torch.tensor([-0.5, 0.5], dtype=F64))


def test_backward_protocol_is_an_extension_point():
    """Any object with ``name`` and ``solve_adjoint`` is accepted (no isinstance checks)."""

    class Logged:
        name = "logged-kkt"

        def __init__(self) -> None:
            self.calls = 0
            self.inner = dqp.KKTBackward()

        def solve_adjoint(self, data, diagnostics):  # type: ignore[no-untyped-def]
            self.calls += 1
            return self.inner.solve_adjoint(data, diagnostics)

    method = Logged()
    assert isinstance(method, dqp.BackwardMethod)
    P = torch.eye(2, dtype=F64)
    q = torch.tensor([-1.0, 0.5], dtype=F64, requires_grad=True)
    G, h = torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([0.5], dtype=F64)
    dqp.solve(P, q, G=G, h=h, backward=method).x.sum().backward()
    assert method.calls == 1
    torch.testing.assert_close(q.grad, torch.tensor([0.0, -1.0], dtype=F64))
    with pytest.raises(ValueError, match="backward: expected 'penalty', 'kkt' or a backward"):
        dqp.solve(P, q, G=G, h=h, backward=object())
