"""The vertex rule batched over the samples (issue 30: QPTL with row gradients).

Every QPTL sample is degenerate, and the rule (minimum-cost vertex of the multiplier set, its
support completed in row order) used to run one sample at a time. Checked here: the batched
rule returns the rows of the per-sample loop; the rows depend on the multiplier set only (not
on which of its points the backend returned: the tie-break cost used to leave ties between
exchanges of several rows, decided by the simplex path); the row gradients are the exact
derivative of the piece with the kept rows active (finite differences of that smooth
equality-constrained QP) and agree with one-sided differences of the QP itself wherever that
piece is the one active along the direction.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import scipy.optimize as so
import torch
from benchmarks.qp_speed.qptl import grid_incidence, qptl_batch
from tests.qp._fd import STEPS

import dxopt.qp as dqp
import dxopt.qp.backward.base as base
import dxopt.qp.backward.vertex as vx
import dxopt.qp.backward.vertex_batch as vb
from dxopt.linalg import small_work

F64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """The rule called directly runs on one intra-op thread, as inside the backward."""
    with small_work(0.0):
        yield


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record the arguments of every call of the vertex rule in the backward."""
    calls: list[dict[str, Any]] = []
    rule = vx.vertex_rows

    def wrapped(problem, used, ineq_duals, eq_duals, skip, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(dict(problem=problem, used=used, ineq=ineq_duals, eq=eq_duals, skip=skip,
                          keep_parallel=kwargs.get("keep_parallel", False)))  # fmt: skip
        return rule(problem, used, ineq_duals, eq_duals, skip, **kwargs)

    monkeypatch.setattr(base, "vertex_rows", wrapped)
    return calls


def _row_backward(d: dict[str, torch.Tensor], seed: int) -> dqp.QPSolution:
    A, b = d["A"].clone().requires_grad_(), d["b"].clone().requires_grad_()
    sol = dqp.solve(d["P"], d["q"], A=A, b=b, lb=d["lb"], ub=d["ub"])
    w = torch.randn(sol.x.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        (w * sol.x).sum().backward()
    return sol


def _random_degenerate(batch: int, seed: int) -> dict[str, torch.Tensor]:
    """Dense QPs whose optimum sits on dependent rows: duplicated, opposite-free sums and
    scaled copies of active rows, plus equality rows, with positive multipliers."""
    rng = np.random.default_rng(seed)
    n = 6
    base_rows = rng.standard_normal((4, n))
    G = np.vstack([base_rows, base_rows[0] + base_rows[1], 3.0 * base_rows[2],
                   base_rows[1] - 0.5 * base_rows[3], rng.standard_normal((3, n))])  # fmt: skip
    A = rng.standard_normal((1, n))
    x = rng.standard_normal((batch, n))
    active = G[:7] @ x.T  # the first seven rows active at x
    h = np.vstack([active, G[7:] @ x.T + 1.0]).T
    z = np.zeros((batch, G.shape[0]))
    z[:, :7] = rng.uniform(0.1, 1.0, (batch, 7))
    y = rng.standard_normal((batch, 1))
    q = -(x + z @ G + y @ A)  # stationarity with P = I
    return {"P": torch.eye(n, dtype=F64), "q": torch.tensor(q), "G": torch.tensor(G),
            "h": torch.tensor(h), "A": torch.tensor(A), "b": torch.tensor(x @ A.T)}  # fmt: skip


def _general_dependencies_backward(seeds: Any) -> None:
    """Forward and backward (gradients of G and h) of :func:`_random_degenerate` batches of 16,
    one per seed, the degenerate warnings silenced."""
    for seed in seeds:
        d = _random_degenerate(16, seed)
        G, h = d["G"].clone().requires_grad_(), d["h"].clone().requires_grad_()
        sol = dqp.solve(d["P"], d["q"], G=G, h=h, A=d["A"], b=d["b"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
            sol.x.sum().backward()


@pytest.mark.parametrize("eps, drop_last", [(0.1, True), (0.5, False), (1.0, True)])
def test_batched_rule_equals_the_per_sample_loop_on_qptl(
    monkeypatch: pytest.MonkeyPatch, eps: float, drop_last: bool
) -> None:
    calls = _capture(monkeypatch)
    for seed in range(3):
        _row_backward(qptl_batch(32, eps=eps, seed=seed, drop_last=drop_last), seed)
    assert calls
    for c in calls:
        args = (c["problem"], c["used"], c["ineq"], c["eq"], c["skip"])
        fast, dropped_fast = vx.vertex_rows(*args, keep_parallel=c["keep_parallel"])
        loop, dropped_loop = vx.vertex_rows(*args, keep_parallel=c["keep_parallel"], batched=False)
        assert torch.equal(fast, loop)
        assert torch.equal(dropped_fast, dropped_loop)
        assert int(dropped_fast.sum()) > 0
        # the batch settles every degenerate sample itself (the loop is only a fallback)
        _, _, done, _ = vb.vertex_rows_batched(*args[:4], ~c["skip"], keep_parallel=True)
        assert bool(done[~c["skip"]].all())


def test_batched_rule_equals_the_per_sample_loop_on_general_dependencies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _capture(monkeypatch)
    _general_dependencies_backward(range(3))
    assert calls
    for c in calls:
        for keep_parallel in (False, True):
            args = (c["problem"], c["used"], c["ineq"], c["eq"], c["skip"])
            fast, dropped_fast = vx.vertex_rows(*args, keep_parallel=keep_parallel)
            loop, dropped_loop = vx.vertex_rows(*args, keep_parallel=keep_parallel, batched=False)
            assert torch.equal(fast, loop) and torch.equal(dropped_fast, dropped_loop)
            assert int(dropped_fast.sum()) > 0


def _other_vertices(c: dict[str, Any], i: int, count: int, seed: int) -> list[tuple[Any, Any]]:
    """``count`` vertices of sample ``i``'s multiplier set (linprog with random positive
    costs), as full ``(ineq_duals, eq_duals)`` rows."""
    problem = c["problem"]
    act = torch.nonzero(c["used"][i]).flatten().numpy()
    G = problem.G.numpy()
    A = problem.A.numpy()
    z0, y0 = c["ineq"][i, act].numpy(), c["eq"][i].numpy()
    M = np.hstack([G[act].T, A.T])
    r = M @ np.concatenate([np.maximum(z0, 0.0), y0])
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        cost = np.concatenate([rng.uniform(0.5, 2.0, act.size), np.zeros(A.shape[0])])
        bounds = [(0, None)] * act.size + [(None, None)] * A.shape[0]
        res = so.linprog(cost, A_eq=M, b_eq=r, bounds=bounds, method="highs-ds")
        assert res.status == 0
        nu = torch.zeros_like(c["ineq"][i])
        nu[torch.from_numpy(act)] = torch.from_numpy(res.x[: act.size])
        out.append((nu, torch.from_numpy(res.x[act.size :])))
    return out


@pytest.mark.parametrize("batched", [True, False])
def test_rule_depends_on_the_multiplier_set_only(
    monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    """Started from the backend's multipliers or from other vertices of the multiplier set,
    the rule keeps the same rows (batched and per-sample)."""
    calls = _capture(monkeypatch)
    _row_backward(qptl_batch(32, eps=0.1, seed=2), 2)
    c = calls[0]
    args = (c["problem"], c["used"], c["ineq"], c["eq"], c["skip"])
    ref, _ = vx.vertex_rows(*args, keep_parallel=True, batched=batched)
    for i in torch.nonzero(~c["skip"]).flatten().tolist():
        only = torch.ones_like(c["skip"])
        only[i] = False  # the rule for sample i alone
        for nu, mu in _other_vertices(c, i, 3, seed=i):
            ineq, eq = c["ineq"].clone(), c["eq"].clone()
            ineq[i], eq[i] = nu, mu
            got, _ = vx.vertex_rows(c["problem"], c["used"], ineq, eq, only,
                                    keep_parallel=True, batched=batched)  # fmt: skip
            assert torch.equal(got[i], ref[i]), i


def test_vertex_cost_breaks_ties_of_balanced_exchanges() -> None:
    """An exchange of multiplier mass between rows ``a, b, c, d`` with ``a - b - c + d = 0``
    (QPTL on the 5 x 5 grid: two pairs of consecutive bound rows on a path, e.g. rows
    ``7, 8, 31, 32`` of sample 15 of ``qptl_batch(32, eps=0.1, seed=2)``) cost nothing under
    the old tie-break ``1 + 1e-6 i/k``, so the minimum-cost vertex was not unique and the
    batched simplex and the per-sample loop kept different rows. Each such exchange must
    change the cost by more than the simplex's tolerance (1e-12; checked up to k = 64 active
    rows; at k = 128 the closest such exchange is 5.8e-13, a near-tie), and the cost must keep
    increasing with the row index (the earlier of two copies is kept). Fails on the old cost."""
    for k in (12, 40, 64):
        c = vx.vertex_cost(k)
        assert bool((np.diff(c) > 0).all())
        for a in range(k):
            for b in range(a + 1, k):
                for cc in range(b + 1, k):
                    d = b + cc - a
                    if d >= k or d <= cc:
                        continue
                    gap = abs(c[a] - c[b] - c[cc] + c[d])
                    assert gap > 5e-12, (k, a, b, cc, d, gap)


def _reduced_loss(P, q, A, b, G, h, keep, w) -> float:  # type: ignore[no-untyped-def]
    """``w . x`` of the QP with the rows ``keep`` of ``G`` as equalities, the rest dropped
    (the piece of the solution map the vertex rule differentiates)."""
    C = np.vstack([A, G[keep]])
    n, k = P.shape[0], C.shape[0]
    K = np.block([[P, C.T], [C, np.zeros((k, k))]])
    x = np.linalg.solve(K, np.concatenate([-q, b, h[keep]]))[:n]
    return float(w @ x)


def test_row_gradients_are_the_derivative_of_the_kept_piece() -> None:
    """dL/dA, dL/db of a small QPTL (3 x 3 grid, box as explicit rows) against central
    differences of the piece with the kept rows active (smooth), and against one-sided
    differences of the QP itself along directions where that piece is the active one."""
    A_np, b_np = grid_incidence(3)
    n = A_np.shape[1]
    G_np = np.vstack([-np.eye(n), np.eye(n)])
    h_np = np.concatenate([np.zeros(n), np.ones(n)])
    P_np = 0.2 * np.eye(n)
    rng = np.random.default_rng(4)
    verdicts = 0
    for _ in range(4):
        q_np = rng.uniform(0.1, 2.0, n)
        w = rng.standard_normal(n)
        A = torch.tensor(A_np, requires_grad=True)
        b = torch.tensor(b_np, requires_grad=True)
        sol = dqp.solve(torch.tensor(P_np), torch.tensor(q_np), A=A, b=b, G=torch.tensor(G_np),
                        h=torch.tensor(h_np))  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
            (torch.tensor(w) * sol.x).sum().backward()
        assert A.grad is not None and b.grad is not None
        info = sol.info.backward
        assert info.vertex_dropped[0] > 0  # degenerate, and the vertex rule ran
        x = sol.x.detach().numpy().reshape(-1)
        active = h_np - G_np @ x <= 1e-9
        keep = active.copy()
        keep[list(info.dropped_rows[0])] = False
        step = 1e-6
        ref_A = np.zeros_like(A_np)
        for idx in np.ndindex(*A_np.shape):
            E = np.zeros_like(A_np)
            E[idx] = step
            hi = _reduced_loss(P_np, q_np, A_np + E, b_np, G_np, h_np, keep, w)
            lo = _reduced_loss(P_np, q_np, A_np - E, b_np, G_np, h_np, keep, w)
            ref_A[idx] = (hi - lo) / (2 * step)
        ref_b = np.array([
            (_reduced_loss(P_np, q_np, A_np, b_np + step * e, G_np, h_np, keep, w)
             - _reduced_loss(P_np, q_np, A_np, b_np - step * e, G_np, h_np, keep, w)) / (2 * step)
            for e in np.eye(b_np.size)
        ])  # fmt: skip
        np.testing.assert_allclose(A.grad.numpy(), ref_A, atol=1e-6, rtol=1e-6)
        np.testing.assert_allclose(b.grad.numpy(), ref_b, atol=1e-6, rtol=1e-6)

        def full_loss(theta: np.ndarray, q_np: np.ndarray = q_np, w: np.ndarray = w) -> float:
            A_t = torch.tensor(theta[: A_np.size].reshape(A_np.shape))
            b_t = torch.tensor(theta[A_np.size :])
            x_t = dqp.solve(torch.tensor(P_np), torch.tensor(q_np), A=A_t, b=b_t,
                            G=torch.tensor(G_np), h=torch.tensor(h_np)).x  # fmt: skip
            return float(torch.tensor(w) @ x_t.reshape(-1))

        theta = np.concatenate([A_np.ravel(), b_np])
        claim = np.concatenate([A.grad.numpy().ravel(), b.grad.numpy()])
        f0 = full_loss(theta)
        for _ in range(40):  # the piece is active on about one side in 2^(dropped rows)
            d = rng.standard_normal(theta.size)
            th = theta + STEPS[0] * d
            piece = _reduced_loss(P_np, q_np, th[: A_np.size].reshape(A_np.shape),
                                  th[A_np.size :], G_np, h_np, keep, w)  # fmt: skip
            if abs(piece - full_loss(th)) > 1e-10:
                continue  # another piece is active along d: no verdict
            quotients = [(full_loss(theta + t * d) - f0) / t for t in STEPS]
            if max(quotients) - min(quotients) > 1e-5 * (1 + max(map(abs, quotients))):
                continue  # unstable quotients: no verdict
            assert abs(float(claim @ d) - quotients[-1]) <= 1e-5 * (1 + abs(quotients[-1]))
            verdicts += 1
    assert verdicts >= 3, verdicts
