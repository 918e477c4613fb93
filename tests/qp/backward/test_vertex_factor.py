"""Issue 30, row gradients of QPTL: the vertex rule read off the Gram factor it already has.

The batched rule (:func:`dxopt.qp.backward.vertex_batch.vertex_rows_batched`) now takes its
linear program's constraint rows and the completion of the vertex's support from the ``G``
block of the Cholesky factor of :math:`[\\hat A; \\hat G_J]` (compiled,
:func:`dxopt.qp.backward.vertex_simplex.vertex_from_factor`) instead of a QR and a second
Gram factorization. Checked against the old rule (``_vertex_reference.py``: SVD, numpy
simplex, a new factor for the completion) on degenerate and non-degenerate float64 batches,
dependent equality rows (all 25 flow rows), badly scaled rows (one row times 1e6), with and
without the caller's factor, and on the fallback for samples whose factor failed; and the
whole backward's gradients equal those of the backward with the old rule.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from benchmarks.qp_speed.qptl import qptl_batch
from tests.qp.backward._vertex_reference import reference_vertex_rows_batched
from tests.qp.backward.test_vertex_batch import _capture, _random_degenerate

import dxopt.qp as dqp
import dxopt.qp.backward.vertex as vx
import dxopt.qp.backward.vertex_batch as vb
from dxopt.linalg import small_work
from dxopt.qp.backward.degenerate_rule import dependent_flags_factor, stacked_rows

F64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with small_work(0.0):
        yield


def _scaled_qptl(seed: int, *, drop_last: bool, scale_row: str | None) -> dict[str, Any]:
    """A QPTL batch of 12 (mixed: ``eps`` large enough that some samples are interior on
    several arcs), one row of ``A`` or one bound row of ``G`` scaled by 1e6 (the same
    constraint set)."""
    d = qptl_batch(12, eps=0.1 + 0.4 * seed, seed=seed, drop_last=drop_last)
    n = d["q"].shape[1]
    G = torch.cat([torch.eye(n, dtype=F64), -torch.eye(n, dtype=F64)])
    h = torch.cat([d["ub"], -d["lb"]])
    if scale_row == "G":
        G[3], h[3] = 1e6 * G[3], 1e6 * h[3]
    A, b = d["A"].clone(), d["b"].clone()
    if scale_row == "A":
        A[1], b[1] = 1e6 * A[1], 1e6 * b[1]
    return {"P": d["P"], "q": d["q"], "A": A, "b": b, "G": G, "h": h}


def _backward(d: dict[str, Any], seed: int) -> tuple[torch.Tensor, ...]:
    """Gradients of ``q, A, b, G, h`` of ``sum(w * x)`` (``b`` one per sample)."""
    S = d["q"].shape[0]
    q = d["q"].clone().requires_grad_()
    A, G, h = (d[k].clone().requires_grad_() for k in ("A", "G", "h"))
    b = (d["b"].expand(S, -1) if d["b"].ndim == 1 else d["b"]).clone().requires_grad_()
    sol = dqp.solve(d["P"], q, A=A, b=b, G=G, h=h)
    w = torch.randn(sol.x.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        (w * sol.x).sum().backward()
    assert q.grad is not None and b.grad is not None
    return q.grad, A.grad, b.grad, G.grad, h.grad  # type: ignore[return-value]


_CASES = [
    (0, True, None), (1, False, None), (0, False, "G"), (1, True, "A"), (2, False, "A"),
]  # fmt: skip


@pytest.mark.parametrize("seed, drop_last, scale_row", _CASES)
def test_rule_from_the_factor_equals_the_old_rule(
    monkeypatch: pytest.MonkeyPatch, seed: int, drop_last: bool, scale_row: str | None
) -> None:
    """Same rows kept and dropped, same samples settled as the old rule, with the caller's
    factor (as in the backward) and without it; the count of dependent rows left is that of
    the equality rows."""
    calls = _capture(monkeypatch)
    _backward(_scaled_qptl(seed, drop_last=drop_last, scale_row=scale_row), seed)
    assert calls
    dropped = 0
    for c in calls:
        args = (c["problem"], c["used"], c["ineq"], c["eq"], ~c["skip"])
        factor = dependent_flags_factor(stacked_rows(c["problem"], c["used"]))
        for keep_parallel in (False, True):
            used_o, drop_o, done_o = reference_vertex_rows_batched(
                *args, keep_parallel=keep_parallel
            )
            for f in (None, factor):
                used_n, drop_n, done_n, left = vb.vertex_rows_batched(
                    *args, keep_parallel=keep_parallel, factor=f
                )
                assert torch.equal(used_n, used_o)
                assert torch.equal(drop_n, drop_o)
                assert torch.equal(done_n, done_o)
                changed = (used_n != c["used"]).any(-1)
                assert bool((left[changed] == (0 if drop_last else 1)).all())
            dropped += int(drop_o.sum())
    assert dropped > 0


def test_failed_factor_samples_take_the_svd_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples whose Gram factor is marked failed (LAPACK ``info`` nonzero) get the thin SVD
    and a new factor for the completion: the old rule's rows, next to samples that do not."""
    calls = _capture(monkeypatch)
    _backward(_scaled_qptl(1, drop_last=False, scale_row="G"), 1)
    _backward(_random_degenerate(8, 2), 2)
    assert len(calls) >= 2
    for c in calls:
        args = (c["problem"], c["used"], c["ineq"], c["eq"], ~c["skip"])
        flags, L, info, gram = dependent_flags_factor(stacked_rows(c["problem"], c["used"]))
        info = info.clone()
        info[::2] = 1  # every other sample: as if LAPACK had failed
        used_o, drop_o, done_o = reference_vertex_rows_batched(*args, keep_parallel=True)
        used_n, drop_n, done_n, _ = vb.vertex_rows_batched(
            *args, keep_parallel=True, factor=(flags, L, info, gram)
        )
        assert torch.equal(used_n, used_o)
        assert torch.equal(drop_n, drop_o)
        assert torch.equal(done_n, done_o)
        assert int(drop_o[::2].sum()) > 0


def _old_rule(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    kwargs.pop("factor", None)
    out, dropped, done = reference_vertex_rows_batched(*args, **kwargs)
    return out, dropped, done, torch.full_like(dropped, -1)  # the backward recounts


@pytest.mark.parametrize("seed, drop_last, scale_row", _CASES)
def test_gradients_equal_those_of_the_old_rule(
    monkeypatch: pytest.MonkeyPatch, seed: int, drop_last: bool, scale_row: str | None
) -> None:
    """The whole backward (q, A, b, G, h gradients) with the rule read off the factor equals
    the backward with the old rule, to round-off, on degenerate batches with dependent
    equality rows and badly scaled rows; and on a batch whose samples are not degenerate
    (the rule does not run there)."""
    d = _scaled_qptl(seed, drop_last=drop_last, scale_row=scale_row)
    new = _backward(d, seed)
    monkeypatch.setattr(vx, "vertex_rows_batched", _old_rule)
    old = _backward(d, seed)
    for g_new, g_old in zip(new, old, strict=True):
        scale = max(float(g_old.abs().max()), 1.0)
        torch.testing.assert_close(g_new, g_old, rtol=0, atol=1e-9 * scale)


def test_regular_batch_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Independent active rows (no degeneracy): the rule is not consulted, same gradients."""
    rng = np.random.default_rng(4)
    n, S = 6, 8
    G = torch.tensor(rng.standard_normal((4, n)))
    G[1] *= 1e6
    x = torch.tensor(rng.standard_normal((S, n)))
    h = (x @ G.T).clone()
    h[:, 3] += 1.0  # row 3 inactive
    mult = torch.tensor(rng.uniform(0.5, 1.0, (S, 4)))
    mult[:, 3] = 0.0
    d = {"P": torch.eye(n, dtype=F64), "q": -(x + (mult / G.norm(dim=1)) @ G), "G": G, "h": h,
         "A": torch.tensor(rng.standard_normal((1, n))), "b": None}  # fmt: skip
    d["b"] = (x @ d["A"].T)[0]
    calls = _capture(monkeypatch)
    new = _backward(d, 0)
    assert not calls  # LICQ holds: the rule never runs
    monkeypatch.setattr(vx, "vertex_rows_batched", _old_rule)
    old = _backward(d, 0)
    for g_new, g_old in zip(new, old, strict=True):
        torch.testing.assert_close(g_new, g_old, rtol=0, atol=0)


def test_identification_factor_gives_the_rule_of_a_fresh_factor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The weak rows adopted with the identification's factor are those of
    :func:`dependent_weak_rows_dense`; its factor, extended by them (appended, then mapped to
    row order), counts the dependent rows of a fresh row-order factor and gives the old
    rule's rows; its Gram matrix is the fresh one's, reordered."""
    import dxopt.qp.backward.base as base
    from dxopt.qp.backward.degenerate_rule import dependent_weak_rows_dense

    seen: list[tuple[Any, ...]] = []
    found = base.weak_rows_with_factor

    def recorded(problem, used, weak):  # type: ignore[no-untyped-def]
        adopt, factor = found(problem, used, weak)
        seen.append((problem, used, weak, adopt, factor))
        return adopt, factor

    monkeypatch.setattr(base, "weak_rows_with_factor", recorded)
    calls = _capture(monkeypatch)
    for seed, drop_last, scale_row in _CASES:
        _backward(_scaled_qptl(seed, drop_last=drop_last, scale_row=scale_row), seed)
    assert len(seen) == len(calls) == len(_CASES)
    for (problem, used, weak, adopt, factor), c in zip(seen, calls, strict=True):
        assert factor is not None and factor.order is not None
        assert torch.equal(adopt, dependent_weak_rows_dense(problem, used, weak))
        assert torch.equal(c["used"], used | adopt)
        fresh = dependent_flags_factor(stacked_rows(problem, used | adopt))
        assert torch.equal(factor.flags.sum(-1), fresh[0].sum(-1))
        p = problem.p
        rows = torch.cat([torch.arange(p).expand(used.shape[0], -1), p + factor.order], 1)
        k = rows.shape[1]
        reordered = factor.gram.gather(1, rows[..., None].expand(-1, -1, factor.gram.shape[2]))
        reordered = reordered.gather(2, rows[:, None, :].expand(-1, k, -1))
        off = ~torch.eye(k, dtype=torch.bool)
        torch.testing.assert_close(reordered[:, off], fresh[3][:, off], rtol=0, atol=1e-14)
        args = (problem, c["used"], c["ineq"], c["eq"], ~c["skip"])
        for keep_parallel in (False, True):
            used_o, drop_o, done_o = reference_vertex_rows_batched(
                *args, keep_parallel=keep_parallel
            )
            used_n, drop_n, done_n, _ = vb.vertex_rows_batched(
                *args, keep_parallel=keep_parallel, factor=factor
            )
            assert torch.equal(used_n, used_o)
            assert torch.equal(drop_n, drop_o)
            assert torch.equal(done_n, done_o)


def test_rule_multipliers_only_for_matrix_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's minimum-norm multipliers enter only the ``A`` and ``G`` gradients: with
    ``b`` (and ``q``) requiring grad they are not computed (the old code computed them on
    every degenerate batch), and the ``b``, ``q`` gradients are those of the backward that
    also differentiates ``A`` (which does compute them), to the bit."""
    import dxopt.qp.backward.base as base

    calls: list[int] = []
    found = base.rule_multipliers

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return found(*args, **kwargs)

    monkeypatch.setattr(base, "rule_multipliers", counted)
    d = qptl_batch(16, eps=0.2, seed=3, drop_last=False)
    w = torch.randn(16, 40, generator=torch.Generator().manual_seed(3), dtype=F64)
    grads = []
    for with_A in (False, True):
        q = d["q"].clone().requires_grad_()
        b = d["b"].expand(16, -1).clone().requires_grad_()
        A = d["A"].clone().requires_grad_(with_A)
        sol = dqp.solve(d["P"], q, A=A, b=b, lb=d["lb"], ub=d["ub"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
            (w * sol.x).sum().backward()
        assert sum(sol.info.backward.vertex_dropped) > 0  # the vertex rule ran
        assert len(calls) == int(with_A)
        grads.append((q.grad, b.grad))
    for g_without, g_with in zip(*grads, strict=True):
        assert g_without is not None and torch.equal(g_without, g_with)


def test_identification_factor_when_some_weak_rows_stay_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Weak rows of which only some lie in the span of the used rows (the others stay out):
    the adopted rows are :func:`dependent_weak_rows_dense`'s, and the rule run from the
    extended factor keeps the rows of the old rule on the rows used plus adopted."""
    from dxopt.qp.backward.degenerate_rule import dependent_weak_rows_dense, weak_rows_with_factor

    calls = _capture(monkeypatch)
    _backward(_scaled_qptl(2, drop_last=False, scale_row="G"), 2)
    _backward(_random_degenerate(8, 1), 1)
    rng = np.random.default_rng(0)
    partial = 0
    for c in calls:
        problem, full = c["problem"], c["used"]
        moved = full & torch.from_numpy(rng.uniform(size=full.shape) < 0.35)
        extra = ~full & torch.from_numpy(rng.uniform(size=full.shape) < 0.2)
        used, weak = full & ~moved, moved | extra
        adopt, factor = weak_rows_with_factor(problem, used, weak)
        assert torch.equal(adopt, dependent_weak_rows_dense(problem, used, weak))
        partial += int(((adopt != weak) & adopt.any(-1, keepdim=True)).any(-1).sum())
        assert factor is not None
        args = (problem, used | adopt, c["ineq"], c["eq"], ~c["skip"])
        used_o, drop_o, done_o = reference_vertex_rows_batched(*args, keep_parallel=True)
        used_n, drop_n, done_n, _ = vb.vertex_rows_batched(*args, keep_parallel=True, factor=factor)
        assert torch.equal(used_n, used_o)
        assert torch.equal(drop_n, drop_o)
        assert torch.equal(done_n, done_o)
    assert partial > 0  # samples with adopted and non-adopted weak rows
