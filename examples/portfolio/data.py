"""Weekly S&P 500 returns (shipped with skfolio, nothing downloaded) and model features."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class MarketData:
    """Weekly simple returns and the per-decision-time inputs of the demo.

    Attributes:
        dates: week-end dates, one per row of ``returns``.
        assets: ticker names.
        returns: ``(T, N)`` weekly simple returns.
        vol: ``(T, N)`` trailing 52-week volatility known at each week's end.
    """

    dates: np.ndarray
    assets: tuple[str, ...]
    returns: Tensor
    vol: Tensor


def load_weekly(start: str = "2006-01-01") -> MarketData:
    """Weekly (Friday close) returns of the 20 stocks of ``skfolio``'s S&P 500 dataset."""
    from skfolio.datasets import load_sp500_dataset

    prices = load_sp500_dataset()
    weekly = prices.resample("W-FRI").last()
    rets = weekly.pct_change().dropna()
    vol = rets.rolling(52).std().shift(0)
    keep = (rets.index >= start) & vol.notna().all(axis=1).to_numpy()
    rets, vol = rets[keep], vol[keep]
    return MarketData(
        dates=rets.index.to_numpy(),
        assets=tuple(rets.columns),
        returns=torch.tensor(rets.to_numpy(), dtype=torch.float64),
        vol=torch.tensor(vol.to_numpy(), dtype=torch.float64),
    )


def features(data: MarketData, t: Tensor, lags: int) -> Tensor:
    """``(B, N, lags)`` past returns up to week ``t`` (inclusive), scaled by volatility."""
    idx = t[:, None] - torch.arange(lags - 1, -1, -1)[None, :]  # (B, lags)
    past = data.returns[idx]  # (B, lags, N)
    return (past / data.vol[t][:, None, :]).transpose(1, 2)


def covariance(data: MarketData, t: Tensor, window: int = 52, shrink: float = 0.2) -> Tensor:
    """``(B, N, N)`` covariance of the ``window`` weeks up to ``t``, shrunk to its diagonal."""
    idx = t[:, None] - torch.arange(window - 1, -1, -1)[None, :]
    past = data.returns[idx]  # (B, window, N)
    centred = past - past.mean(dim=1, keepdim=True)
    cov = centred.transpose(1, 2) @ centred / (window - 1)
    diag = torch.diag_embed(torch.diagonal(cov, dim1=1, dim2=2))
    return (1 - shrink) * cov + shrink * diag


def future(data: MarketData, t: Tensor, horizon: int) -> Tensor:
    """``(B, H, N)`` realized returns of weeks ``t+1 .. t+H``."""
    idx = t[:, None] + torch.arange(1, horizon + 1)[None, :]
    return data.returns[idx]
