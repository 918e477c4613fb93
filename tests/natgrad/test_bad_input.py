"""Bad input gets a clear error (or a warning where the precision is merely too low)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dxopt.natgrad import ENGD, SNG, SPRING, RowwiseResidual, kernel_direction

DT = torch.float64


class _Linear(nn.Module):
    def __init__(self, n: int, dtype: torch.dtype = DT) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(n, dtype=dtype))


def test_residual_of_wrong_shape_is_rejected():
    def residual(params, batch):
        return params["theta"].expand(3, 4)  # 2-D: not a residual vector

    opt = SNG(_Linear(4), residual)
    with pytest.raises(
        ValueError, match="residual: expected the residual function to return a 1-D"
    ):
        opt.step(None)


def test_rowwise_block_returning_wrong_shape_is_rejected():
    def row(params, x):
        return params["theta"].sum() * torch.ones(x.shape[0], 2, dtype=DT)

    residual = RowwiseResidual([row], names=("interior",))
    with pytest.raises(ValueError, match="block 'interior' returned shape"):
        residual({"theta": torch.ones(3, dtype=DT)}, (torch.ones(5, 2, dtype=DT),))
    with pytest.raises(ValueError, match="batch: expected a tuple of 1 tensors"):
        residual({"theta": torch.ones(3, dtype=DT)}, torch.ones(5, 2, dtype=DT))


def test_nan_residual_is_rejected_with_advice():
    def residual(params, batch):
        return params["theta"] * torch.tensor([1.0, float("nan"), 2.0], dtype=DT)

    for opt in (
        SNG(_Linear(3), residual),
        SPRING(_Linear(3), residual),
        ENGD(_Linear(3), residual),
    ):
        with pytest.raises(ValueError, match="residual: contains NaN"):
            opt.step(None)


def test_diverging_uncapped_sng_is_stopped_by_the_nan_check():
    """Regression (notes §7.6): an unsafe step size must end in a clear error, not NaN params."""

    def residual(params, batch):
        return torch.exp(params["theta"] ** 2) - batch

    opt = SNG(_Linear(2), residual, lr=50.0, damping=1e-12, norm_cap=None)
    opt.model.theta.data.fill_(0.5)
    with pytest.raises(ValueError, match="NaN or Inf"):
        for _ in range(20):
            opt.step(torch.tensor([3.0, 0.5], dtype=DT))
    # The same problem with the SPRING norm cap stays finite.
    capped = SNG(_Linear(2), residual, lr=50.0, damping=1e-12, norm_cap=1e-2)
    capped.model.theta.data.fill_(0.5)
    for _ in range(20):
        capped.step(torch.tensor([3.0, 0.5], dtype=DT))
    assert bool(torch.isfinite(capped.model.theta).all())


def test_low_precision_dtype_warns():
    with pytest.warns(UserWarning, match="below what torch.float32 resolves"):
        SPRING(_Linear(3, torch.float32), lambda p, b: p["theta"], damping=1e-8)
    with pytest.warns(UserWarning, match="float32"):
        ENGD(_Linear(3, torch.float32), lambda p, b: p["theta"])


def test_bad_options_name_the_argument():
    res = lambda p, b: p["theta"]  # noqa: E731
    with pytest.raises(ValueError, match="momentum: expected a number in \\[0, 1\\)"):
        SPRING(_Linear(2), res, momentum=1.0)
    with pytest.raises(ValueError, match="lr: expected a finite number > 0"):
        SNG(_Linear(2), res, lr=0.0)
    with pytest.raises(ValueError, match="damping"):
        SNG(_Linear(2), res, damping=-1.0)
    with pytest.raises(ValueError, match="on_failure: expected one of 'raise', 'warn', 'ignore'"):
        SNG(_Linear(2), res, on_failure="skip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="line_search"):
        ENGD(_Linear(2), res, line_search="armijo")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"params: expected a torch\.nn\.Module"):
        SNG("net", res)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="jacobian: expected shape"):
        kernel_direction(torch.ones(3, 2, dtype=DT), torch.ones(4, dtype=DT), damping=0.1)
