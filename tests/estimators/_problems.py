"""Small float64 problems shared by the estimator tests."""

from __future__ import annotations

import torch
from torch import Tensor

from dxopt.estimators import run_blocks


def quadratic(d1: int = 3, d2: int = 2, seed: int = 0):
    """L(θ) = ½ θᵀAθ + bᵀθ over θ = (a, b) split into two named parameters; returns
    (loss_fn, params, batch, exact_grad)."""
    gen = torch.Generator().manual_seed(seed)
    d = d1 + d2
    m = torch.randn(d, d, generator=gen, dtype=torch.float64)
    a_mat = m @ m.T / d + torch.eye(d, dtype=torch.float64)
    b = torch.randn(d, generator=gen, dtype=torch.float64)
    params = {
        "a": torch.randn(d1, generator=gen, dtype=torch.float64),
        "b": torch.randn(d2, generator=gen, dtype=torch.float64),
    }

    def loss_fn(p, batch):
        theta = torch.cat([p["a"], p["b"]])
        return 0.5 * theta @ batch[0] @ theta + batch[1] @ theta

    theta = torch.cat([params["a"], params["b"]])
    g = a_mat @ theta + b
    return loss_fn, params, (a_mat, b), {"a": g[:d1], "b": g[d1:]}


def residual_mlp(n_blocks: int = 4, width: int = 8, batch: int = 6, seed: int = 0):
    """A residual tanh MLP whose blocks go through ``run_blocks``; float64."""
    gen = torch.Generator().manual_seed(seed)
    params = {
        f"w{i}": torch.randn(width, width, generator=gen, dtype=torch.float64) / width**0.5
        for i in range(n_blocks)
    }
    params["head"] = torch.randn(3, width, generator=gen, dtype=torch.float64)
    x = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (batch,), generator=gen)

    def loss_fn(p, data):
        inputs, labels = data

        def block(i: int):
            return lambda h: h + torch.tanh(h @ p[f"w{i}"].T)

        h = run_blocks([block(i) for i in range(n_blocks)], inputs)
        return torch.nn.functional.cross_entropy(h @ p["head"].T, labels)

    return loss_fn, params, (x, y)


def flat(grads: dict[str, Tensor]) -> Tensor:
    return torch.cat([g.reshape(-1) for g in grads.values()])
