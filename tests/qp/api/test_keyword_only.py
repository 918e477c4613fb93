"""Issue 28 item 5, the argument-order trap: qpsolvers and qpth take ``(P, q, G, h, A, b)``,
dxopt's positional order was ``(P, q, A, b, G, h)``, so ``solve(P, q, G, h)`` silently solved
``G x = h`` as equalities. Every argument after ``q`` is keyword-only now; positional use
still works for one release and warns, naming the arguments it bound."""

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


def test_positional_call_warns_and_names_what_it_bound() -> None:
    """The trap: the qpsolvers order solve(P, q, G, h) binds G, h to A, b; the warning names
    the binding and the call still does what it did (equalities), for one release."""
    P, q, G, h = _box_problem()
    with pytest.warns(DeprecationWarning, match=r"bound, in order, to A, b;") as record:
        old = dqp.solve(P, q, G, h)
    assert "solve(P, q, G, h) solved G x = h" in str(record[0].message)
    assert record[0].filename == __file__  # points at the caller
    torch.testing.assert_close(old.x, torch.tensor([1.0, 0.5], dtype=F64))  # Gx = h
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the keyword call raises no warning
        new = dqp.solve(P, q, G=G, h=h)
    torch.testing.assert_close(new.x, torch.tensor([1.0, 0.5], dtype=F64))
    new_ineq = dqp.solve(P, q, G=G, h=torch.tensor([3.0, 3.0], dtype=F64))
    torch.testing.assert_close(new_ineq.x, torch.tensor([2.0, 2.0], dtype=F64))  # inactive


def test_layer_positional_call_warns_at_the_caller() -> None:
    P, q, G, h = _box_problem()
    layer = dqp.QPLayer()
    A, b = torch.ones(1, 2, dtype=F64), torch.ones(1, dtype=F64)
    with pytest.warns(DeprecationWarning, match=r"to A, b, G, h;") as record:
        old = layer(P, q, A, b, G, h)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = layer(P, q, A=A, b=b, G=G, h=h)
    torch.testing.assert_close(old.x, new.x)


def test_positional_and_keyword_twice_or_too_many_is_a_type_error() -> None:
    P, q, G, h = _box_problem()
    with pytest.raises(TypeError, match="'A' both positionally and by keyword"):
        dqp.solve(P, q, G, A=G)
    with pytest.raises(TypeError, match="at most 6 positional arguments"):
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
