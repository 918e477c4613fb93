"""kNN-robust targets: neighbours and mixed costs against brute force, PyEPO's optDatasetKNN on
identical data, and the noise reduction the paper relies on (against noise-free costs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.dfl._enum import pyepo_model

from dxopt.dfl import ShortestPathOracle, knn_targets


def _data(n=60, seed=0, noise=0.0):
    gen = torch.Generator().manual_seed(seed)
    z = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    W = torch.rand(2, 12, generator=gen, dtype=torch.float64)
    clean = 1.0 + z @ W
    return z, clean, clean + noise * torch.randn(clean.shape, generator=gen, dtype=torch.float64)


def test_knn_targets_equal_brute_force():
    z, _, c = _data(noise=0.3)
    oracle = ShortestPathOracle((3, 3))
    t = knn_targets(z, c, k=4, weight=0.3, oracle=oracle)
    for i in range(z.shape[0]):
        dist = [float((z[i] - z[j]).norm()) if j != i else np.inf for j in range(z.shape[0])]
        nb = sorted(range(z.shape[0]), key=lambda j: (dist[j], j))[:4]
        assert t.neighbours[i].tolist() == nb
        mixed = 0.3 * c[i] + 0.7 * c[nb]
        assert torch.allclose(t.costs[i], mixed.mean(0), atol=1e-12)
        x = oracle(mixed)
        assert torch.allclose(t.solutions[i], x.mean(0), atol=1e-12)
        assert torch.allclose(t.objectives[i], (mixed * x).sum(1).mean(), atol=1e-12)
    with pytest.raises(ValueError, match="k: expected 1 <= k < 60"):
        knn_targets(z, c, k=60)


def test_knn_targets_equal_pyepo():
    dataset = pytest.importorskip("pyepo.data.dataset", reason="pyepo (test-only reference)")
    z, _, c = _data(n=40, seed=1, noise=0.3)
    oracle = ShortestPathOracle((3, 3))
    ours = knn_targets(z, c, k=5, weight=0.5, oracle=oracle)
    theirs = dataset.optDatasetKNN(pyepo_model(oracle), z.numpy(), c.numpy(), k=5, weight=0.5)
    assert torch.allclose(ours.costs, theirs.costs.to(torch.float64), atol=1e-6)
    assert torch.allclose(ours.solutions, theirs.sols.to(torch.float64), atol=1e-6)
    assert torch.allclose(ours.objectives, theirs.objs.reshape(-1).to(torch.float64), atol=1e-5)


def test_knn_targets_reduce_the_noise():
    z, clean, noisy = _data(n=400, seed=2, noise=0.5)
    t = knn_targets(z, noisy, k=10, weight=0.5)
    raw = (noisy - clean).square().mean()
    smooth = (t.costs - clean).square().mean()
    # variance (0.25 + 0.025) sigma^2 plus a small bias: about a third of the raw error
    assert smooth < 0.4 * raw
