"""A variable without curvature pinned only by dependent active rows (the structure of
Maros-Meszaros STADAT2/STADAT3, whose gradients were judged wrong).

STADAT fits a convex sequence with bounded slopes: rows :math:`x_i - x_{i+1} \\le s`,
:math:`x_{i+1} - x_i \\le s` and :math:`-x_i + 2x_{i+1} - x_{i+2} \\le 0`; :math:`x_0` has
:math:`P_{00} = 0`, :math:`q_0 = 0`. Where the first slope sits at its bound,
:math:`x_0 \\le x_1 + s` and :math:`x_0 \\ge 2x_1 - x_2 = x_1 + s` pin it: :math:`x^\\star` is
unique, but the two pinning rows are dependent on the next slope row (convexity row = difference
of two slope rows) and have a zero multiplier at some optimal multiplier, so an active set that
drops them (the strongly active rows of an active-set backend, an incomplete vertex of the
multiplier set) leaves :math:`x_0` free and the reduced KKT matrix singular. The exact solve on
the full active set has to succeed; it used to stall (the minimum-norm refinement on STADAT's
long ill-conditioned chain, here on the pinning row scaled by ``BIG``), and the Moore-Penrose
adjoint of the dropped set then returned ``dL/dq_0 = 0`` (measured before the fix: ``[0, -0.5,
-0.5, -0.5, 0.7, -1.1]`` against the exact ``[-0.6, -0.6, -0.6, -0.6, 0.7, -1.1]``).

Here n = 6, s = 1, P = diag(0, 1, ..., 1), q = -(0, 10, 6, 5.5, 5.3, 5.2): the first three
slopes sit at -1 and x4, x5 are interior, so on the face x = (x1 + 1, x1, x1 - 1, x1 - 2, -q4,
-q5) with x1 = 1 - (q1 + q2 + q3)/3 and q0 entering through x0 = x1 + 1. The multipliers of the
active rows can all be positive (an interior-point backend returns such ones), so the face
persists under any small change of q and

    dL/dq_i = -(w0 + w1 + w2 + w3)/3 (i <= 3),   dL/dq_i = -w_i (i = 4, 5)

exactly; a translation of the feasible set by t delta is the change q + t P delta plus the shift
t delta of x, smooth as well.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import dxopt.qp as dqp
import dxopt.qp.backward.vertex as vx

F64 = torch.float64
N, SLOPE, BIG = 6, 1.0, 1e5
TARGET = (10.0, 6.0, 5.5, 5.3, 5.2)
W = torch.tensor([0.3, -1.0, 0.5, 2.0, -0.7, 1.1], dtype=F64)


def _problem(big: float = BIG) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, h = [], []
    for i in range(N - 1):  # x_i - x_{i+1} <= s, the first one (pinning x0) scaled by `big`
        f = big if i == 0 else 1.0
        r = np.zeros(N)
        r[i], r[i + 1] = f, -f
        rows.append(r)
        h.append(f * SLOPE)
    for i in range(N - 1):  # x_{i+1} - x_i <= s
        r = np.zeros(N)
        r[i], r[i + 1] = -1.0, 1.0
        rows.append(r)
        h.append(SLOPE)
    for i in range(N - 2):  # convexity
        r = np.zeros(N)
        r[i : i + 3] = (-1.0, 2.0, -1.0)
        rows.append(r)
        h.append(0.0)
    P = torch.diag(torch.tensor([0.0] + [1.0] * (N - 1), dtype=F64))
    q = -torch.tensor((0.0, *TARGET), dtype=F64)
    return P, q, torch.tensor(np.array(rows)), torch.tensor(h, dtype=F64)


def _exact_grad_q() -> torch.Tensor:
    head = -float(W[:4].sum()) / 3.0
    return torch.tensor([head] * 4 + [-float(W[4]), -float(W[5])], dtype=F64)


def _solve(q: torch.Tensor, h: torch.Tensor, sparse: bool, backward: str = "penalty"):
    P, _, G, _ = _problem()
    Pm, Gm = (P.to_sparse_csr(), G.to_sparse_csr()) if sparse else (P, G)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return dqp.solve(Pm, q, G=Gm, h=h, backward=backward)


def _loss(q: torch.Tensor, h: torch.Tensor) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(W @ _solve(q.detach(), h.detach(), False).x)


@pytest.mark.parametrize("big_sample", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_pinned_variable_gets_the_exact_gradient(monkeypatch, backward, sparse, big_sample):
    if big_sample:  # the path of a sample as big as STADAT's: the LP vertex
        monkeypatch.setattr(vx, "MAX_VERTEX_ENTRIES", 0)
    _, q0, _, h0 = _problem()
    q, h = q0.clone().requires_grad_(), h0.clone().requires_grad_()
    sol = _solve(q, h, sparse, backward)
    x = sol.x.detach()
    torch.testing.assert_close(x[0], x[1] + SLOPE, rtol=0, atol=1e-8)  # pinned at the bound
    with pytest.warns(dqp.QPDegenerateWarning):
        (W * sol.x).sum().backward()
    diag = sol.info.backward
    assert diag.pseudo_inverse == (False,), diag
    assert diag.residual <= 1e-10, diag
    assert q.grad is not None and h.grad is not None
    torch.testing.assert_close(q.grad, _exact_grad_q(), rtol=1e-8, atol=1e-9)

    # one-sided differences agree with it on both sides, along q and along a translation
    gen = torch.Generator().manual_seed(1)
    P, _, G, _ = _problem()
    t = 1e-6
    f0 = _loss(q0, h0)
    for _ in range(3):
        d = torch.randn(N, generator=gen, dtype=F64)
        delta = torch.randn(N, generator=gen, dtype=F64)
        for dq, dh, claim in (
            (d, torch.zeros_like(h0), float(q.grad @ d)),
            (torch.zeros(N, dtype=F64), G @ delta, float(h.grad @ (G @ delta))),
        ):
            plus = (_loss(q0 + t * dq, h0 + t * dh) - f0) / t
            minus = (f0 - _loss(q0 - t * dq, h0 - t * dh)) / t
            assert abs(plus - minus) <= 1e-5 * max(1.0, abs(plus)), (plus, minus)
            assert abs(claim - plus) <= 1e-5 * max(1.0, abs(plus)), (claim, plus)
        # the translation's exact derivative: w . delta + dL/dq . (P delta)
        exact = float(W @ delta) + float(_exact_grad_q() @ (P @ delta))
        torch.testing.assert_close(
            torch.tensor(float(h.grad @ (G @ delta)), dtype=F64),
            torch.tensor(exact, dtype=F64),
            rtol=1e-8,
            atol=1e-9,
        )


def test_lp_vertex_is_completed_to_a_basis_that_pins_the_variable() -> None:
    # the minimum-l1 multiplier vertex of the active rows puts no multiplier on either row that
    # pins x0 (moving it onto the next slope row lowers the l1 norm): its support has rank 2 of
    # 3, and only the completion to a basis keeps x0 determined
    _, _, G, _ = _problem(big=1.0)
    rows = [0, 1, 2, 2 * (N - 1), 2 * (N - 1) + 1]  # three slope rows, two convexity rows
    C = sp.csr_matrix(G[rows].numpy())
    z = np.array([0.86, 1.25, 0.39, 0.86, 0.28])  # positive multipliers (interior point)
    keep = vx.lp_vertex([C], z, np.zeros(0), keep_parallel=False)
    assert keep is not None
    kept = C[keep].toarray()
    assert kept.shape[0] == np.linalg.matrix_rank(C.toarray()) == 3
    assert np.linalg.matrix_rank(kept) == 3
    assert keep[0] or keep[3], keep  # a row through x0 is kept


@pytest.mark.parametrize("chunk", [1, 2, 256])
def test_complete_basis_takes_independent_rows_in_order(monkeypatch, chunk: int) -> None:
    monkeypatch.setattr(vx, "BASIS_CHUNK", chunk)
    e = np.eye(4)
    rows = np.array([e[0], e[1], (e[0] + e[1]) / np.sqrt(2), e[2], (e[2] + e[3]) / np.sqrt(2)])
    kept = sp.csr_matrix(e[:1])
    # order: e1+e2 (independent of e1: taken), e2 (in span{e1, e1+e2}: skipped), e3 (taken)
    order = np.array([2, 1, 3, 4])
    assert vx.complete_basis(kept, sp.csr_matrix(rows), order, 2) == [2, 3]
    assert vx.complete_basis(kept, sp.csr_matrix(rows), order, 3) == [2, 3, 4]
    assert vx.complete_basis(kept, sp.csr_matrix(rows), np.array([1, 2]), 2) == [1]


def _chain(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """STADAT's own structure and scales at n points: rows of norm ~1e3, P = diag(0, 1e-3, ...),
    slope bound 0.024; a target that falls steeply, then flattens (with noise)."""
    scale, s, p = 1e3, 0.024, 1e-3
    rng = np.random.default_rng(0)
    i = np.arange(1, n)
    target = 10.0 - 0.05 * np.minimum(i, n // 10) + 0.3 * rng.standard_normal(n - 1)
    rows, h = [], []
    for sign in (1.0, -1.0):  # sign (x_i - x_{i+1}) <= s
        for k in range(n - 1):
            r = np.zeros(n)
            r[k], r[k + 1] = sign * scale, -sign * scale
            rows.append(r)
            h.append(scale * s)
    for k in range(n - 2):
        r = np.zeros(n)
        r[k : k + 3] = (-scale, 2 * scale, -scale)
        rows.append(r)
        h.append(0.0)
    P = torch.diag(torch.tensor([0.0] + [p] * (n - 1), dtype=F64))
    q = torch.tensor(np.concatenate([[0.0], -p * target]), dtype=F64)
    return P, q, torch.tensor(np.array(rows)), torch.tensor(h, dtype=F64)


def _face_grad_q(P: torch.Tensor, G: torch.Tensor, h: torch.Tensor, x: torch.Tensor, w):
    """The exact derivative on the face of the tight rows: the reduced KKT system on a basis
    of them (a rank-revealing QR picks independent rows; the face is the same)."""
    import scipy.linalg as sla

    Gn, hn, xn = G.numpy(), h.numpy(), x.numpy()
    tight = np.nonzero(hn - Gn @ xn <= 1e-9 * (1.0 + np.abs(hn)))[0]
    C = Gn[tight] / np.linalg.norm(Gn[tight], axis=1, keepdims=True)
    _, R, piv = sla.qr(C.T, pivoting=True, mode="economic")
    rank = int((np.abs(np.diag(R)) > 1e-10 * abs(R[0, 0])).sum())
    B = C[np.sort(piv[:rank])]
    n = P.shape[0]
    K = np.block([[P.numpy(), B.T], [B, np.zeros((rank, rank))]])
    sol = np.linalg.solve(K, np.concatenate([w.numpy(), np.zeros(rank)]))
    return torch.from_numpy(-sol[:n]), rank


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_stadat_chain_gets_the_face_derivative(backward: str, sparse: bool) -> None:
    # at n = 300 the penalty refinement stalls on the vertex rows of the dense path (as the
    # sparse one does on STADAT2/3 itself): the exact KKT solve arbitrates, and before it
    # the pseudo-inverse of the (nonsingular) reduced KKT matrix was returned, flagged
    n = 300
    P, q0, G, h = _chain(n)
    q = q0.clone().requires_grad_()
    Pm, Gm = (P.to_sparse_csr(), G.to_sparse_csr()) if sparse else (P, G)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        sol = dqp.solve(Pm, q, G=Gm, h=h, backward=backward)
    x = sol.x.detach()
    assert abs(float(x[0] - x[1]) - 0.024) <= 1e-9  # x0 pinned at the slope bound
    w = torch.from_numpy(np.random.default_rng(1).standard_normal(n))
    with pytest.warns(dqp.QPDegenerateWarning):
        (w * sol.x).sum().backward()
    diag = sol.info.backward
    assert diag.pseudo_inverse == (False,) and diag.licq is False, diag
    assert q.grad is not None
    ref, rank = _face_grad_q(P, G, h, x, w)
    assert rank < int((h - G @ x <= 1e-9 * (1 + h.abs())).sum())  # the tight rows are dependent
    torch.testing.assert_close(q.grad, ref, rtol=1e-7, atol=1e-7 * float(ref.abs().max()))

    def loss(qv: torch.Tensor) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(w @ dqp.solve(P, qv, G=G, h=h).x)

    f0, t = loss(q0), 1e-7
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):  # the face persists along q: both one-sided slopes equal the claim
        d = torch.randn(n, generator=gen, dtype=F64) * 1e-3
        plus, minus = (loss(q0 + t * d) - f0) / t, (f0 - loss(q0 - t * d)) / t
        claim = float(q.grad @ d)
        assert abs(plus - minus) <= 1e-4 * abs(plus), (plus, minus)
        assert abs(claim - plus) <= 1e-4 * abs(plus), (claim, plus)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_a_vertex_that_frees_x_keeps_the_full_sets_minimum_norm_adjoint(monkeypatch, backward):
    # the safety net behind the basis completion: with the completion disabled, the
    # minimum-l1 vertex drops both rows through x0 (the mechanism on STADAT2/3), its reduced
    # KKT matrix is singular, and the full active set's minimum-norm adjoint (exact in q) is
    # returned instead of the pseudo-inverse
    monkeypatch.setattr(vx, "MAX_VERTEX_ENTRIES", 0)
    monkeypatch.setattr(vx, "complete_basis", lambda *args: [])
    _, q0, _, h0 = _problem()
    q = q0.clone().requires_grad_()
    # h too: with dL/dq alone any basis of the rows serves and the vertex is not computed
    sol = _solve(q, h0.clone().requires_grad_(), True, backward)
    with pytest.warns(dqp.QPDegenerateWarning, match="minimum-norm one is used"):
        (W * sol.x).sum().backward()
    diag = sol.info.backward
    assert diag.pseudo_inverse == (False,) and diag.licq is False, diag
    assert diag.n_active == (5,) and diag.residual <= 1e-10, diag
    assert q.grad is not None
    torch.testing.assert_close(q.grad, _exact_grad_q(), rtol=1e-8, atol=1e-9)


def test_min_norm_sparse_survives_p_singular_on_the_null_space() -> None:
    """Dependent rows and P singular on their null space (QFORPLAN's case): the regularised
    matrix handed to SuperLU must be quasi-definite (SuperLU crashed the process at random on
    the singular [[P, C'], [C, -delta I]]); on a consistent system the refined answer solves
    K z = r."""
    from dxopt.qp.certify.dependence import min_norm_sparse

    P = sp.csr_matrix(np.diag([1.0, 2.0, 0.0, 0.0]))
    C = sp.csr_matrix(np.array([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [0, 1.0, 0, 0]]))
    K = sp.bmat([[P, C.T], [C, None]]).toarray()
    rng = np.random.default_rng(0)
    for _ in range(40):
        rhs = K @ rng.standard_normal(7)  # consistent
        z = min_norm_sparse(P, C, rhs)
        assert np.linalg.norm(K @ z - rhs) <= 1e-8 * np.linalg.norm(rhs)
        # the duplicated rows split equally, up to round-off amplified by 1/delta
        assert abs(z[4] - z[5]) <= 1e-6 * max(1.0, abs(z[4]))
