"""Kernels shared by the dense backward routes, against their plain formulas: the parameter
gradients' outer-product sums (the sign and 1/2 folded into the left factors must give the
same bits as scaling afterwards, in every layout) and the blocked |M||v| / row max-norm pass of
the active-set identification (exact row maxima; products equal to the unblocked ones)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dxopt.qp.backward.grads import _outer_sum
from dxopt.qp.certify.active import _abs_mv, _row_stats
from dxopt.qp.problem.canonical import QPProblem, canonical_problem

F64 = torch.float64


def _pairs(S: int, rows: int, cols: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(S, rows, generator=gen, dtype=F64),
            torch.randn(S, cols, generator=gen, dtype=F64),
        )
        for _ in range(2)
    ]


@pytest.mark.parametrize("scale", [-1.0, -0.5])
def test_outer_sum_dense_equals_the_formula_bit_for_bit(scale: float) -> None:
    pairs = _pairs(3, 40, 30, 0)
    shared = torch.zeros(40, 30, dtype=F64)  # one matrix for the batch: summed over samples
    expected = -(sum(l.T @ r for l, r in pairs)) * -scale  # type: ignore[misc]
    got = _outer_sum(pairs, shared, scale)
    assert got.shape == (40, 30)
    big = float(expected.abs().max())  # the formula summed in another order: round-off
    torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-14 * big)
    # the unfolded form of the old code: one GEMM, negated, then scaled
    left = torch.cat([p[0] for p in pairs], 0)
    right = torch.cat([p[1] for p in pairs], 0)
    assert torch.equal(got, -(left.T @ right) * -scale)
    batched = torch.zeros(3, 40, 30, dtype=F64)  # one matrix per sample
    got_b = _outer_sum(pairs, batched, scale)
    for s in range(3):
        per_sample = sum(torch.outer(l[s], r[s]) for l, r in pairs)
        big = float(per_sample.abs().max())
        torch.testing.assert_close(got_b[s], scale * per_sample, rtol=0.0, atol=1e-14 * big)


def test_outer_sum_sparse_keeps_the_pattern_and_the_values() -> None:
    pairs = _pairs(2, 20, 15, 1)
    dense = torch.zeros(20, 15, dtype=F64)
    mask = torch.rand(20, 15, generator=torch.Generator().manual_seed(2)) < 0.2
    template = torch.where(mask, 1.0, 0.0).to(F64).to_sparse().coalesce()
    got = _outer_sum(pairs, template, -0.5)
    assert got.layout == torch.sparse_coo
    assert torch.equal(got.indices(), template.indices())
    full = _outer_sum(pairs, dense, -0.5)
    rows, cols = template.indices()
    big = float(full.abs().max())
    torch.testing.assert_close(got.values(), full[rows, cols], rtol=0.0, atol=1e-14 * big)


def _problem(M: torch.Tensor, n: int) -> QPProblem:
    h = torch.ones(M.shape[-2], dtype=F64)
    return canonical_problem(torch.eye(n, dtype=F64), torch.zeros(n, dtype=F64), G=M, h=h)


@pytest.mark.parametrize(("k", "n", "S"), [(300, 70, 1), (257, 1000, 2), (0, 5, 1), (4, 0, 1)])
def test_row_stats_blocked_equal_the_whole_matrix_products(k: int, n: int, S: int) -> None:
    """Rows in blocks of the cache size: |G||v| as |G| @ |v| (to round-off), the row
    max-norms exact (+0 for an all-zero row, also of -0.0 entries), the row norms the same bits
    as the sums over the whole matrix (zero rows clamped to the smallest normal number)."""
    rng = np.random.default_rng(k + n)
    G = rng.standard_normal((k, n)) * 10.0 ** rng.integers(-3, 4, size=(k, 1))
    if k > 3 and n:
        G[1] = 0.0
        G[2] = -0.0
    av = np.abs(rng.standard_normal((S, n)))
    problem = _problem(torch.from_numpy(G), n)
    stats = _row_stats(problem, "G", av)
    assert stats.abs_mv.shape == (S, k) and stats.inf.shape == stats.norm.shape == (k,)
    np.testing.assert_allclose(stats.abs_mv, av @ np.abs(G).T, rtol=1e-14, atol=0.0)
    assert np.array_equal(stats.inf, np.abs(G).max(axis=1) if n else np.zeros(k))
    assert not np.signbit(stats.inf).any()
    tiny = np.finfo(np.float64).tiny
    assert np.array_equal(stats.norm, np.maximum(np.sqrt(np.einsum("ij,ij->i", G, G)), tiny))
    assert np.array_equal(_abs_mv(problem, "G", av), stats.abs_mv)
