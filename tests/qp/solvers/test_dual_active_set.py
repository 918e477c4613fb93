"""The compiled dual active-set solver (dxopt.qp.solvers.dual_active_set) and the lean batch path
that runs it for ``solver="auto"``: its points against daqp's and the KKT conditions, the
statuses of what it does not solve (those samples go to daqp), and the results through
:func:`dxopt.qp.solve` against the general path, finite differences and live graphs that
share shapes (pooled buffers)."""

from __future__ import annotations

import warnings

import daqp
import numpy as np
import pytest
import torch
from _fd import directional_verdicts
from tests.qp.lean.test_small_batch import NAMES, _harden, _problems, _run, _share

import dxopt.qp as dqp
from dxopt.linalg.small import lapack_kernels
from dxopt.qp.problem.options import COMPILED_SOLVER
from dxopt.qp.solvers.dual_active_set import SOLVE_STATUS, solve_batch

LEAN = "SmallQPFunction"


def _layout(data: dict) -> tuple[np.ndarray, ...]:
    """``(P, q, C, upper, m)`` of a batch in daqp's layout (``C = [G; A]``)."""
    B, n = data["q"].shape
    G = data["G"].numpy() if data["G"] is not None else np.zeros((B, 0, n))
    h = data["h"].numpy() if data["h"] is not None else np.zeros((B, 0))
    A = data["A"].numpy() if data["A"] is not None else np.zeros((B, 0, n))
    b = data["b"].numpy() if data["b"] is not None else np.zeros((B, 0))
    C = np.ascontiguousarray(np.concatenate([G, A], axis=1))
    upper = np.ascontiguousarray(np.concatenate([h, b], axis=1))
    return data["P"].numpy().copy(), data["q"].numpy().copy(), C, upper, G.shape[1]


def _solve(P, q, C, upper, m, tol=1e-6, max_iter=1000):
    B, n = q.shape
    rows = C.shape[1]
    X, duals = np.zeros((B, n)), np.zeros((B, rows))
    L, Yt = np.zeros((B, n, n)), np.zeros((B, rows, n))
    w = min(n, rows) + 1
    order, LW = np.zeros((B, w), np.int64), np.zeros((B, w, w))
    cold = np.zeros((B, 0), np.int64)  # no warm working sets
    status, iterations = solve_batch(P, q, C, upper, m, tol, max_iter, lapack_kernels(), X,
                                     duals, L, Yt, order, LW, cold)  # fmt: skip
    return status, iterations, X, duals, L, Yt, order, LW


@pytest.mark.parametrize(
    ("B", "n", "m", "p"),
    [
        (6, 5, 3, 1),
        (6, 10, 5, 0),
        (5, 20, 30, 5),
        (3, 64, 64, 20),
        (4, 8, 0, 3),
        (4, 8, 0, 0),
        (4, 1, 1, 0),
        (3, 50, 50, 25),
    ],
)
def test_points_match_daqp_and_satisfy_kkt(B, n, m, p):
    data = _problems(B, n, m, p, seed=100 + n + m + p)
    P, q, C, upper, m = _layout(data)
    status, _, X, duals, L, Yt, order, LW = _solve(P, q, C, upper, m)
    assert (status == 0).all(), [SOLVE_STATUS[s] for s in status]
    lower = np.full(C.shape[1], -1e30)
    for i in range(B):
        sense = np.concatenate([np.zeros(m, np.int32), np.full(C.shape[1] - m, 5, np.int32)])
        lo = np.where(sense == 5, upper[i], lower)
        x_ref, _, flag, info = daqp.solve(P[i], q[i], C[i], upper[i], lo, sense, eps_prox=0.0)
        assert flag == 1
        scale = 1.0 + np.abs(x_ref).max()
        np.testing.assert_allclose(X[i], x_ref, rtol=0, atol=1e-8 * scale)
        np.testing.assert_array_equal(duals[i, :m] > 0, info["lam"][:m] > 0)  # working set
        lam_scale = 1.0 + np.abs(info["lam"]).max(initial=0.0)
        np.testing.assert_allclose(duals[i], info["lam"], rtol=0, atol=1e-7 * lam_scale)
        # KKT: stationarity, primal feasibility, dual feasibility, complementarity
        grad = P[i] @ X[i] + q[i] + C[i].T @ duals[i]
        big = np.abs(P[i]).max() * np.abs(X[i]).max() + np.abs(q[i]).max()
        assert np.abs(grad).max() <= 1e-10 * (big + np.abs(C[i].T @ duals[i]).max() + 1)
        slack = upper[i] - C[i] @ X[i]
        assert (slack[:m] >= -1e-6).all() and (np.abs(slack[m:]) <= 1e-9 * scale).all()
        assert (duals[i, :m] >= 0).all()
        assert (np.abs(duals[i, :m] * slack[:m]) <= 1e-8 * lam_scale * scale).all()
        # the factors the backward reuses
        np.testing.assert_allclose(L[i] @ L[i].T, P[i], rtol=0, atol=1e-12 * np.abs(P[i]).max())
        assert (np.triu(L[i], 1) == 0).all()
        np.testing.assert_allclose(Yt[i] @ L[i].T, C[i], rtol=0,
                                   atol=1e-12 * (1 + np.abs(C[i]).max(initial=0.0)))  # fmt: skip
        # the final working set (every row with a multiplier, the equality rows) and the
        # factor of its Schur complement, which the backward takes
        W = order[i][order[i] >= 0]
        assert sorted(W.tolist()) == np.flatnonzero(duals[i] != 0).tolist() or p > 0
        assert set(np.flatnonzero(duals[i, :m] > 0)) <= set(W.tolist())
        assert set(range(m, C.shape[1])) <= set(W.tolist())
        k = W.size
        S = Yt[i][W] @ Yt[i][W].T
        Lk = np.tril(LW[i][:k, :k])
        np.testing.assert_allclose(
            Lk @ Lk.T, S, rtol=0, atol=1e-10 * (1 + np.abs(S).max(initial=0))
        )


def test_what_it_does_not_solve_gets_a_status():
    data = _problems(5, 4, 3, 2, seed=3)
    P, q, C, upper, m = _layout(data)
    P[0] = np.diag([1.0, 1.0, 1.0, -1.0])  # not positive definite
    C[1, m + 1], upper[1, m + 1] = C[1, m], upper[1, m]  # two equal equality rows
    C[2, 1], upper[2, :2] = -C[2, 0], -1.0  # g x <= -1 and -g x <= -1: infeasible
    status, *_ = _solve(P, q, C, upper, m)
    names = [SOLVE_STATUS[s] for s in status]
    assert names[0] == "factorization" and names[1] == "dependent equality"
    assert names[2] == "infeasible"
    assert names[3] == names[4] == "solved"
    status, *_ = _solve(P[3:], q[3:], C[3:], upper[3:], m, max_iter=0)
    active = (_solve(P[3:], q[3:], C[3:], upper[3:], m)[3][:, :m] > 0).any(1)
    np.testing.assert_array_equal(status == 4, active)  # a cap of 0 stops at the first join


def test_auto_takes_it_and_agrees_with_the_general_path(monkeypatch):
    """Default options on a batch: the compiled solver's points, certified, and gradients
    through its factors; the same answers as the general path (daqp) to round-off."""
    for seed, shape in ((40, (6, 10, 8, 3)), (41, (4, 30, 40, 10)), (42, (5, 6, 4, 0))):
        data = _problems(*shape, seed=seed)
        for backward in ("penalty", "kkt"):
            lean, g_lean, used = _run(data, True, monkeypatch, backward=backward, solver="auto")
            ref, g_ref, used_ref = _run(data, False, monkeypatch, backward=backward)
            assert used and not used_ref
            assert lean.info.solver == COMPILED_SOLVER
            assert lean.info.sample_solvers == (COMPILED_SOLVER,) * shape[0]
            assert lean.status == ref.status
            torch.testing.assert_close(lean.x, ref.x, rtol=0, atol=1e-8)
            for a, b in ((lean.eq_duals, ref.eq_duals), (lean.ineq_duals, ref.ineq_duals)):
                if a is not None:
                    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            for k in NAMES:
                if g_ref[k] is None:
                    assert g_lean[k] is None
                    continue
                scale = float(g_ref[k].abs().max())
                torch.testing.assert_close(g_lean[k], g_ref[k], rtol=1e-6, atol=1e-7 * (1 + scale))
            d, d_ref = lean.info.backward, ref.info.backward
            assert (d.n_active, d.n_weak, d.dependent_rows) == (
                d_ref.n_active, d_ref.n_weak, d_ref.dependent_rows)  # fmt: skip


def test_a_degenerate_sample(monkeypatch):
    """Sample 1 has two copies of an active row: the compiled solver swaps them (the second
    cannot join beside the first) and solves it; its backward declines (dependent rows) and
    the general path's degenerate policy decides for that sample."""
    data = _problems(3, 6, 3, 0, seed=24)
    G = torch.cat([data["G"], data["G"][:, :1]], dim=1)
    h = torch.cat([data["h"], data["h"][:, :1]], dim=1)
    x_free = torch.linalg.solve(data["P"][1], -data["q"][1])
    h[1, 0] = h[1, 3] = float(G[1, 0] @ x_free) - 1.0
    data["G"], data["h"] = G, h
    with pytest.warns(dqp.QPDegenerateWarning):
        lean, g_lean, used = _run(data, True, monkeypatch, solver="auto")
    with pytest.warns(dqp.QPDegenerateWarning):
        ref, g_ref, _ = _run(data, False, monkeypatch)
    assert used
    assert lean.info.sample_solvers == (COMPILED_SOLVER,) * 3
    assert lean.info.backward.dependent_rows == ref.info.backward.dependent_rows
    torch.testing.assert_close(lean.x, ref.x, rtol=0, atol=1e-8)
    for k in NAMES:
        if g_ref[k] is not None:
            torch.testing.assert_close(g_lean[k], g_ref[k], rtol=1e-6, atol=1e-7)


def test_an_infeasible_sample_gets_its_status(monkeypatch):
    data = _problems(3, 5, 3, 1, seed=26)
    data["G"][2, 1] = -data["G"][2, 0]
    data["h"][2, :2] = -1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lean, _, used = _run(data, True, monkeypatch, solver="auto", on_failure="nan")
        ref, _, _ = _run(data, False, monkeypatch, on_failure="nan")
    assert not used  # daqp fails on that sample too: the general path, per sample
    assert lean.status == ref.status and lean.status[2] != dqp.QPStatus.SOLVED
    torch.testing.assert_close(lean.x, ref.x, rtol=0, atol=1e-8, equal_nan=True)


def _x_loss_gradients(data: dict, solver: str, w: torch.Tensor):
    ins = {k: None if v is None else v.clone().requires_grad_() for k, v in data.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = dqp.solve(**dict(zip("PqAbGh", (ins[k] for k in NAMES))), solver=solver)
        (w * sol.x).sum().backward()
    return sol, {k: None if v is None else v.grad for k, v in ins.items()}


def test_adversarial_batches(monkeypatch):
    """Batches with one hard sample (rows scaled 1e-8..1e8, a near-duplicate row, a slack of
    1e-10, q x 1e-9, cond(P) 1e8): the same x as the general path (daqp); the same gradients
    of ``L = w.x`` where the general path finds every sample regular, and where it finds a
    dependent or weak row (a kink: the multipliers' split, and so the gradient of the
    dependent rows, is the point's), gradients that kink-aware differences confirm (a
    one-sided slope, or between the two: the general path's minimum-norm split of dependent
    rows is a Clarke element, and gives that for the daqp point too)."""
    taken = kinks = 0
    w = torch.tensor(np.random.default_rng(9).standard_normal((4, 8)), dtype=torch.float64)
    for seed in range(10):
        rng = np.random.default_rng(seed)
        data = _problems(4, 8, 6, 2, seed=200 + seed)
        _harden(data, int(rng.integers(4)), seed % 5, rng)
        lean, g_lean = _x_loss_gradients(data, "auto", w)
        ref, g_ref = _x_loss_gradients(data, "daqp", w)
        taken += lean.info.solver == COMPILED_SOLVER
        assert lean.status == ref.status
        scale = 1.0 + float(ref.x.detach().abs().max())
        torch.testing.assert_close(lean.x, ref.x, rtol=0, atol=1e-7 * scale)
        d = ref.info.backward
        if any(d.dependent_rows) or any(d.n_weak):
            kinks += 1

            def loss(args: dict) -> float:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return float(
                        (w * dqp.solve(**dict(zip("PqAbGh", (args[j] for j in NAMES)))).x).sum()
                    )

            assert directional_verdicts(data, g_lean, loss, hull=True) >= 3
            continue
        for k in NAMES:
            if g_ref[k] is not None:
                tol = 1e-5 * (1.0 + float(g_ref[k].abs().max()))
                torch.testing.assert_close(g_lean[k], g_ref[k], rtol=1e-5, atol=tol)
    assert taken >= 8 and kinks >= 2


def test_float32_inputs(monkeypatch):
    data = {k: None if v is None else v.float() for k, v in _problems(4, 8, 6, 2, seed=5).items()}
    lean, g_lean, used = _run(data, True, monkeypatch, solver="auto")
    ref, g_ref, _ = _run(data, False, monkeypatch)
    assert used and lean.x.dtype == torch.float32
    torch.testing.assert_close(lean.x, ref.x, rtol=1e-5, atol=1e-5)
    for k in NAMES:
        torch.testing.assert_close(g_lean[k], g_ref[k], rtol=1e-4, atol=1e-4)


def test_live_graphs_of_the_same_shape_keep_their_own_buffers():
    """The lean batch path reuses its buffers only once the batch that used them is gone: two
    graphs alive at once, backpropagated in reverse order, give each one's own gradients."""
    first = _share(_problems(5, 7, 5, 2, seed=60), ("P",))
    second = _share(_problems(5, 7, 5, 2, seed=61), ("P",))
    grads = []
    for order in ((first, second), (second,), (first,)):
        sols, inputs = [], []
        for data in order:
            ins = {k: v.clone().requires_grad_() for k, v in data.items()}
            sols.append(dqp.solve(**dict(zip("PqAbGh", (ins[k] for k in NAMES)))))
            assert LEAN in type(sols[-1].x.grad_fn).__name__
            inputs.append(ins)
        for sol, ins in reversed(list(zip(sols, inputs))):
            (sol.x.pow(2).sum() + sol.ineq_duals.sum()).backward()
            grads.append({k: ins[k].grad.clone() for k in NAMES})
    together_second, together_first, alone_second, alone_first = grads
    for k in NAMES:
        torch.testing.assert_close(together_first[k], alone_first[k], rtol=0, atol=0)
        torch.testing.assert_close(together_second[k], alone_second[k], rtol=0, atol=0)


def _pathological(rng: np.random.Generator, n: int, m: int, p: int, kind: str) -> list:
    """One dense QP ``[P, q, A, b, G, h]`` of a kind: plain, a duplicated row, an
    ill-conditioned P (eigenvalues 1e-7..1e2), rows scaled 1e-6..1e6, infeasible, or twice as
    many extra rows as unknowns."""
    M = rng.standard_normal((n, n))
    P = M @ M.T + 1e-3 * np.eye(n)
    if kind == "illcond":
        U, _ = np.linalg.qr(rng.standard_normal((n, n)))
        P = (U * np.logspace(-7, 2, n)) @ U.T
        P = (P + P.T) / 2
    x0, q = rng.standard_normal(n), rng.standard_normal(n)
    A = rng.standard_normal((p, n))
    G = rng.standard_normal((m, n))
    h = G @ x0 + rng.uniform(0, 1, m) * (rng.random(m) < 0.5)
    if kind == "dup":
        G[1], h[1] = G[0], h[0]
    elif kind == "scaled":
        s = 10.0 ** rng.uniform(-6, 6, m)
        G, h = G * s[:, None], h * s
    elif kind == "infeasible":
        G[1], h[0], h[1] = -G[0], -1.0, -1.0
    elif kind == "manyrows":
        extra = rng.standard_normal((2 * n, n))
        G, h = np.vstack([G, extra]), np.concatenate([h, extra @ x0 + 0.1])
    return [P, q, A, A @ x0, G, h]


def test_pathological_problems_agree_with_daqp():
    """Batches (one pathological sample) and single problems with n > 64 (the compiled
    single route): the same statuses and points as daqp's general path, and the same
    gradients wherever neither reports a dependent or weak row. (300 such cases agreed in a
    longer run of the same generator, 233 of them through the compiled solver.)"""
    rng = np.random.default_rng(0)
    kinds = ("plain", "dup", "illcond", "scaled", "infeasible", "manyrows")
    compiled = 0
    for trial in range(18):
        kind = kinds[trial % len(kinds)]
        single = trial % 3 == 2
        n = int(rng.integers(65, 120)) if single else int(rng.integers(3, 30))
        m, p = int(rng.integers(2, 2 * n)), int(rng.integers(0, max(1, n // 3)))
        B = 1 if single else int(rng.integers(2, 5))
        probs = [_pathological(rng, n, m, p, kind if i == 0 or kind == "manyrows" else "plain")
                 for i in range(B)]  # fmt: skip
        data = {k: torch.tensor(np.stack([pr[j] for pr in probs])) for j, k in enumerate(NAMES)}
        if single:
            data = {k: v[0] for k, v in data.items()}
        if p == 0:
            data["A"] = data["b"] = None
        w = torch.tensor(rng.standard_normal((B, n)) if not single else rng.standard_normal(n))
        out = {}
        for solver in ("auto", "daqp"):
            ins = {k: None if v is None else v.clone().requires_grad_() for k, v in data.items()}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sol = dqp.solve(
                    **dict(zip("PqAbGh", (ins[k] for k in NAMES))), solver=solver, on_failure="nan"
                )
                (w * torch.nan_to_num(sol.x)).sum().backward()
            out[solver] = (sol, {k: None if ins[k] is None else ins[k].grad for k in NAMES})
        (sa, ga), (sd, gd) = out["auto"], out["daqp"]
        compiled += sa.info.solver == COMPILED_SOLVER
        assert sa.status == sd.status, (trial, kind)
        ok = np.array([s == dqp.QPStatus.SOLVED for s in sa.status])
        xa = sa.x.detach().numpy().reshape(len(ok), -1)[ok]
        xd = sd.x.detach().numpy().reshape(len(ok), -1)[ok]
        assert np.abs(xa - xd).max(initial=0) <= 1e-6 * (1 + np.abs(xd).max(initial=0)), trial
        d, e = sd.info.backward, sa.info.backward
        if any(d.dependent_rows) or any(d.n_weak) or any(e.dependent_rows) or any(e.n_weak):
            continue  # a kink: the split of the multipliers is the point's (see above)
        for k in NAMES:
            if gd[k] is not None:
                tol = 1e-5 * (1 + float(gd[k].abs().max()))
                torch.testing.assert_close(ga[k], gd[k], rtol=1e-5, atol=tol)
    assert compiled >= 10


def _named_case(n: int, m: int, p: int, batch: int | None, seed: int) -> list:
    rng = np.random.default_rng(seed)
    shape = () if batch is None else (batch,)
    M = rng.standard_normal((*shape, n, n))
    P = M @ np.swapaxes(M, -1, -2) + np.eye(n)
    x0 = rng.standard_normal((*shape, n))
    A = rng.standard_normal((*shape, p, n))
    G = rng.standard_normal((*shape, m, n))
    h = np.einsum("...ij,...j->...i", G, x0) + rng.uniform(0, 1, (*shape, m)) * (
        rng.random((*shape, m)) < 0.5
    )
    data = [P, rng.standard_normal((*shape, n)), A, np.einsum("...ij,...j->...i", A, x0), G, h]
    return [torch.tensor(a, dtype=torch.float64) for a in data]


@pytest.mark.parametrize(("n", "m", "p", "batch"), [(10, 5, 2, None), (100, 60, 10, None),
                                                    (20, 10, 3, 8)])  # fmt: skip
def test_the_solver_can_be_named(n, m, p, batch):
    """``solver="dual_active_set"`` runs the compiled solver for one problem of any size and
    for batches; the point and gradients are daqp's (the same method), and ``info`` says so."""
    data = _named_case(n, m, p, batch, seed=n)
    grads = {}
    for solver in (COMPILED_SOLVER, "daqp"):
        leaves = [t.clone().requires_grad_() for t in data]
        sol = dqp.solve(**dict(zip("PqAbGh", leaves)), solver=solver)
        w = torch.linspace(-1.0, 1.0, n, dtype=torch.float64)
        (w * sol.x).sum().backward()
        grads[solver] = (sol, [t.grad for t in leaves])
    named, ref = grads[COMPILED_SOLVER][0], grads["daqp"][0]
    assert named.info.solver == COMPILED_SOLVER
    assert set(named.info.sample_solvers) == {COMPILED_SOLVER}
    assert ref.info.solver == "daqp"
    torch.testing.assert_close(named.x, ref.x, rtol=1e-8, atol=1e-10)
    for g, g_ref in zip(grads[COMPILED_SOLVER][1], grads["daqp"][1]):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-9 * float(g_ref.abs().max()))


@pytest.mark.parametrize("case", ["warm_start", "solver_options", "sparse"])
def test_the_named_solver_falls_back_to_daqp_where_it_does_not_apply(case):
    """Warm starts, backend options and sparse inputs are not the compiled route's: daqp (the
    same method) solves them and ``info.solver`` names it."""
    P, q, A, b, G, h = _named_case(12, 6, 2, None, seed=3)
    kwargs: dict = {}
    if case == "warm_start":
        kwargs["warm_start"] = torch.zeros(12, dtype=torch.float64)
    elif case == "solver_options":
        kwargs["solver_options"] = {"iter_limit": 500}
    else:
        P = P.to_sparse_csr()
    sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, solver=COMPILED_SOLVER, **kwargs)
    ref = dqp.solve(P, q, A=A, b=b, G=G, h=h, solver="daqp", **kwargs)
    assert sol.info.solver == "daqp"
    torch.testing.assert_close(sol.x, ref.x)


def test_large_problems_price_partially_and_factor_the_equalities_at_once():
    """m n >= 2^18 (partial pricing) with p^2 n above the BLAS Gram threshold (the equality
    rows factored by dsyrk/dpotrf): the points and multipliers are daqp's and the factors are
    those of the final working set; a duplicated equality row is still refused as
    dependent."""
    from dxopt.linalg.small import BLAS_GRAM
    from dxopt.qp.solvers.dual_active_set import _PRICING_MIN

    n, m, p = 512, 600, 64  # 356 rows active: a unique set of multipliers
    assert m * n >= _PRICING_MIN and p * p * n > BLAS_GRAM
    data = _problems(2, n, m, p, seed=7)
    P, q, C, upper, m = _layout(data)
    C[1, m + 1], upper[1, m + 1] = C[1, m], upper[1, m]  # sample 1: two equal equality rows
    status, iterations, X, duals, _, Yt, order, LW = _solve(P, q, C, upper, m, 1e-9, 5000)
    assert [SOLVE_STATUS[s] for s in status] == ["solved", "dependent equality"]
    sense = np.concatenate([np.zeros(m, np.int32), np.full(p, 5, np.int32)])
    lo = np.where(sense == 5, upper[0], -1e30)
    x_ref, _, flag, info = daqp.solve(P[0], q[0], C[0], upper[0], lo, sense, eps_prox=0.0)
    assert flag == 1 and iterations[0] >= 20  # enough joins for the candidates to matter
    np.testing.assert_allclose(X[0], x_ref, rtol=0, atol=1e-8 * (1 + np.abs(x_ref).max()))
    lam_scale = 1.0 + np.abs(info["lam"]).max()
    np.testing.assert_allclose(duals[0], info["lam"], rtol=0, atol=1e-7 * lam_scale)
    W = order[0][order[0] >= 0]
    assert W[:p].tolist() == list(range(m, m + p))  # the equalities first, in order
    assert set(np.flatnonzero(duals[0, :m] > 0)) <= set(W.tolist())
    S = Yt[0][W] @ Yt[0][W].T
    Lk = np.tril(LW[0][: W.size, : W.size])
    np.testing.assert_allclose(Lk @ Lk.T, S, rtol=0, atol=1e-10 * (1 + np.abs(S).max()))


def test_the_forward_finds_the_backwards_active_set_accuracy(monkeypatch):
    """With a backward ahead, the certificate of each compiled-solver point also gives the
    lean backward's accuracy of its active set (from its own slacks and stationarity residual):
    the value the backward would compute itself, the ambiguous (weak) sample declined alike, and
    the same gradients and diagnostics as a forward that leaves it to the backward."""
    from dxopt.qp.certify.tolerances import LEAN_MARGIN_FLOOR as _MARGIN
    from dxopt.qp.lean import small_batch as _small_batch
    from dxopt.qp.solvers.kernels.certify import point_accuracy, split_point

    data = _problems(5, 12, 10, 0, seed=51)
    x_free = torch.linalg.solve(data["P"][3], -data["q"][3])
    data["h"][3] = data["G"][3] @ x_free + 1.0
    data["h"][3, 0] = float(data["G"][3, 0] @ x_free)  # zero slack, zero multiplier: weak
    for case in (_problems(6, 20, 16, 5, seed=52), data):
        args = tuple(case[k] for k in NAMES)
        sb = _small_batch.small_batch_forward(
            args,
            len(case["q"]),
            eps_abs=1e-9,
            eps_rel=0.0,
            compiled=True,
            for_backward=True,
        )
        assert sb is not None and sb.given.all() and sb.accuracy_given.shape == (len(case["q"]),)
        m = sb.m
        for i in range(len(case["q"])):
            x, mu, nu, working = split_point(sb.X[i], sb.duals[i], np.zeros(0, np.bool_), m)
            own = point_accuracy(sb.P[i], sb.q[i], sb.C[i], sb.upper[i], m, x, nu, mu,
                                  working, sb.g_inf[i], _MARGIN)  # fmt: skip
            given = sb.accuracy_given[i]
            assert (own < 0) == (given < 0), i
            if own >= 0:
                assert abs(given - own) <= 1e-3 * own + 1e-15, (i, given, own)
    assert sb.accuracy_given[3] < 0 and (sb.accuracy_given[[0, 1, 2, 4]] >= 0).all()
    plain = _small_batch.small_batch_forward(args, 5, eps_abs=1e-9, eps_rel=0.0, compiled=True)
    assert plain is not None and plain.accuracy_given.size == 0

    results = {}
    forward = _small_batch.small_batch_forward
    for ahead in (True, False):

        def fixed(*a, ahead=ahead, **k):
            return forward(*a, **{**k, "for_backward": ahead})

        monkeypatch.setattr(dqp.api.lean, "small_batch_forward", fixed)
        results[ahead] = _run(data, True, monkeypatch, solver="auto")
    (sol_a, g_a, used_a), (sol_b, g_b, used_b) = results[True], results[False]
    assert used_a and used_b
    assert sol_a.info.backward.n_weak[3] == 1 and sol_a.info.backward == sol_b.info.backward
    for k in NAMES:
        if g_b[k] is not None:
            torch.testing.assert_close(g_a[k], g_b[k], rtol=0, atol=0)
