"""The regular dense backward (one batched Schur solve, ``regular_dense_adjoint``) against the
general path it short-cuts and against the exact reduced-KKT reference, in float64: mixed
batches with degenerate samples inside, zero rows, rows scaled by 1e-8/1e8, weakly active
rows, and the single-system LAPACK factorization against the batched torch one."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from _ref_problems import kkt_gradients, relative_error
from qp_zoo import QPData, complementary_qp, sparse_complementary_qp, stack, weakly_active_qp

import dxopt.qp as dqp
from dxopt.linalg.schur import schur_factor
from dxopt.qp.backward.base import BackwardBase

F64 = torch.float64
NAMES = ("P", "q", "A", "b", "G", "h")


@pytest.fixture(autouse=True)
def _batch_machinery(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the general path's batched regular backward: the lean batch path
    (dxopt.qp.lean.small_batch, compared with this path in test_small_batch.py) is switched off."""
    import dxopt.qp.api.route as api

    monkeypatch.setattr(api, "small_batch_inputs", lambda *a, **k: 0)


def _grads(data: QPData, backward: Any, grad_x: torch.Tensor) -> tuple[dict, Any]:
    leaves = [None if t is None else t.clone().requires_grad_() for t in data.args()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        sol = dqp.solve(**dict(zip("PqAbGh", leaves)), backward=backward)
        (sol.x * grad_x).sum().backward()
    return {k: t.grad for k, t in zip(NAMES, leaves) if t is not None}, sol


def _general(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the regular path off (every batch takes the general path)."""
    monkeypatch.setattr(BackwardBase, "_regular_adjoint", lambda self, *a: None)


def _reference(prob: QPData, sol: Any, i: int | None, grad_x: torch.Tensor) -> dict:
    """The exact reduced-KKT gradients on the known active set, at the returned point and
    multipliers (so the forward's round-off does not enter the comparison)."""
    pick = (lambda t: t) if i is None else (lambda t: t[i])
    at = prob._replace(
        x=pick(sol.x).detach(),
        eq_duals=None if sol.eq_duals is None else pick(sol.eq_duals).detach(),
        ineq_duals=None if sol.ineq_duals is None else pick(sol.ineq_duals).detach(),
    )
    return kkt_gradients(at, grad_x)


def _assert_same(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert relative_error(a[name], b[name]) <= tol, name


def _duplicated(base: QPData, alpha: float) -> QPData:
    """``base`` with its first active row appended again, scaled by ``alpha`` (LICQ fails)."""
    assert base.G is not None and base.h is not None and base.active is not None
    j = int(torch.nonzero(base.active)[0])
    G = torch.cat([base.G, alpha * base.G[j : j + 1]])
    h = torch.cat([base.h, alpha * base.h[j : j + 1]])
    nu = torch.cat([base.ineq_duals, torch.zeros(1, dtype=F64)])  # type: ignore[list-item]
    active = torch.cat([base.active, torch.ones(1, dtype=torch.bool)])
    return base._replace(G=G, h=h, ineq_duals=nu, active=active)


def _scaled_rows(base: QPData, scale: float) -> QPData:
    """Every other inequality row (active ones included) multiplied by ``scale``."""
    assert base.G is not None and base.h is not None and base.ineq_duals is not None
    s = torch.ones(base.G.shape[0], dtype=F64)
    s[::2] = scale
    return base._replace(G=base.G * s[:, None], h=base.h * s, ineq_duals=base.ineq_duals / s)


def _zero_row(base: QPData) -> QPData:
    """An all-zero inequality row ``0'x <= 1`` appended (never active)."""
    assert base.G is not None and base.h is not None and base.ineq_duals is not None
    assert base.active is not None
    G = torch.cat([base.G, torch.zeros(1, base.G.shape[1], dtype=F64)])
    h = torch.cat([base.h, torch.ones(1, dtype=F64)])
    nu = torch.cat([base.ineq_duals, torch.zeros(1, dtype=F64)])
    active = torch.cat([base.active, torch.zeros(1, dtype=torch.bool)])
    return base._replace(G=G, h=h, ineq_duals=nu, active=active)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize("variant", ["plain", "zero_row", "scaled_1e-8", "scaled_1e8"])
def test_regular_batch_equals_the_reference_and_the_general_path(
    backward: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = [
        complementary_qp(14, m=11, p=3, n_active=a, seed=s)
        for s, a in ((20, 0), (21, 3), (22, 6), (23, 11 - 3))
    ]
    if variant == "zero_row":
        problems = [_zero_row(p) for p in problems]
    elif variant.startswith("scaled"):
        problems = [_scaled_rows(p, float(variant.split("_")[1])) for p in problems]
    data = stack(problems)
    grad_x = torch.randn(4, 14, generator=torch.Generator().manual_seed(5), dtype=F64)
    fast, sol = _grads(data, backward, grad_x)
    diag = sol.info.backward
    assert diag.licq and diag.dependent_rows == (0,) * 4
    assert diag.n_active == tuple(int(p.active.sum()) for p in problems)  # type: ignore[union-attr]
    # rows scaled by 1e8 put the attainable relative residual (eps times the row scale) at the
    # 1e-8 limit of the residual check; every other variant is solved to round-off
    big = variant == "scaled_1e8"
    if not big:
        assert diag.linear_solver == "schur" and diag.residual <= 1e-12
    for i, prob in enumerate(problems):
        ref = _reference(prob, sol, i, grad_x[i])
        for name, expected in ref.items():
            assert relative_error(fast[name][i], expected) <= (1e-6 if big else 1e-10), (i, name)
    _general(monkeypatch)
    general, _ = _grads(data, backward, grad_x)
    _assert_same(fast, general, 1e-12)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_mixed_batch_with_degenerate_samples_equals_per_sample_solves(backward: str) -> None:
    """A batch with a dependent-row sample (x1 and x1e8 duplicate) and a weakly active one:
    the batch (general path) and every sample alone (regular path where regular) agree."""
    base = [complementary_qp(12, m=10, p=2, n_active=3, seed=s) for s in (30, 31, 32, 33)]
    problems = [_zero_row(base[0]), _duplicated(base[1], 1.0)]
    problems += [_zero_row(base[2]), _duplicated(base[3], 1e8)]
    grad_x = torch.randn(4, 12, generator=torch.Generator().manual_seed(6), dtype=F64)
    batched, sol = _grads(stack(problems), backward, grad_x)
    assert sol.info.backward.dependent_rows == (0, 1, 0, 1)
    for i, prob in enumerate(problems):
        alone, sol_i = _grads(prob, backward, grad_x[i])
        assert sol_i.info.backward.dependent_rows == ((1,) if i % 2 else (0,))
        for name in alone:
            assert relative_error(batched[name][i], alone[name]) <= 1e-10, (i, name)
    for i in (0, 2):  # the regular samples: the exact reference
        ref = _reference(problems[i], sol, i, grad_x[i])
        for name, expected in ref.items():
            assert relative_error(batched[name][i], expected) <= 1e-10, (i, name)


@pytest.mark.parametrize("weak_policy", ["inactive", "active"])
@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_weakly_active_rows_take_the_regular_path_exactly(
    backward: str, weak_policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = [weakly_active_qp(seed=s) for s in (40, 41, 42)]
    data = stack(problems)
    method = (dqp.KKTBackward if backward == "kkt" else dqp.PenaltyBackward)(
        weak_policy=weak_policy
    )
    grad_x = torch.randn(3, 12, generator=torch.Generator().manual_seed(7), dtype=F64)
    fast, sol = _grads(data, method, grad_x)
    assert sol.info.backward.n_weak == (3, 3, 3)
    assert sol.info.backward.linear_solver == "schur"
    expected_active = 3 if weak_policy == "inactive" else 6
    assert sol.info.backward.n_active == (expected_active,) * 3
    _general(monkeypatch)
    general, _ = _grads(data, method, grad_x)
    _assert_same(fast, general, 1e-12)
    if weak_policy == "inactive":  # the one-sided derivative in which the weak rows leave
        for i, prob in enumerate(problems):
            ref = _reference(prob, sol, i, grad_x[i])
            for name, expected in ref.items():
                assert relative_error(fast[name][i], expected) <= 1e-10, (i, name)


@pytest.mark.parametrize("k", [0, 1, 4, 9])
def test_single_system_lapack_factor_equals_the_batched_one(k: int) -> None:
    """One small system goes through scipy's LAPACK; the same system in a batch of two goes
    through torch. Factors, pivots and solves agree, zero (padding) rows included."""
    gen = torch.Generator().manual_seed(k)
    n = 10
    M = torch.randn(n, n, generator=gen, dtype=F64)
    P = M @ M.T + 0.1 * torch.eye(n, dtype=F64)
    C = torch.randn(1, k, n, generator=gen, dtype=F64)
    if k > 1:
        C[0, 1] = 0.0  # a padding row
        C[0, -1] *= 1e-8
    single = schur_factor(P, C)
    batched = schur_factor(P.expand(2, n, n).contiguous(), C.expand(2, k, n).contiguous())
    assert single is not None and batched is not None and single.single and not batched.single
    torch.testing.assert_close(single.L[0], batched.L[0], rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(single.pivots[0], batched.pivots[0], rtol=1e-10, atol=1e-14)
    assert int(single.dependent(1e-10)[0]) == int(batched.dependent(1e-10)[0]) == 0
    r1 = torch.randn(1, n, generator=gen, dtype=F64)
    r2 = torch.randn(1, k, generator=gen, dtype=F64)
    if k > 1:
        r2[0, 1] = 0.0
        r2[0, -1] *= 1e-8  # the row scaled by 1e-8 keeps a matching right-hand side
    u1, w1 = single.solve(r1, r2)
    u2, w2 = batched.solve(r1.expand(2, n), r2.expand(2, k))
    torch.testing.assert_close(u1[0], u2[0], rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(w1[0], w2[0], rtol=1e-11, atol=1e-13)
    # and the solve is the exact one, K [u; w] = [r1; r2], to round-off of its terms
    u, w = u1[0], w1[0]
    scale1 = (P.abs() @ u.abs() + C[0].abs().T @ w.abs() + r1[0].abs()).max()
    assert float((P @ u + C[0].T @ w - r1[0]).abs().max()) <= 1e-12 * float(scale1)
    if k:
        scale2 = (C[0].abs() @ u.abs() + r2[0].abs()).max()
        assert float((C[0] @ u - r2[0]).abs().max()) <= 1e-12 * float(scale2)


def test_single_system_reads_dependent_rows_off_its_pivots() -> None:
    gen = torch.Generator().manual_seed(3)
    n = 8
    P = torch.eye(n, dtype=F64) * 2.0
    C = torch.randn(1, 3, n, generator=gen, dtype=F64)
    C[0, 2] = 1e8 * C[0, 0]  # a scaled duplicate: dependent at any scale
    single = schur_factor(P, C)
    assert single is not None and single.single
    assert int(single.dependent(1e-10)[0]) == 1


def test_single_system_with_indefinite_P_is_refused() -> None:
    P = torch.diag(torch.tensor([1.0, -1.0, 2.0], dtype=F64))
    assert schur_factor(P, torch.zeros(1, 1, 3, dtype=F64)) is None


@pytest.mark.parametrize("batch", [1, 5])
def test_pivots_of_S_equal_those_of_the_scaled_S_hat(batch: int) -> None:
    """``schur_factor`` factors :math:`S = CP^{-1}C^T` itself and reads the pivots of the
    unit-diagonal :math:`\\hat S = D^{-1/2}SD^{-1/2}` off it: they equal the squared diagonal
    of an independent Cholesky of :math:`\\hat S` (plus the shift) on rows scaled by 1e-8 and
    1e8, a zero (padding) row gets pivot 1, an exactly dependent scaled copy reads below
    ``DEPENDENT_TOL`` (in a batch: the numpy Cholesky and syrk path; alone: LAPACK), and the
    solve is the exact saddle-point solve."""
    from dxopt.qp.certify.dependence import DEPENDENT_TOL

    gen = torch.Generator().manual_seed(21 + batch)
    n, k = 12, 7
    M = torch.randn(batch, n, n, generator=gen, dtype=F64)
    P = M @ M.mT + 0.1 * torch.eye(n, dtype=F64)
    C = torch.randn(batch, k, n, generator=gen, dtype=F64)
    C[:, 1] *= 1e-8
    C[:, 2] *= 1e8
    C[:, 4] = 0.0  # padding
    factor = schur_factor(P, C)
    assert factor is not None
    Y = torch.linalg.solve_triangular(torch.linalg.cholesky(P), C.mT, upper=False)
    S = Y.mT @ Y
    d = S.diagonal(dim1=-2, dim2=-1)
    inv = torch.where(d > 0, d, 1.0).rsqrt()
    S_hat = S * inv[:, :, None] * inv[:, None, :]
    S_hat.diagonal(dim1=-2, dim2=-1).fill_(1.0 + 1e-14)
    expected = torch.linalg.cholesky(S_hat).diagonal(dim1=-2, dim2=-1) ** 2
    torch.testing.assert_close(factor.pivots, expected, rtol=1e-11, atol=1e-14)
    assert bool((factor.pivots[:, 4] == 1.0).all())
    assert bool((factor.dependent(DEPENDENT_TOL) == 0).all())
    r1 = torch.randn(batch, n, generator=gen, dtype=F64)
    r2 = torch.randn(batch, k, generator=gen, dtype=F64) * C.abs().amax(-1)  # matching scales
    u, w = factor.solve(r1, r2)
    K = torch.zeros(batch, n + k, n + k, dtype=F64)
    K[:, :n, :n], K[:, :n, n:], K[:, n:, :n] = P, C.mT, C
    K[:, n + 4, n + 4] = 1.0  # the padding row's equation: w_4 = -r2_4 (= the solve's choice)
    z = torch.linalg.solve(K, torch.cat([r1, torch.where(C.abs().amax(-1) > 0, r2, -r2)], -1))
    assert relative_error(u, z[:, :n]) <= 1e-10
    nonzero = [j for j in range(k) if j != 4]
    for j in nonzero:  # each multiplier to its own scale (rows 1 and 2 are scaled by 1e-8, 1e8)
        assert relative_error(w[:, j], z[:, n + j]) <= 1e-8, j
    dup = C.clone()
    dup[:, 6] = -3e7 * dup[:, 0]  # a scaled copy of row 0
    dependent = schur_factor(P, dup)
    assert dependent is not None
    assert bool((dependent.dependent(DEPENDENT_TOL) == 1).all())
    assert bool((dependent.pivots[:, 6] < DEPENDENT_TOL).all())


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_sparse_problem_with_the_dense_solver_equals_the_sparse_one(backward: str) -> None:
    """``linear_solver="dense"`` on sparse matrices densifies them (regular path)."""
    data = sparse_complementary_qp(12, m=8, p=2, seed=1)
    cls = dqp.KKTBackward if backward == "kkt" else dqp.PenaltyBackward
    grad_x = torch.randn(12, generator=torch.Generator().manual_seed(8), dtype=F64)
    dense, sol = _grads(data, cls(linear_solver="dense"), grad_x)
    assert sol.info.backward.linear_solver == "schur"
    sparse, _ = _grads(data, cls(linear_solver="sparse"), grad_x)
    for name in ("q", "b", "h"):
        assert relative_error(dense[name], sparse[name]) <= 1e-10, name
    for name in ("P", "A", "G"):
        assert dense[name].layout == sparse[name].layout
        diff = (dense[name] - sparse[name]).coalesce().values().abs().max()
        assert float(diff) <= 1e-10 * float(sparse[name].coalesce().values().abs().max())


def test_refinement_never_returns_a_worse_iterate_than_the_first_solve() -> None:
    """``schur_refine`` keeps each sample's best iterate: more steps never raise a sample's
    residual (rows scaled by 1e8 put the residual at the round-off floor, where the last
    iterate alone would wander)."""
    from dxopt.qp.backward.regular import schur_refine
    from dxopt.qp.backward.rows import dense_rows
    from dxopt.qp.certify.active import identify_active
    from dxopt.qp.problem.canonical import canonical_problem
    from dxopt.qp.problem.contracts import AdjointInput

    problems = [
        _scaled_rows(complementary_qp(14, m=11, p=3, n_active=a, seed=s), 1e8)
        for s, a in ((50, 3), (51, 6), (52, 8))
    ]
    data = stack(problems)
    problem = canonical_problem(*data.args())
    S = 3
    grad_x = torch.randn(S, 14, generator=torch.Generator().manual_seed(9), dtype=F64)
    adj_in = AdjointInput(
        problem=problem,
        x=data.x,  # type: ignore[arg-type]
        eq_duals=data.eq_duals,  # type: ignore[arg-type]
        ineq_duals=data.ineq_duals,  # type: ignore[arg-type]
        grad_x=grad_x,
        grad_eq=torch.zeros(S, 3, dtype=F64),
        grad_ineq=torch.zeros(S, 11, dtype=F64),
        ok=torch.ones(S, dtype=torch.bool),
        active=data.active,
    )
    active = identify_active(
        problem, adj_in.x, adj_in.eq_duals, adj_in.ineq_duals, active_tol=None,
        weak_policy="inactive", forward_active=adj_in.active,
    )  # fmt: skip
    rows = dense_rows(adj_in, active.used)
    factor = schur_factor(rows.P, rows.C)
    assert factor is not None
    previous = None
    for steps in range(6):
        *_, residual, _ = schur_refine(rows, factor, grad_x, adj_in.ok, steps, 0.0)
        if previous is not None:
            assert bool((residual <= previous).all()), (steps, residual, previous)
        previous = residual


def _partition_cost(
    groups: list[list[int]], counts: list[int], n: int, p: int, fixed: float
) -> float:
    """The cost model of ``active_groups`` for an explicit partition (reference)."""
    total = 0.0
    for group in groups:
        k = max(counts[i] for i in group) + p
        total += len(group) * (n * n * k + 2.0 * n * k * k + k**3 / 3.0) + fixed
    return total


@pytest.mark.parametrize("seed", range(6))
def test_active_groups_minimise_the_estimated_cost_over_every_split(seed: int) -> None:
    """``active_groups`` against an exhaustive search over every split of the sorted samples
    into one to three groups (the exact minimum of the documented cost model)."""
    from dxopt.qp.backward import regular as bk

    gen = torch.Generator().manual_seed(seed)
    S, n, p = 40, 30, 7
    counts = torch.randint(0, 25, (S,), generator=gen)
    if seed % 3 == 0:
        counts[: S // 2] = 3  # a big block of equal counts
    c = counts.tolist()
    order = sorted(range(S), key=lambda i: c[i])
    best = _partition_cost([order], c, n, p, bk._GROUP_COST)
    for a in range(1, S):
        best = min(best, _partition_cost([order[:a], order[a:]], c, n, p, bk._GROUP_COST))
        for b in range(a + 1, S):
            split = [order[:a], order[a:b], order[b:]]
            best = min(best, _partition_cost(split, c, n, p, bk._GROUP_COST))
    groups = bk.active_groups(counts.numpy(), n, p)
    if groups == [None]:
        chosen = [list(range(S))]
    else:
        chosen = [g.tolist() for g in groups]  # type: ignore[union-attr]
        assert sorted(i for g in chosen for i in g) == list(range(S))  # a partition
        assert all(g == sorted(g) for g in chosen)
    assert _partition_cost(chosen, c, n, p, bk._GROUP_COST) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize("variant", ["plain", "scaled_1e-8"])
def test_grouped_batch_equals_one_group_and_the_reference(
    backward: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch split by active count (forced: no fixed group cost) gives the gradients of
    the unsplit batch and of the exact reduced-KKT reference, sample by sample."""
    from dxopt.qp.backward import regular as bk

    actives = (0, 9, 1, 10, 2, 8)
    problems = [
        complementary_qp(14, m=11, p=2, n_active=a, seed=60 + i) for i, a in enumerate(actives)
    ]
    if variant != "plain":
        problems = [_scaled_rows(p, 1e-8) for p in problems]
    data = stack(problems)
    grad_x = torch.randn(6, 14, generator=torch.Generator().manual_seed(7), dtype=F64)
    monkeypatch.setattr(bk, "_GROUP_COST", 0.0)
    groups = bk.active_groups(torch.tensor(actives).numpy(), 14, 2)
    assert len(groups) == 3 and sorted(int(i) for g in groups for i in g) == list(range(6))  # type: ignore[union-attr]
    split, sol = _grads(data, backward, grad_x)
    diag = sol.info.backward
    assert diag.linear_solver == "schur" and diag.residual <= 1e-12
    assert diag.n_active == actives
    for i, prob in enumerate(problems):
        ref = _reference(prob, sol, i, grad_x[i])
        for name, expected in ref.items():
            assert relative_error(split[name][i], expected) <= 1e-10, (i, name)
    monkeypatch.setattr(bk, "active_groups", lambda counts, n, p: [None])
    whole, _ = _grads(data, backward, grad_x)
    _assert_same(split, whole, 1e-12)


def _shared_batch(actives: tuple[int, ...], n: int, m: int, p: int) -> tuple[QPData, list]:
    """One ``P``, ``G``, ``A`` (2-D, shared) and per-sample ``q``, ``h``, ``b`` built from
    chosen solutions, active sets and positive multipliers (so each sample's KKT point is
    known and strictly complementary); returns the batch and the per-sample problems."""
    gen = torch.Generator().manual_seed(31)
    M = torch.randn(n, n, generator=gen, dtype=F64)
    P = M @ M.T + n * torch.eye(n, dtype=F64)
    G = torch.randn(m, n, generator=gen, dtype=F64)
    A = torch.randn(p, n, generator=gen, dtype=F64)
    samples = []
    for count in actives:
        x = torch.randn(n, generator=gen, dtype=F64)
        active = torch.zeros(m, dtype=torch.bool)
        active[torch.randperm(m, generator=gen)[:count]] = True
        nu = torch.where(active, 0.5 + torch.rand(m, generator=gen, dtype=F64), 0.0)
        mu = torch.randn(p, generator=gen, dtype=F64)
        q = -(P @ x + G.T @ nu + A.T @ mu)
        h = G @ x + torch.where(active, 0.0, 0.5 + torch.rand(m, generator=gen, dtype=F64))
        samples.append(QPData(P, q, A, A @ x, G, h, x, mu, nu, active))
    batch = QPData(
        P, torch.stack([s.q for s in samples]), A, torch.stack([s.b for s in samples]),  # type: ignore[misc]
        G, torch.stack([s.h for s in samples]),  # type: ignore[misc]
    )  # fmt: skip
    return batch, samples


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_grouped_batch_with_shared_matrices_equals_one_group_and_the_reference(
    backward: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``P``, ``G``, ``A`` shared by the batch (2-D) and the batch split by active count:
    the per-sample gradients of ``q``, ``h``, ``b`` and the batch-summed gradients of the
    shared matrices equal the exact reduced-KKT reference and the unsplit batch."""
    from dxopt.qp.backward import regular as bk

    actives = (1, 7, 0, 8, 2, 6)
    data, problems = _shared_batch(actives, 12, 10, 2)
    grad_x = torch.randn(6, 12, generator=torch.Generator().manual_seed(8), dtype=F64)
    monkeypatch.setattr(bk, "_GROUP_COST", 0.0)
    assert len(bk.active_groups(torch.tensor(actives).numpy(), 12, 2)) == 3
    split, sol = _grads(data, backward, grad_x)
    diag = sol.info.backward
    assert diag.linear_solver == "schur" and diag.residual <= 1e-12
    assert diag.n_active == actives
    refs = [_reference(prob, sol, i, grad_x[i]) for i, prob in enumerate(problems)]
    for name in ("q", "h", "b"):
        for i, ref in enumerate(refs):
            assert relative_error(split[name][i], ref[name]) <= 1e-10, (i, name)
    for name in ("P", "G", "A"):
        total = torch.stack([ref[name] for ref in refs]).sum(0)
        assert relative_error(split[name], total) <= 1e-10, name
    monkeypatch.setattr(bk, "active_groups", lambda counts, n, p: [None])
    whole, _ = _grads(data, backward, grad_x)
    _assert_same(split, whole, 1e-12)


def test_grouped_regular_adjoint_with_a_failed_sample_equals_one_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``regular_dense_adjoint`` split into groups (forced) with a failed sample inside (zero
    cotangents, identity ``P`` and zero rows for it): the same adjoint as the unsplit batch,
    zero on the failed sample, and the exact reduced-KKT solution on the others."""
    from dxopt.qp.backward import regular as bk
    from dxopt.qp.backward.adjoint import kkt_residual
    from dxopt.qp.certify.active import identify_active
    from dxopt.qp.problem.canonical import canonical_problem
    from dxopt.qp.problem.contracts import AdjointInput

    actives = (0, 9, 1, 10, 2, 8)
    problems = [
        complementary_qp(14, m=11, p=2, n_active=a, seed=80 + i) for i, a in enumerate(actives)
    ]
    data = stack(problems)
    problem = canonical_problem(*data.args())
    S = len(actives)
    ok = torch.ones(S, dtype=torch.bool)
    ok[3] = False
    gen = torch.Generator().manual_seed(4)
    grad_x = torch.randn(S, 14, generator=gen, dtype=F64) * ok[:, None]
    grad_ineq = torch.randn(S, 11, generator=gen, dtype=F64) * ok[:, None]
    grad_eq = torch.randn(S, 2, generator=gen, dtype=F64) * ok[:, None]
    adj_in = AdjointInput(
        problem=problem, x=data.x * ok[:, None], eq_duals=data.eq_duals,  # type: ignore[operator,arg-type]
        ineq_duals=data.ineq_duals, grad_x=grad_x, grad_eq=grad_eq,  # type: ignore[arg-type]
        grad_ineq=grad_ineq, ok=ok, active=data.active,
    )  # fmt: skip
    active = identify_active(
        problem, adj_in.x, adj_in.eq_duals, adj_in.ineq_duals, active_tol=None,
        weak_policy="inactive", forward_active=adj_in.active,
    )  # fmt: skip
    monkeypatch.setattr(bk, "_GROUP_COST", 0.0)
    counts = (active.used.sum(-1) * ok).numpy()
    assert len(bk.active_groups(counts, 14, 2)) >= 2
    split = bk.regular_dense_adjoint(adj_in, active, max_steps=5, tol=1e-13, max_residual=1e-8)
    monkeypatch.setattr(bk, "active_groups", lambda counts, n, p: [None])
    whole = bk.regular_dense_adjoint(adj_in, active, max_steps=5, tol=1e-13, max_residual=1e-8)
    assert split is not None and whole is not None
    for a, b in zip(split[:3], whole[:3]):
        assert relative_error(a, b) <= 1e-12
        assert bool((a[3] == 0).all())
    u, w_ineq, w_eq, residual, _ = split
    assert float(residual.max()) <= 1e-13
    # against K itself (unequilibrated: the refinement may stop on the equilibrated residual,
    # regular.equilibration, so the plain one is within a small factor of it)
    *_, exact = kkt_residual(adj_in, active, u, w_ineq, w_eq)
    assert float(exact.max()) <= 1e-12


def _mixed_batch() -> QPData:
    """Seven complementary QPs (batched ``P``, ``G``, ``A``) with a zero row, rows scaled by
    1e-8/1e8 and a weakly active sample: every branch of the row classification."""
    problems = []
    for i in range(7):
        base = complementary_qp(14, m=10, p=2, n_active=4, seed=300 + i)
        if i == 2:
            base = weakly_active_qp(seed=300 + i, n=14)
        base = _zero_row(base)
        problems.append(_scaled_rows(base, (1e-8, 1.0, 1e8)[i % 3]))
    return stack(problems)


def test_identify_active_does_not_depend_on_the_abs_block_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """:math:`|G||x|` and :math:`|P||x|` are formed a few samples at a time (a cache-sized
    :math:`|M|` block): the classification, slacks and accuracies are bit-identical with one
    sample per block, the default block and one block for the whole batch (the batch-sized
    :math:`|M|` of before), and the row max-norms equal :math:`\\max_j |g_{ij}|` exactly
    (+0 on the zero row)."""
    import dataclasses

    import numpy as np

    from dxopt.qp.certify import active as _active
    from dxopt.qp.problem.canonical import canonical_problem

    data = _mixed_batch()
    G = data.G.numpy()  # type: ignore[union-attr]
    inf = _active.row_inf_np(G)
    assert np.array_equal(inf, np.abs(G).max(-1))
    assert not np.signbit(inf).any()
    results = []
    args = (data.x, data.eq_duals, data.ineq_duals)
    for chunk in (1, _active._CHUNK, 1 << 40):
        monkeypatch.setattr(_active, "_CHUNK", chunk)
        problem = canonical_problem(*data.args())
        kw = {"active_tol": None, "weak_policy": "inactive", "forward_active": data.active}
        results.append(_active.identify_active(problem, *args, **kw))  # type: ignore[arg-type]
    for other in results[1:]:
        for f in dataclasses.fields(other):
            a, b = getattr(results[0], f.name), getattr(other, f.name)
            assert (a is None and b is None) or torch.equal(a, b), f.name
    assert sum(results[0].n_weak) > 0 and sum(results[0].n_active) > 0


def test_row_max_norms_are_computed_once_and_shared_by_forward_and_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forward's batch certificate computes the row max-norms of a batched ``G`` once
    (:meth:`QPProblem.derived`); the backward's row classification reuses them (one
    computation per call), the gradients equal the exact reduced-KKT ones, and a problem
    restricted to some samples (``dataclasses.replace``) or a different ``G`` recomputes."""
    import dataclasses

    from dxopt.qp.certify import active as _active
    from dxopt.qp.problem.canonical import canonical_problem
    from dxopt.qp.solvers import forward as _forward

    calls: list[tuple[int, ...]] = []
    real = _active.row_inf_np

    def counting(M: Any) -> Any:
        calls.append(M.shape)
        return real(M)

    monkeypatch.setattr(_active, "row_inf_np", counting)
    monkeypatch.setattr(_forward, "row_inf_np", counting)
    data = stack([complementary_qp(12, m=9, p=2, n_active=4, seed=400 + i) for i in range(5)])
    grad_x = torch.randn(5, 12, generator=torch.Generator().manual_seed(7), dtype=F64)
    grads, sol = _grads(data, "kkt", grad_x)
    assert calls == [(5, 9, 12)]
    for i in range(5):
        ref = _reference(
            data.__class__(*(None if t is None else t[i] for t in data)), sol, i, grad_x[i]
        )
        _assert_same({k: v[i] for k, v in grads.items() if k in ref}, ref, 1e-10)
    problem = canonical_problem(*data.args())
    first = problem.derived("G_inf", "G", lambda: real(problem.G.numpy()))  # type: ignore[union-attr]
    assert problem.derived("G_inf", "G", lambda: pytest.fail("recomputed")) is first
    sub = dataclasses.replace(problem, G=problem.G[:2], batch=2)  # type: ignore[index]
    again = sub.derived("G_inf", "G", lambda: real(sub.G.numpy()))  # type: ignore[union-attr]
    assert again.shape == (2, 9) and again is not first
    assert torch.equal(torch.from_numpy(again), torch.from_numpy(first[:2]))


def test_batch_with_an_infeasible_sample_classifies_rows_without_the_forward_norms() -> None:
    """A batch whose sample 2 is infeasible (the forward's batch certificate does not run, so
    no row max-norms are shared): the other samples' gradients equal those of the same
    problems solved without it, and the failed sample's are zero."""
    problems = [complementary_qp(12, m=9, p=2, n_active=3, seed=500 + i) for i in range(4)]
    bad = problems[2]
    assert bad.G is not None and bad.h is not None
    G, h = bad.G.clone(), bad.h.clone()
    G[1], h[0], h[1] = -G[0], -1.0, -1.0  # g'x <= -1 and -g'x <= -1: infeasible
    problems[2] = bad._replace(G=G, h=h)
    data = stack(problems)
    grad_x = torch.randn(4, 12, generator=torch.Generator().manual_seed(9), dtype=F64)
    leaves = [None if t is None else t.clone().requires_grad_() for t in data.args()]
    sol = dqp.solve(**dict(zip("PqAbGh", leaves)), solver="daqp", on_failure="nan")
    (torch.nan_to_num(sol.x) * grad_x).sum().backward()
    grads = {k: t.grad for k, t in zip(NAMES, leaves) if t is not None}
    assert [s.name for s in sol.status] == ["SOLVED", "SOLVED", "INFEASIBLE", "SOLVED"]
    keep = [0, 1, 3]
    sub = stack([problems[i] for i in keep])
    sub_grads, _ = _grads(sub, "penalty", grad_x[keep])
    assert grads.keys() == sub_grads.keys()
    for name, g in grads.items():
        assert bool((g[2] == 0).all()), name
        assert relative_error(g[keep], sub_grads[name]) <= 1e-12, name


def test_numpy_diagonal_shift_equals_the_torch_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched factorization's diagonal shift and pivots in numpy (a CPU float64 batch)
    are bit-identical to the torch arithmetic they replace, zero rows included."""
    from dxopt.linalg import schur

    gen = torch.Generator().manual_seed(12)
    M = torch.randn(6, 10, 10, generator=gen, dtype=F64)
    P = M @ M.mT + 0.1 * torch.eye(10, dtype=F64)
    C = torch.randn(6, 7, 10, generator=gen, dtype=F64)
    C[:, 3] = 0.0
    C[:, 5] = 1e-9 * C[:, 0]
    factor = schur_factor(P, C)
    assert factor is not None
    S0 = schur._gram(factor.Y)  # the unshifted Schur complement, as the factorization forms it
    S_np, S_t = S0.clone(), S0.clone()
    out_np = schur._shifted(S_np, 1e-14)
    monkeypatch.setattr(schur, "_numpy_batch", lambda *t: False)
    out_t = schur._shifted(S_t, 1e-14)
    assert torch.equal(S_np, S_t)
    for a, b in zip(out_np, out_t):
        assert torch.equal(a, b)
    assert bool((out_np[0][:, 3] == 1.0).all()) and not bool(out_np[1][:, 3].any())
    pivots = factor.LS.diagonal(dim1=-2, dim2=-1).pow(2).mul_(out_t[2])
    assert torch.equal(factor.pivots, pivots)
