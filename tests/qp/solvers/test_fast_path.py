"""The fast forward path (issue 10): daqp through its own API, daqp's Cholesky as the PSD
certificate, the batch certificate for every batch size, residuals from the certificate."""

from __future__ import annotations

import numpy as np
import pytest
import qpsolvers
import torch

import dxopt.qp as dqp
from dxopt.qp.problem.types import QPStatus
from dxopt.qp.solvers.daqp import EXIT_STATUS, DaqpBatch, status_of

F64 = torch.float64


def _random(rng: np.random.Generator, n: int, m: int, p: int, *, singular: bool = False):
    M = rng.standard_normal((n, n // 2 if singular else n))
    P = M @ M.T + (0.0 if singular else 0.1) * np.eye(n)
    q = rng.standard_normal(n)
    G = rng.standard_normal((m, n))
    h = rng.random(m)  # x = 0 is feasible
    A = rng.standard_normal((p, n)) if p else None
    b = A @ rng.standard_normal(n) * 0.0 if p else None
    return P, q, A, b, G, h


def _qpsolvers(P, q, A, b, G, h, **kw):
    return qpsolvers.solve_problem(qpsolvers.Problem(P, q, G, h, A, b), solver="daqp", **kw)


@pytest.mark.parametrize("p", [0, 3])
@pytest.mark.parametrize("seed", range(6))
def test_direct_daqp_matches_qpsolvers(seed: int, p: int) -> None:
    """Same x, multipliers and found/not-found as qpsolvers' daqp wrapper, bit for bit."""
    rng = np.random.default_rng(seed)
    P, q, A, b, G, h = _random(rng, 8, 6, p)
    if seed % 3 == 2:  # a duplicated row: a degenerate working set
        G = np.vstack([G, G[:1]])
        h = np.concatenate([h, h[:1]])
    ref = _qpsolvers(P, q, A, b, G, h, primal_tol=1e-9)
    batch = DaqpBatch(P, q, A, b, G, h)
    # eps_prox=0: the PSD-certifying first call of the forward gives the same point as daqp's
    # default (automatic proximal) mode on a positive definite P
    for opts in ({"primal_tol": 1e-9}, {"primal_tol": 1e-9, "eps_prox": 0.0}):
        out = batch.solve(0, opts)
        assert ref.found and out.flag == 1
        np.testing.assert_array_equal(out.x, ref.x)
        np.testing.assert_array_equal(out.ineq_duals, ref.z)
        if p:
            np.testing.assert_array_equal(out.eq_duals, ref.y)


def test_direct_daqp_batched_arrays_match_per_sample() -> None:
    """Batched P, q, G, h with shared A, b: sample i of the batch is the single problem i."""
    rng = np.random.default_rng(7)
    probs = [_random(rng, 6, 4, 2) for _ in range(3)]
    A, b = probs[0][2], probs[0][3]
    stack = [np.stack([pr[k] for pr in probs]) for k in (0, 1, 4, 5)]
    batch = DaqpBatch(stack[0], stack[1], A, b, stack[2], stack[3])
    for i, (P, q, _, _, G, h) in enumerate(probs):
        ref = _qpsolvers(P, q, A, b, G, h)
        out = batch.solve(i, {})
        np.testing.assert_array_equal(out.x, ref.x)
        np.testing.assert_array_equal(out.eq_duals, ref.y)


def test_direct_daqp_infeasible_flag_and_status() -> None:
    """An infeasible problem: no point, flag -1, INFEASIBLE, as qpsolvers reports not found."""
    P, q = np.eye(2), np.zeros(2)
    G = np.array([[1.0, 0.0], [-1.0, 0.0]])
    h = np.array([-1.0, -1.0])  # x0 <= -1 and x0 >= 1
    out = DaqpBatch(P, q, None, None, G, h).solve(0, {})
    assert out.x is None and out.flag == -1
    assert status_of(out.flag) is QPStatus.INFEASIBLE
    assert not _qpsolvers(P, q, None, None, G, h).found
    assert status_of(-3) is QPStatus.UNBOUNDED and status_of(99) is QPStatus.FAILED
    assert set(EXIT_STATUS) == {1, 2, -1, -2, -3, -4, -5, -6}


@pytest.mark.parametrize("batched", [False, True])
def test_infeasible_status_through_solve(batched: bool) -> None:
    """The statuses of dxopt.qp.solve are unchanged: infeasible samples are INFEASIBLE."""
    P = torch.eye(2, dtype=F64)
    q = torch.zeros(2, dtype=F64)
    G = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=F64)
    h = torch.tensor([-1.0, -1.0], dtype=F64)
    if batched:
        h = torch.stack([h, torch.tensor([1.0, 1.0], dtype=F64)])
    sol = dqp.solve(P, q, G=G, h=h, on_failure="nan")
    if batched:
        assert sol.status == (QPStatus.INFEASIBLE, QPStatus.SOLVED)
        assert torch.isnan(sol.x[0]).all() and torch.isfinite(sol.x[1]).all()
        assert np.isnan(sol.info.primal_residual[0]) and sol.info.primal_residual[1] == 0.0
    else:
        assert sol.status == (QPStatus.INFEASIBLE,)
    with pytest.raises(dqp.QPSolveError):
        dqp.solve(P, q, G=G, h=h)


def test_unknown_daqp_option_names_solver_options() -> None:
    P, q = torch.eye(2, dtype=F64), torch.ones(2, dtype=F64)
    G, h = torch.ones(1, 2, dtype=F64), torch.ones(1, dtype=F64)
    with pytest.raises(ValueError, match=r"solver_options.*daqp"):
        dqp.solve(P, q, G=G, h=h, solver="daqp", solver_options={"no_such_setting": 1})


@pytest.mark.parametrize("batched", [False, True])
def test_indefinite_P_refused_with_daqp(batched: bool) -> None:
    """daqp's Cholesky stands in for the PSD check, but an indefinite P still raises the same
    ValueError (also when only one sample of a batch is indefinite)."""
    rng = np.random.default_rng(0)
    P, q, _, _, G, h = _random(rng, 5, 3, 0)
    bad = P - (np.linalg.eigvalsh(P)[0] + 1.0) * np.eye(5)  # smallest eigenvalue -1
    Pt = torch.from_numpy(np.stack([P, bad, P]) if batched else bad)
    args = (torch.from_numpy(q), None, None, torch.from_numpy(G), torch.from_numpy(h))
    with pytest.raises(ValueError, match="P: expected a positive semidefinite matrix"):
        dqp.solve(Pt, **dict(zip("qAbGh", args)), solver="daqp")
    with pytest.raises(ValueError, match="P: expected a positive semidefinite matrix"):
        dqp.solve(Pt, **dict(zip("qAbGh", args)), solver="daqp", solver_options={"eps_prox": -1e-6})
    # opting out skips the check (the user's responsibility): no ValueError from P
    sol = dqp.solve(
        Pt, **dict(zip("qAbGh", args)), solver="daqp", check_psd=False, on_failure="nan"
    )
    assert len(sol.status) == (3 if batched else 1)


def test_slightly_indefinite_P_refused_with_daqp() -> None:
    """An eigenvalue of -1e-7 (beyond the semidefinite shift of the check) is refused."""
    rng = np.random.default_rng(1)
    P, q, _, _, G, h = _random(rng, 5, 3, 0)
    P = P - (np.linalg.eigvalsh(P)[0] + 1e-7) * np.eye(5)
    t = [torch.from_numpy(v) for v in (P, q, G, h)]
    with pytest.raises(ValueError, match="smallest eigenvalue"):
        dqp.solve(t[0], t[1], G=t[2], h=t[3], solver="daqp")


def test_singular_psd_P_solved_with_daqp_like_piqp() -> None:
    """P PSD but singular: daqp's factorization fails, the PSD check passes, daqp solves it
    with its proximal mode; x matches piqp's."""
    rng = np.random.default_rng(2)
    P, q, _, _, G, h = _random(rng, 6, 0, 0, singular=True)
    G = np.vstack([np.eye(6), -np.eye(6)])
    h = np.ones(12)
    t = [torch.from_numpy(v) for v in (P, q, G, h)]
    a = dqp.solve(t[0], t[1], G=t[2], h=t[3], solver="daqp")
    b = dqp.solve(t[0], t[1], G=t[2], h=t[3], solver="piqp")
    assert a.status == (QPStatus.SOLVED,) and a.info.sample_solvers == ("daqp",)
    torch.testing.assert_close(a.x, b.x, atol=1e-7, rtol=0)


def test_batch_certificate_refuses_or_repairs_an_off_point() -> None:
    """The batch fast path never skips the certificate: daqp stopping at primal_tol=1e-5
    returns x0 = 0.5 > h = 0.499999 in sample 0; unpolished it is refused (sample 1 is
    fine), polished it is repaired onto the constraint."""
    P = torch.eye(3, dtype=F64)
    q = -torch.tensor([[0.5, -0.3, 0.2], [0.1, 0.1, 0.1]], dtype=F64)
    G = torch.tensor([[1.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.499999], dtype=F64)
    opts = {"solver": "daqp", "solver_options": {"primal_tol": 1e-5}, "fallback": False}
    refused = dqp.solve(P, q, G=G, h=h, polish=False, on_failure="nan", **opts)
    assert refused.status == (QPStatus.INACCURATE, QPStatus.SOLVED)  # a point, off
    repaired = dqp.solve(P, q, G=G, h=h, **opts)
    assert repaired.status == (QPStatus.SOLVED, QPStatus.SOLVED)
    assert repaired.info.polished == (True, False)
    assert float(repaired.x[0, 0]) <= 0.499999 * (1 + 1e-12)


@pytest.mark.parametrize("batch", [None, 4])
def test_residuals_match_a_direct_computation(batch: int | None) -> None:
    rng = np.random.default_rng(3)
    probs = [_random(rng, 7, 5, 2) for _ in range(batch or 1)]

    def stack(k: int) -> torch.Tensor:
        return torch.from_numpy(np.stack([pr[k] for pr in probs]) if batch else probs[0][k])

    P, q, A, b, G, h = (stack(k) for k in range(6))
    sol = dqp.solve(P, q, A=A, b=b, G=G, h=h)
    x = sol.x.reshape(-1, 7)
    mu, nu = sol.eq_duals.reshape(x.shape[0], -1), sol.ineq_duals.reshape(x.shape[0], -1)
    Pb, Ab, Gb = (M.expand(x.shape[0], *M.shape[-2:]) for M in (P, A, G))
    qb, bb, hb = (v.reshape(-1, v.shape[-1]) for v in (q, b, h))
    prim = torch.maximum(
        (torch.einsum("bij,bj->bi", Ab, x) - bb).abs().amax(-1),
        (torch.einsum("bij,bj->bi", Gb, x) - hb).clamp_min(0).amax(-1),
    )
    dual = (
        torch.einsum("bij,bj->bi", Pb, x)
        + qb
        + torch.einsum("bji,bj->bi", Ab, mu)
        + torch.einsum("bji,bj->bi", Gb, nu)
    )
    np.testing.assert_allclose(sol.info.primal_residual, prim.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        sol.info.dual_residual, dual.abs().amax(-1).numpy(), rtol=0, atol=1e-12
    )


def test_qp_speed_benchmark_quick(tmp_path, monkeypatch) -> None:
    """``dxopt bench qp_speed --quick`` runs, writes JSON/Markdown/plot and states the target."""
    from benchmarks.common import BENCHMARKS_MD
    from benchmarks.qp_speed import run

    before = BENCHMARKS_MD.read_text()
    monkeypatch.setattr(run, "results_dir", lambda area: tmp_path)
    run.main(["--quick", "--rounds", "3", "--no-dense"])
    text = (tmp_path / "qp_speed_quick.md").read_text()
    assert (
        "| tiny n=10, m=5 | 1 | dxopt daqp |" in text and "| 16 x n=20 | 1 | dxopt torch |" in text
    )
    assert "tiny n=10: dxopt fwd+bwd / raw daqp (<= 10)" in text
    assert (tmp_path / "qp_speed_quick.json").exists() and (
        tmp_path / "qp_speed_quick.png"
    ).exists()
    import json

    rows = json.loads((tmp_path / "qp_speed_quick.json").read_text())["rows"]
    for r in rows:
        if r["method"] in ("dxopt daqp", "dxopt torch"):  # same solution, exact gradients
            assert r["x_err"] < 1e-7 and r["grad_err"] < 1e-6, r
    assert BENCHMARKS_MD.read_text() == before


@pytest.mark.skipif(
    not __import__("pathlib").Path("/work/wt/baseline/src/dxopt/qp").is_dir(),
    reason="the frozen 0.1 code is not on this machine",
)
def test_ab_baseline_quick(tmp_path, monkeypatch) -> None:
    from benchmarks.qp_speed import ab_baseline

    monkeypatch.setattr(ab_baseline, "results_dir", lambda area: tmp_path)
    ab_baseline.main(["--quick", "--rounds", "1", "--families", "batched"])
    text = (tmp_path / "ab_baseline_quick.md").read_text()
    assert "| batched | 4 x n=8 | penalty |" in text and "| batched | 4 x n=8 | kkt |" in text
