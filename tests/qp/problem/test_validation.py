"""Every bad-input path raises a ValueError/TypeError naming the argument."""

from __future__ import annotations

import pytest
import torch
from qp_zoo import complementary_qp

import dxopt.qp as dqp


@pytest.fixture
def args() -> dict[str, torch.Tensor]:
    d = complementary_qp(5, m=4, p=2, seed=0)
    return {"P": d.P, "q": d.q, "A": d.A, "b": d.b, "G": d.G, "h": d.h}  # type: ignore[dict-item]


def _call(args: dict[str, torch.Tensor], **changes: object) -> None:
    merged = {**args, **changes}
    dqp.solve(merged.pop("P"), merged.pop("q"), **merged)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value", "pattern"),
    [
        ("q", torch.zeros(4, dtype=torch.float64), "P: expected 4 columns"),
        ("P", torch.eye(4, 5, dtype=torch.float64), "P: expected shape"),
        ("A", torch.zeros(2, 6, dtype=torch.float64), "A: expected 5 columns"),
        ("b", torch.zeros(3, dtype=torch.float64), "b: expected 2 entries"),
        ("G", torch.zeros(4, 3, dtype=torch.float64), "G: expected 5 columns"),
        ("h", torch.zeros(2, dtype=torch.float64), "h: expected 4 entries"),
        ("q", torch.zeros(2, 3, 5, dtype=torch.float64), "q: expected shape"),
        ("G", torch.zeros(2, 2, 4, 5, dtype=torch.float64), "G: expected shape"),
    ],
)
def test_wrong_shapes(args: dict, name: str, value: torch.Tensor, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        _call(args, **{name: value})


@pytest.mark.parametrize("name", ["P", "A", "b", "G", "h"])
def test_mixed_dtypes(args: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}: expected dtype torch.float64"):
        _call(args, **{name: args[name].float()})


def test_integer_dtype_and_non_tensor(args: dict) -> None:
    with pytest.raises(ValueError, match=r"q: expected dtype float32 or float64"):
        _call(args, q=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"h: expected a torch\.Tensor"):
        _call(args, h=[1.0, 2.0, 3.0, 4.0])


def test_wrong_device(args: dict) -> None:
    with pytest.raises(ValueError, match=r"G: expected (device cpu|a tensor holding data)"):
        _call(args, G=args["G"].to("meta"))


@pytest.mark.parametrize("name", ["P", "q", "A", "b", "G", "h"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_inf(args: dict, name: str, bad: float) -> None:
    value = args[name].clone()
    value.view(-1)[0] = bad
    with pytest.raises(ValueError, match=f"{name}: expected finite entries"):
        _call(args, **{name: value})


def test_sparse_nan(args: dict) -> None:
    G = args["G"].clone()
    G[0, 0] = float("nan")
    with pytest.raises(ValueError, match="G: expected finite entries"):
        _call(args, G=G.to_sparse())


def test_non_symmetric_and_non_psd(args: dict) -> None:
    P = args["P"].clone()
    P[0, 1] += 1.0
    with pytest.raises(ValueError, match="P: expected a symmetric matrix"):
        _call(args, P=P)
    with pytest.raises(ValueError, match="P: expected a positive semidefinite matrix"):
        _call(args, P=-args["P"])
    with pytest.raises(ValueError, match="P: expected a symmetric matrix"):
        _call(args, P=P.to_sparse())
    with pytest.raises(ValueError, match="P: expected a positive semidefinite matrix"):
        _call(args, P=-args["P"].to_sparse())


def test_inconsistent_batch_sizes(args: dict) -> None:
    with pytest.raises(ValueError, match="one common batch size"):
        _call(args, q=args["q"].expand(3, 5), h=args["h"].expand(2, 4))


def test_missing_partner_and_required(args: dict) -> None:
    with pytest.raises(ValueError, match="b: expected A and b together"):
        _call(args, b=None)
    with pytest.raises(ValueError, match="G: expected G and h together"):
        _call(args, G=None)
    with pytest.raises(TypeError, match="P and q are required"):
        dqp.solve(None, args["q"])  # type: ignore[arg-type]


def test_bad_options(args: dict) -> None:
    with pytest.raises(ValueError, match="backward: expected"):
        _call(args, backward="adjoint")
    with pytest.raises(ValueError, match="on_failure: expected"):
        _call(args, on_failure="skip")
    with pytest.raises(ValueError, match="weak_policy: expected"):
        dqp.PenaltyBackward(weak_policy="maybe")
    with pytest.raises(ValueError, match="linear_solver: expected"):
        dqp.KKTBackward(linear_solver="cg")
    with pytest.raises(ValueError, match="beta: expected a positive"):
        dqp.PenaltyBackward(beta=-1.0)
    with pytest.raises(ValueError, match="warm_start: expected"):
        _call(args, warm_start=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"q: expected a dense tensor"):
        _call(args, q=args["q"].to_sparse())
