"""Issue 30, row gradients of QPTL: the identification's Gram blocks gathered from one shared
unit Gram matrix of ``[A; G]`` (:mod:`dxopt.qp.backward.gram_blocks`) where ``A`` and ``G``
are shared by the batch, instead of three batched products of the stacked rows.

The gathered blocks equal the stacked products (padding, zero rows, weak rows that stay out,
badly scaled rows), and the whole backward's gradients equal those of the stacked path.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from tests.qp.backward.test_vertex_batch import _capture, _random_degenerate
from tests.qp.backward.test_vertex_factor import _CASES, _backward, _scaled_qptl

import dxopt.qp.backward.degenerate_rule as dr
from dxopt.linalg import small_work
from dxopt.qp.backward.degenerate_rule import RuleFactor, dependent_flags_factor, stacked_rows


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with small_work(0.0):
        yield


def _stacked_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward as before: the blocks from the stacked rows' products."""
    monkeypatch.setattr(dr, "_shared_dense", lambda M: False)


def _with_zero_rows(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``d`` with a zero row appended to ``G`` (slack 1) and to ``A`` (rhs 0)."""
    n = d["q"].shape[1]
    out = dict(d)
    out["G"] = torch.cat([d["G"], torch.zeros(1, n, dtype=d["G"].dtype)])
    out["h"] = torch.cat([d["h"], torch.ones(*d["h"].shape[:-1], 1, dtype=d["h"].dtype)], -1)
    out["A"] = torch.cat([d["A"], torch.zeros(1, n, dtype=d["A"].dtype)])
    out["b"] = torch.cat([d["b"], torch.zeros(*d["b"].shape[:-1], 1, dtype=d["b"].dtype)], -1)
    return out


@pytest.mark.parametrize("zero_rows", [False, True])
def test_gathered_blocks_equal_the_stacked_products(
    monkeypatch: pytest.MonkeyPatch, zero_rows: bool
) -> None:
    """On the rule's rows of QPTL (all flow rows, a bound row times 1e6) and of random
    degenerate QPs, with random weak rows (some in the span, some not) and zero rows of ``A``
    and ``G``: every block of the shared path equals the stacked path's to round-off, the
    indices, masks and norms exactly."""
    calls = _capture(monkeypatch)
    for d in (_scaled_qptl(2, drop_last=False, scale_row="G"), _random_degenerate(8, 1)):
        _backward(_with_zero_rows(d) if zero_rows else d, 2)
    rng = np.random.default_rng(0)
    assert calls
    for c in calls:
        problem, full = c["problem"], c["used"]
        assert problem.G.ndim == 2 and dr._shared_dense(problem.G)
        moved = full & torch.from_numpy(rng.uniform(size=full.shape) < 0.35)
        extra = ~full & torch.from_numpy(rng.uniform(size=full.shape) < 0.2)
        used, weak = full & ~moved, moved | extra
        shared = dr._weak_gram(problem, used, weak)
        with monkeypatch.context() as m:
            _stacked_only(m)
            stacked = dr._weak_gram(problem, used, weak)
        assert shared is not None and stacked is not None
        for i, (new, old) in enumerate(zip(shared, stacked, strict=True)):
            assert new.shape == old.shape and new.dtype == old.dtype
            if i == 6:  # L: the same dependent rows; the columns of the others agree
                flags = new.diagonal(dim1=-2, dim2=-1).pow(2) < 1e-10
                assert torch.equal(flags, old.diagonal(dim1=-2, dim2=-1).pow(2) < 1e-10)
                cols = ~flags[:, None, :]
                torch.testing.assert_close(new * cols, old * cols, rtol=0.0, atol=1e-12)
            elif new.dtype == torch.float64:
                torch.testing.assert_close(new, old, rtol=0.0, atol=1e-13)
            else:
                assert torch.equal(new, old)
        assert torch.equal(shared[3], stacked[3])  # the norms of the weak rows, exactly
        # an all-zero row of A never reaches the rule: it is left out of the adjoint first
        # (dxopt.qp.backward.fallbacks.without_zero_equalities)
        assert problem.A is None or bool((problem.A != 0).any(-1).all())


@pytest.mark.parametrize("seed, drop_last, scale_row", _CASES)
def test_backward_with_gathered_blocks_equals_the_stacked_one(
    monkeypatch: pytest.MonkeyPatch, seed: int, drop_last: bool, scale_row: str | None
) -> None:
    """Gradients of ``q, A, b, G, h`` with the gathered blocks equal the stacked path's (to
    1e-12 relative; bitwise in practice)."""
    d = _scaled_qptl(seed, drop_last=drop_last, scale_row=scale_row)
    new = _backward(d, seed)
    with monkeypatch.context() as m:
        _stacked_only(m)
        old = _backward(d, seed)
    for g_new, g_old in zip(new, old, strict=True):
        assert g_new is not None and g_old is not None
        scale = float(g_old.abs().max().clamp_min(1e-300))
        assert float((g_new - g_old).abs().max()) <= 1e-12 * scale


def test_vertex_rule_with_shared_and_per_sample_rows_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched vertex rule reads the row norms of a shared ``G`` once (gathered) and those
    of a per-sample ``G`` from its gathered rows: the same rows per sample give the same
    result either way, with and without the caller's factor."""
    from dataclasses import replace

    import dxopt.qp.backward.vertex_batch as vb

    calls = _capture(monkeypatch)
    _backward(_scaled_qptl(1, drop_last=False, scale_row="G"), 1)
    _backward(_random_degenerate(8, 1), 1)
    assert calls
    for c in calls:
        problem = c["problem"]
        S = c["used"].shape[0]
        batched = replace(problem, G=problem.G.expand(S, -1, -1).clone())
        args = (c["used"], c["ineq"], c["eq"], ~c["skip"])
        for factor in (None, RuleFactor(*dependent_flags_factor(stacked_rows(problem, c["used"])))):
            shared = vb.vertex_rows_batched(problem, *args, keep_parallel=True, factor=factor)
            per_sample = vb.vertex_rows_batched(batched, *args, keep_parallel=True, factor=factor)
            for a, b in zip(shared, per_sample, strict=True):
                assert torch.equal(a, b)
