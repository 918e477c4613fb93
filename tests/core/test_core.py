"""The shared spine: status, failure policy, errors, cost record, validators, renames."""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass

import pytest
import torch

from dxopt._core import (
    Cost,
    DxoptError,
    DxoptWarning,
    NotConvergedError,
    Status,
    check_choice,
    check_int,
    check_on_failure,
    check_positive,
    check_range,
    check_tensor,
    handle_failure,
    renamed_kwargs,
)


def test_status_messages_and_aliases():
    for s in Status:
        assert isinstance(s.message, str) and s.message
    assert Status.CONVERGED is Status.SOLVED
    assert Status.MAX_ITERATIONS is Status.MAX_ITER
    assert Status.SOLVED.ok and not Status.MAX_ITER.ok and not Status.FAILED.ok


def test_error_base_is_runtime_error_and_pickles():
    err = NotConvergedError("cg stalled", status=Status.MAX_ITER)
    assert isinstance(err, DxoptError) and isinstance(err, RuntimeError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NotConvergedError and str(back) == "cg stalled"
    assert back.status is Status.MAX_ITER


def test_failure_policy():
    with pytest.raises(ValueError, match="on_failure: expected one of 'raise', 'warn'"):
        check_on_failure("report", ("raise", "warn"))
    with pytest.raises(NotConvergedError, match="boom"):
        handle_failure("raise", "boom", error=NotConvergedError)
    with pytest.warns(DxoptWarning, match="boom"):
        handle_failure("warn", "boom")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle_failure("ignore", "boom")


def test_cost_adds_and_sums():
    a = Cost(forwards=1, hvps=2, flops=10)
    b = Cost(backwards=3, grad_f=1, jvps=4)
    c = a + b
    assert c == Cost(forwards=1, backwards=3, hvps=2, jvps=4, grad_f=1, flops=10)
    assert sum([a, b]) == c
    assert c.oracle_calls == 1 + 2 + 4 and c.total == 1 + 3 + 7
    assert (Cost() + Cost()).flops is None
    assert c.hvp == 2 and c.jvp == 4
    assert repr(Cost(grad_f=2)) == "Cost(grad_f=2)"


def test_validators_name_argument_and_value():
    with pytest.raises(ValueError, match=r"lr: expected a positive finite number, got -1; use"):
        check_positive("lr", -1, hint="use 1/L.")
    assert check_positive("lr", 0, allow_zero=True) == 0.0
    import numpy as np

    assert check_positive("lr", np.float32(0.5)) == 0.5
    assert check_int("max_iter", np.int64(3)) == 3
    with pytest.raises(ValueError, match="lr: expected a positive finite number"):
        check_positive("lr", float("nan"))
    with pytest.raises(ValueError, match=r"max_iter: expected an integer >= 1, got True"):
        check_int("max_iter", True)
    with pytest.raises(ValueError, match=r"momentum: expected a number in \[0, 1\), got 1.0"):
        check_range("momentum", 1.0, 0, 1)
    with pytest.raises(ValueError, match=r"method: expected one of 'cg', 'neumann', got 'x'"):
        check_choice("method", "x", ("cg", "neumann"))
    with pytest.raises(TypeError, match=r"y0: expected a torch\.Tensor, got list"):
        check_tensor("y0", [1.0])
    with pytest.raises(ValueError, match=r"y0: expected shape \(3,\), got \(2,\)"):
        check_tensor("y0", torch.zeros(2), shape=(3,))
    with pytest.raises(ValueError, match="x: expected finite values"):
        check_tensor("x", torch.tensor([float("nan")]), finite=True)


def test_renamed_kwargs_function_and_dataclass():
    @renamed_kwargs(maxiter="max_iter")
    def solve(*, max_iter: int = 1) -> int:
        return max_iter

    with pytest.warns(DeprecationWarning, match="'maxiter' is renamed 'max_iter'"):
        assert solve(maxiter=5) == 5
    with pytest.raises(TypeError, match="pass only 'max_iter'"):
        solve(maxiter=5, max_iter=6)

    @renamed_kwargs(steps="max_iter")
    @dataclass(frozen=True)
    class Loop:
        max_iter: int

    with pytest.warns(DeprecationWarning):
        assert Loop(steps=3) == Loop(max_iter=3)


def test_input_errors_reraises_validator_errors_as_the_given_classes():
    from dxopt._core import input_errors

    class MyValueError(DxoptError, ValueError):
        pass

    class MyTypeError(DxoptError, TypeError):
        pass

    as_mine = input_errors(MyValueError, MyTypeError)
    with pytest.raises(MyValueError, match=r"k: expected an integer >= 1, got 0") as info, as_mine:
        check_int("k", 0)
    assert info.value.__cause__ is None and isinstance(info.value, ValueError)
    with (
        pytest.raises(MyTypeError, match=r"x: expected a torch\.Tensor, got list"),
        input_errors(MyValueError, MyTypeError),
    ):
        check_tensor("x", [1.0])
    # other errors pass through untouched
    with pytest.raises(KeyError), input_errors(MyValueError, MyTypeError):
        raise KeyError("k")
