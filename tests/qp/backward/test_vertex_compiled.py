"""Issue 30, row gradients of QPTL: the compiled vertex simplex and the skipped regular solve.

- The compiled two-phase simplex (:mod:`dxopt.qp.backward.vertex_simplex`) returns the
  vertex of the array version it replaced (``_vertex_reference.py``, the old code), on random
  degenerate linear programs and inside the whole rule (QPTL batches and random dependent
  rows): same rows kept, same rows dropped, same samples settled.
- A batch whose active set already shows dependent rows (weak rows in the span of the others
  joined it) goes to the degenerate rule at once: the regular ladder never runs on dependent
  rows (on the old code it ran first on every such batch and failed).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from benchmarks.qp_speed.qptl import qptl_batch
from tests.qp.backward._vertex_reference import reference_simplex, reference_vertex_rows_batched
from tests.qp.backward.test_vertex_batch import (
    _capture,
    _general_dependencies_backward,
    _row_backward,
)

import dxopt.qp as dqp
import dxopt.qp.backward.base as base
import dxopt.qp.backward.vertex_batch as vb
from dxopt.linalg import small_work
from dxopt.qp.backward.degenerate_rule import dependent_flags_factor
from dxopt.qp.backward.fallbacks import dependent_counts
from dxopt.qp.backward.vertex_simplex import range_basis, simplex_batch

F64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with small_work(0.0):
        yield


def _degenerate_programs(s: int, seed: int) -> tuple[np.ndarray, ...]:
    """``(M, b, cost, work)``: ``s`` programs ``min cost.z, Mz = b, z >= 0`` with orthonormal
    rows (some zero rows, as the rule's padding) and a feasible point with many zeros
    (degenerate vertices), positive costs; a few samples not in ``work``."""
    rng = np.random.default_rng(seed)
    R, K = 6, 14
    M = np.zeros((s, R, K))
    b = np.zeros((s, R))
    for i in range(s):
        rank = int(rng.integers(2, R + 1))
        Q, _ = np.linalg.qr(rng.standard_normal((K, rank)))
        M[i, :rank] = Q.T
        z0 = np.where(rng.uniform(size=K) < 0.4, rng.uniform(0.1, 1.0, K), 0.0)
        b[i] = M[i] @ z0
    cost = np.broadcast_to(vb.vertex_cost(K), (s, K)).copy()
    work = rng.uniform(size=s) < 0.85
    return M, b, cost, work


@pytest.mark.parametrize("seed", range(4))
def test_compiled_simplex_equals_the_array_simplex(seed: int) -> None:
    M, b, cost, work = _degenerate_programs(40, seed)
    z, solved = simplex_batch(M, b, cost, work)
    z_ref, solved_ref = reference_simplex(M, b[..., None], cost, work)
    assert solved.sum() > 0.5 * work.sum()
    np.testing.assert_array_equal(solved, solved_ref)
    np.testing.assert_allclose(z[solved], z_ref[solved], rtol=0, atol=1e-12)
    assert not z[~work].any()
    # and it is a real minimiser: feasible, nonnegative, cost no higher than z0's
    for i in np.flatnonzero(solved):
        np.testing.assert_allclose(M[i] @ z[i], b[i], atol=1e-10)
        assert z[i].min() >= -1e-12


def _rule_outputs(calls: list[dict[str, Any]], rule: Any) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for c in calls:
        args = (c["problem"], c["used"], c["ineq"], c["eq"])
        for keep_parallel in (False, True):
            out.append(rule(*args, ~c["skip"], keep_parallel=keep_parallel))
    return out


def test_batched_rule_equals_the_old_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """QPTL batches (three regularisations) and random dependent rows: the batched rule
    (compiled simplex; equality multipliers eliminated from the Gram factor, no SVD) keeps
    the rows, drops the counts and settles the samples of the old rule (numpy simplex, SVD)."""
    calls = _capture(monkeypatch)
    for seed, eps in enumerate((0.1, 0.5, 1.0)):
        _row_backward(qptl_batch(32, eps=eps, seed=seed), seed)
    _general_dependencies_backward(range(3))
    assert len(calls) >= 6
    new = _rule_outputs(calls, vb.vertex_rows_batched)
    old = _rule_outputs(calls, reference_vertex_rows_batched)
    dropped = 0
    for (used_n, drop_n, done_n, _), (used_o, drop_o, done_o) in zip(new, old, strict=True):
        assert torch.equal(used_n, used_o)
        assert torch.equal(drop_n, drop_o)
        assert torch.equal(done_n, done_o)
        dropped += int(drop_n.sum())
    assert dropped > 0


def test_dependent_batch_skips_the_regular_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    """QPTL with ``b`` requiring grad: every sample's active rows are dependent, so the regular
    ladder may only run on the rows the degenerate rule kept (independent), never on the
    dependent set first (the old code did, and failed, on every call: about 2 ms of 20)."""
    seen: list[int] = []
    ladder = base.regular_adjoint

    def counted(data, active, budget):  # type: ignore[no-untyped-def]
        seen.append(int(dependent_counts(data, active.used).sum()))
        return ladder(data, active, budget)

    monkeypatch.setattr(base, "regular_adjoint", counted)
    d = qptl_batch(32, eps=0.1, seed=1)
    b = d["b"].expand(32, -1).clone().requires_grad_()
    sol = dqp.solve(d["P"], d["q"], A=d["A"], b=b, lb=d["lb"], ub=d["ub"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        sol.x.sum().backward()
    info = sol.info.backward
    assert b.grad is not None and bool(torch.isfinite(b.grad).all())
    assert sum(info.vertex_dropped) > 0  # degenerate, the vertex rule ran
    assert seen and all(count == 0 for count in seen), seen


def test_regular_batch_still_takes_the_regular_ladder_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Independent active rows (no weak row in their span): the ladder runs on the
    identified rows at once, as before."""
    seen: list[int] = []
    ladder = base.regular_adjoint

    def counted(data, active, budget):  # type: ignore[no-untyped-def]
        seen.append(int(active.used.sum()))
        return ladder(data, active, budget)

    monkeypatch.setattr(base, "regular_adjoint", counted)
    rng = np.random.default_rng(0)
    n = 5
    G = torch.tensor(rng.standard_normal((3, n)))
    x = torch.tensor(rng.standard_normal((4, n)))
    h = (x @ G.T).clone().requires_grad_()  # all three rows active, independent
    q = -(x + torch.tensor(rng.uniform(0.5, 1.0, (4, 3))) @ G)
    sol = dqp.solve(torch.eye(n, dtype=F64), q, G=G, h=h, solver="clarabel")
    sol.x.sum().backward()
    assert seen and seen[0] == 12
    assert sol.info.backward.licq


def test_projected_range_from_the_gram_factor_equals_the_svd_range() -> None:
    """The constraint rows of the rule's linear program: the orthonormal basis read off the
    Gram factor spans the range of the SVD's (same projector, same rank) on dependent rows
    with equality rows; a sample whose G rows all lie in the span of A gets no row."""
    rng = np.random.default_rng(3)
    s, n, p = 6, 7, 2
    A = rng.standard_normal((p, n))
    base_rows = rng.standard_normal((s, 4, n))
    in_eq_span = rng.standard_normal((s, 1, p)) @ A  # a G row in range A^T
    Gk = np.concatenate([base_rows, base_rows[:, :2] + base_rows[:, 2:4], in_eq_span], 1)
    Gk[-1] = rng.standard_normal((Gk.shape[1], p)) @ A  # every row in range A^T: rank 0
    Gn = Gk / np.linalg.norm(Gk, axis=-1, keepdims=True)
    An = A / np.linalg.norm(A, axis=-1, keepdims=True)
    C = torch.from_numpy(np.concatenate([np.broadcast_to(An, (s, p, n)), Gn], 1))
    flags, L, info, _ = dependent_flags_factor(C)
    assert not bool(info.any())
    K = Gn.shape[1]
    independent = ~flags.numpy()[:, p:]
    W = L.numpy()[:, p:, p:]
    M = np.zeros((s, K, K))  # each sample's basis, padded with zero rows
    for i in range(s):
        _, Mi = range_basis(np.ascontiguousarray(W[i]), independent[i], np.arange(K))
        M[i, : Mi.shape[0]] = Mi
    Ua = np.linalg.svd(An.T, full_matrices=False)[0]
    M_svd = vb._projected_range_svd(Gn, Ua)
    for i in range(s - 1):
        proj = M[i].T @ M[i]
        proj_svd = M_svd[i].T @ M_svd[i]
        np.testing.assert_allclose(proj, proj_svd, atol=1e-10)
        assert round(float(np.trace(proj))) == int(independent[i].sum())
    # every G row in range A^T: the range is {0}; the SVD's relative cut keeps round-off
    # directions there (all singular values about 1e-16), the Gram pivots do not
    assert int(independent[-1].sum()) == 0 and K > 4
    assert not M[-1].any()


def test_rule_counts_the_dependent_rows_it_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the batched rule changed a sample's rows, the count of dependent rows it returns
    (the backward's ``left``, no longer recounted) is the Gram count of the new rows: all
    25 flow rows (one dependent equality row) and without the sink's row (none)."""
    from dxopt.qp.backward.degenerate_rule import _stack
    from dxopt.qp.certify.dependence import count_dependent_dense

    calls = _capture(monkeypatch)
    for drop_last in (True, False):
        _row_backward(qptl_batch(16, eps=0.2, seed=5, drop_last=drop_last), 5)
    seen = set()
    for c in calls:
        args = (c["problem"], c["used"], c["ineq"], c["eq"])
        used, _, _, left = vb.vertex_rows_batched(*args, ~c["skip"], keep_parallel=True)
        changed = (used != c["used"]).any(-1) & (left >= 0)
        assert bool(changed.any())
        C, _ = _stack(c["problem"], used, eq_first=False)
        expected = count_dependent_dense(C)
        assert torch.equal(left[changed], expected[changed])
        seen |= set(left[changed].tolist())
    assert seen == {0, 1}
