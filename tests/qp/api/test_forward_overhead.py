"""The lean forward of issue 10 keeps its guarantees: the vectorised batch certificate gives
the per-sample certificate's verdict, the outputs never share memory with the stored solution
the backward reads, and non-float64 inputs still come back in their own dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.certify.polish import ROUNDOFF, _check, _make, batch_accept_exact
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.solvers.daqp import DaqpBatch

F64 = torch.float64


def _per_sample_verdict(problem, i: int, x, mu, nu, g_inf, eps_abs: float) -> bool:
    """The reference: :func:`dxopt.qp.certify.polish.polish` accepts an exact-working-set point of
    sample ``i`` without polishing iff its certificate passes, is settled, and no row outside
    the working set is violated beyond round-off (``_check`` with ``J`` = the rows with a
    multiplier)."""

    def pick(name: str, base: int):
        t = getattr(problem, name)
        return None if t is None else (t.numpy()[i] if t.ndim > base else t.numpy())

    P, q, A, b, G, h = (pick(k, 2 if k in "PAG" else 1) for k in ("P", "q", "A", "b", "G", "h"))
    d = _make(P, q, A, b, G, h, eps_abs, 0.0, g_inf, None)
    J = (nu > 0) & (g_inf > 0) if problem.m else None
    cert, violated, negative = _check(d, x, mu, nu, J)
    inexact = bool(problem.m) and bool(violated.any() or negative.any())
    return cert.ok and cert.settled and not inexact


def _case(rng: np.random.Generator, n: int, m: int, p: int, zero_row: bool):
    M = rng.standard_normal((n, n))
    P = M @ M.T + 0.1 * np.eye(n)
    q = rng.standard_normal(n)
    G = rng.standard_normal((m, n))
    if zero_row:
        G[0] = 0.0
    h = rng.random(m) + 0.1  # x = 0 is feasible
    A = rng.standard_normal((p, n)) if p else None
    b = np.zeros(p) if p else None
    return P, q, A, b, G, h


@pytest.mark.parametrize("seed", range(40))
def test_batch_certificate_matches_the_per_sample_certificate(seed: int) -> None:
    """Exact daqp points, the same points nudged (off by 1e-7 or 1e-13: refused or accepted
    as round-off) and multipliers dropped: the batch verdict and the per-sample verdict agree
    sample by sample, including zero rows of G."""
    rng = np.random.default_rng(seed)
    n, m, p = int(rng.integers(2, 7)), int(rng.integers(1, 6)), int(rng.integers(0, 3))
    P, q, A, b, G, h = _case(rng, n, m, p, zero_row=seed % 4 == 0)
    data = zip("PqAbGh", (P, q, A, b, G, h))
    as_t = {k: None if v is None else torch.from_numpy(v) for k, v in data}
    sol = dqp.solve(**dict(zip("PqAbGh", as_t.values())), solver="daqp")
    x0 = sol.x.numpy()
    mu0 = np.zeros(p) if sol.eq_duals is None else sol.eq_duals.numpy()
    nu0 = sol.ineq_duals.numpy()
    problem = canonical_problem(*as_t.values())
    g_inf = np.abs(G).max(-1)
    xs, mus, nus = [x0], [mu0], [nu0]
    for scale in (1e-7, 1e-13):
        xs.append(x0 + scale * rng.standard_normal(n))
        mus.append(mu0)
        nus.append(nu0)
    xs.append(x0)  # drop the multipliers: dual residual (unless no row is active)
    mus.append(mu0)
    nus.append(np.zeros(m))
    X, MU, NU = np.array(xs), np.array(mus).reshape(len(xs), p), np.array(nus)
    # the batch certificate takes one shared problem against a stack of points
    batch = batch_accept_exact(problem, X, MU, NU, g_inf, eps_abs=1e-9, eps_rel=0.0)
    ref = [_per_sample_verdict(problem, 0, X[i], MU[i], NU[i], g_inf, 1e-9) for i in range(len(xs))]
    assert batch.ok.tolist() == ref
    assert batch.ok[0]  # daqp's own point certifies
    # the reported residuals are the plain ones
    for i in range(len(xs)):
        dual = P @ X[i] + q + G.T @ NU[i] + (A.T @ MU[i] if p else 0.0)
        assert batch.dual[i] == pytest.approx(np.abs(dual).max(), rel=1e-12, abs=1e-12)  # round-off
        prim = max(np.maximum(G @ X[i] - h, 0.0).max(), np.abs(A @ X[i] - b).max() if p else 0.0)
        assert batch.primal[i] == pytest.approx(prim, rel=1e-12, abs=1e-12)


def test_batch_certificate_round_off_violation_of_a_free_row() -> None:
    """A row outside the working set (multiplier 0) violated by more than round-off but
    within eps_abs is refused (it needs the polish); violated by less it is accepted."""
    X = np.array([[1.0 + 1e-10, 0.0], [1.0 + 0.1 * ROUNDOFF, 0.0]])
    P, q = torch.eye(2, dtype=F64), -torch.from_numpy(X)  # both points are stationary
    G, h = torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([1.0], dtype=F64)
    problem = canonical_problem(P, q, G=G, h=h)
    NU, g_inf = np.zeros((2, 1)), np.ones(1)
    cert = batch_accept_exact(problem, X, np.zeros((2, 0)), NU, g_inf, eps_abs=1e-9, eps_rel=0.0)
    assert cert.ok.tolist() == [False, True]
    assert cert.primal.tolist() == [X[0, 0] - 1.0, X[1, 0] - 1.0]
    assert cert.dual.tolist() == [0.0, 0.0]
    ref = [_per_sample_verdict(problem, i, X[i], np.zeros(0), NU[i], g_inf, 1e-9) for i in (0, 1)]
    assert ref == [False, True]


def test_outputs_do_not_share_memory_with_the_stored_solution() -> None:
    """The forward copies its outputs: changing ``sol.x`` in place after the solve does not
    change the gradient (the backward reads the stored solution)."""
    rng = np.random.default_rng(1)
    P, q, _, _, G, h = _case(rng, 5, 4, 0, zero_row=False)
    w = torch.from_numpy(rng.standard_normal(5))

    def grads(tamper: bool) -> list[torch.Tensor]:
        ins = [torch.from_numpy(v).requires_grad_() for v in (P, q, G, h)]
        sol = dqp.solve(ins[0], ins[1], G=ins[2], h=ins[3], solver="daqp")
        if tamper:
            sol.x.detach().fill_(123.0)
            sol.ineq_duals.detach().fill_(7.0)
        (w * sol.x).sum().backward()
        return [t.grad.clone() for t in ins]

    clean, tampered = grads(False), grads(True)
    for a, c in zip(clean, tampered):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


@pytest.mark.parametrize("batched", [False, True])
def test_float32_inputs_keep_their_dtype(batched: bool) -> None:
    rng = np.random.default_rng(2)
    P, q, A, b, G, h = _case(rng, 4, 3, 1, zero_row=False)
    if batched:
        q = np.stack([q, -q])
    ref = dqp.solve(
        **dict(
            zip("PqAbGh", (None if v is None else torch.from_numpy(v) for v in (P, q, A, b, G, h)))
        )
    )
    sol = dqp.solve(
        **dict(
            zip(
                "PqAbGh",
                (None if v is None else torch.from_numpy(v).float() for v in (P, q, A, b, G, h)),
            )
        ),
        solver="daqp",
    )
    assert sol.x.dtype == torch.float32 and sol.ineq_duals.dtype == torch.float32
    assert sol.x.shape == ref.x.shape and sol.eq_duals.shape == ref.eq_duals.shape
    torch.testing.assert_close(sol.x.double(), ref.x, rtol=0, atol=1e-4)


@pytest.mark.parametrize("batched", ["G", "A", "GA"])
def test_daqp_batch_stacks_constraints_per_sample(batched: str) -> None:
    """With a batched ``G`` and/or ``A`` the rows [G_i; A_i] are stacked per sample: every
    sample gives bit for bit the point of the same problem solved alone."""
    rng = np.random.default_rng(5)
    probs = [_case(rng, 5, 3, 2, zero_row=False) for _ in range(3)]

    def arg(k: int, name: str) -> np.ndarray:
        return np.stack([pr[k] for pr in probs]) if name in batched else probs[0][k]

    P, q = probs[0][0], probs[0][1]
    batch = DaqpBatch(P, q, arg(2, "A"), arg(3, "A"), arg(4, "G"), arg(5, "G"))
    for i in range(3):
        A = probs[i if "A" in batched else 0][2]
        G, h = (probs[i if "G" in batched else 0][k] for k in (4, 5))
        alone = DaqpBatch(P, q, A, np.zeros(2), G, h).solve(0, {"primal_tol": 1e-9})
        out = batch.solve(i, {"primal_tol": 1e-9})
        assert out.flag == alone.flag == 1
        np.testing.assert_array_equal(out.x, alone.x)
        np.testing.assert_array_equal(out.ineq_duals, alone.ineq_duals)
        np.testing.assert_array_equal(out.eq_duals, alone.eq_duals)
