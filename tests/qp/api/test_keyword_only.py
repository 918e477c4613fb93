"""Issue 28 item 5, the argument-order trap: qpsolvers and qpth take ``(P, q, G, h, A, b)``,
dxopt's positional order was ``(P, q, A, b, G, h)``, so ``solve(P, q, G, h)`` silently solved
``G x = h`` as equalities. Every argument after ``q`` is keyword-only; after one release of
warning (the helper :func:`positional_deprecated` is still tested below), positional use is
a ``TypeError`` (issue 35 item 3)."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import dxopt.qp as dqp
from dxopt._core import positional_deprecated

F64 = torch.float64


def _box_problem() -> tuple[torch.Tensor, ...]:
    """min 1/2||x||^2 - 2*1'x s.t. x <= 1: the inequality is active, x = (1, 1)."""
    P = torch.eye(2, dtype=F64)
    q = torch.tensor([-2.0, -2.0], dtype=F64)
    G = torch.eye(2, dtype=F64)
    h = torch.tensor([1.0, 0.5], dtype=F64)
    return P, q, G, h


@pytest.mark.parametrize("target", ["solve", "layer"])
def test_parameters_after_q_are_keyword_only(target: str) -> None:
    fn = dqp.solve if target == "solve" else dqp.QPLayer.forward
    params = inspect.signature(fn).parameters
    names = list(params)
    start = names.index("q") + 1
    kinds = {name: params[name].kind for name in names[start:]}
    assert kinds, "expected parameters after q"
    assert set(kinds.values()) == {inspect.Parameter.KEYWORD_ONLY}, kinds


@pytest.mark.parametrize("n_positional", [1, 2, 4])
def test_positional_call_is_a_type_error_saying_to_pass_keywords(n_positional: int) -> None:
    """Issue 35 item 3: the trap solve(P, q, G, h) (qpsolvers' order) and solve(P, q, G, h, A,
    b) (qpth's) used to bind G, h to A, b and solve G x = h as equalities behind a hidden
    DeprecationWarning; after that release they raise a TypeError saying to use keywords."""
    P, q, G, h = _box_problem()
    extra = (G, h, G[:1], h[:1])[:n_positional]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a TypeError, not a warning first
        with pytest.raises(TypeError, match=r"keyword-only. Pass them by keyword \(A=") as err:
            dqp.solve(P, q, *extra)
    assert "G=G, h=h" in str(err.value)  # the note says how to write the call
    new = dqp.solve(P, q, G=G, h=h)
    torch.testing.assert_close(new.x, torch.tensor([1.0, 0.5], dtype=F64))
    new_ineq = dqp.solve(P, q, G=G, h=torch.tensor([3.0, 3.0], dtype=F64))
    torch.testing.assert_close(new_ineq.x, torch.tensor([2.0, 2.0], dtype=F64))  # inactive


def test_layer_positional_call_is_a_type_error() -> None:
    P, q, G, h = _box_problem()
    layer = dqp.QPLayer()
    A, b = torch.ones(1, 2, dtype=F64), torch.ones(1, dtype=F64)
    with pytest.raises(TypeError, match=r"QPLayer.forward: .*\(A=, b=, G=, h=\.\.\.\)"):
        layer(P, q, A, b, G, h)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = layer(P, q, A=A, b=b, G=G, h=h)
    assert new.x.shape == (2,)


def test_too_many_positional_arguments_is_a_type_error() -> None:
    P, q, G, h = _box_problem()
    with pytest.raises(TypeError, match="expected 2 positional argument"):
        dqp.solve(P, q, None, None, G, h, None)


def test_helper_binds_in_order_and_keeps_the_signature() -> None:
    @positional_deprecated("a", "b", leading=1, note="Why.")
    def f(x: int, *, a: int = 0, b: int = 0) -> tuple[int, int, int]:
        return x, a, b

    kinds = [p.kind for p in inspect.signature(f).parameters.values()]
    assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD] + [inspect.Parameter.KEYWORD_ONLY] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1, b=3) == (1, 0, 3)
    with pytest.warns(DeprecationWarning, match=r"to a; .*\(a=\.\.\.\)\. Why\.$"):
        assert f(1, 2) == (1, 2, 0)
