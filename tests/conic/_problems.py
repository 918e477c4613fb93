"""Small cone programs with known answers, shared by the conic tests."""

from __future__ import annotations

import torch

F64 = torch.float64


def ball_rows(n: int, radius: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``A, b`` of ``(radius, x) in SOC(n + 1)``: ``s = b - Ax = (radius, x)``."""
    A = torch.cat([torch.zeros(1, n, dtype=F64), -torch.eye(n, dtype=F64)])
    b = torch.cat([torch.tensor([radius], dtype=F64), torch.zeros(n, dtype=F64)])
    return A, b


def box_rows(n: int, lo: float, hi: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``A, b`` of ``lo <= x <= hi`` as ``2n`` nonnegative rows."""
    eye = torch.eye(n, dtype=F64)
    A = torch.cat([eye, -eye])
    b = torch.cat([torch.full((n,), hi, dtype=F64), torch.full((n,), -lo, dtype=F64)])
    return A, b
