"""Small float64 networks for the linearize tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class TinyNet(nn.Module):
    """Conv -> tanh -> LayerNorm -> linear: smooth, with a buffer-free norm layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.norm = nn.LayerNorm(3 * 4 * 4)
        self.fc = nn.Linear(3 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv(x)).flatten(1)
        return self.fc(torch.tanh(self.norm(h)))


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update B A."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.requires_grad_(False)
        self.A = nn.Parameter(0.3 * torch.randn(rank, d_in))
        self.B = nn.Parameter(0.3 * torch.randn(d_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.A.T @ self.B.T


@pytest.fixture
def tiny() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet().double()


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(6, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def random_direction(model: nn.Module, seed: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        n: torch.randn(p.shape, generator=g, dtype=p.dtype)
        for n, p in model.named_parameters()
        if p.requires_grad
    }
