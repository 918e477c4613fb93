"""The dense backward by block elimination of P (dxopt.linalg.schur) against exact
references in float64: the reduced-KKT solve at a known active set, the null-space formula on
dependent rows, and invariances of duplicated rows at any scale."""

from __future__ import annotations

import warnings

import pytest
import torch
from _ref_problems import kkt_gradients, relative_error
from qp_zoo import QPData, complementary_qp, stack

import dxopt.qp as dqp

F64 = torch.float64
NAMES = ("P", "q", "A", "b", "G", "h")


def _grads(data: QPData, backward, grad_x: torch.Tensor):  # type: ignore[no-untyped-def]
    leaves = [None if t is None else t.clone().requires_grad_() for t in data.args()]
    sol = dqp.solve(**dict(zip("PqAbGh", leaves)), backward=backward)
    (sol.x * grad_x).sum().backward()
    out = {k: t.grad for k, t in zip(NAMES, leaves) if t is not None}
    return out, sol


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize(("n", "m", "p", "seed"), [(12, 8, 3, 0), (40, 30, 10, 1), (25, 20, 0, 2)])
def test_unbatched_gradients_equal_the_reduced_kkt_reference(backward, n, m, p, seed) -> None:  # type: ignore[no-untyped-def]
    data = complementary_qp(n, m=m, p=p, seed=seed)
    grad_x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    got, sol = _grads(data, backward, grad_x)
    assert sol.info.backward.linear_solver == "schur"
    ref = kkt_gradients(data, grad_x)
    for name, expected in ref.items():
        assert relative_error(got[name], expected) <= 1e-9, name


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_batched_gradients_equal_the_per_sample_reference(backward: str) -> None:
    problems = [
        complementary_qp(15, m=12, p=4, seed=s, n_active=a) for s, a in ((3, 2), (4, 5), (5, 0))
    ]
    data = stack(problems)
    grad_x = torch.randn(3, 15, generator=torch.Generator().manual_seed(9), dtype=F64)
    got, sol = _grads(data, backward, grad_x)
    assert sol.info.backward.linear_solver == "schur"
    for i, prob in enumerate(problems):
        ref = kkt_gradients(prob, grad_x[i])
        for name, expected in ref.items():
            assert relative_error(got[name][i], expected) <= 1e-9, (i, name)


def _singular_P_qp(shared: bool) -> tuple[QPData, list[QPData]]:
    """P = diag(1, 1, 1, 1, 0, 0) (singular) with the rows e_5, e_6 active: the reduced KKT
    matrix is nonsingular, so the gradient exists although P has no Cholesky factor."""
    out = []
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        n = 6
        P = torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], dtype=F64))
        G = torch.cat([torch.eye(n, dtype=F64)[4:], torch.randn(3, n, generator=gen, dtype=F64)])
        x = torch.randn(n, generator=gen, dtype=F64)
        nu = torch.tensor([1.0 + seed, 2.0, 0.0, 0.0, 0.0], dtype=F64)
        active = nu > 0
        h = G @ x + torch.where(active, 0.0, 1.0 + torch.rand(5, generator=gen, dtype=F64))
        q = -(P @ x) - G.T @ nu
        out.append(QPData(P, q, None, None, G, h, x, None, nu, active))
    data = stack(out)
    if shared:
        data = data._replace(P=out[0].P)
    return data, out


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_singular_P_falls_back_and_stays_exact(backward: str, shared: bool) -> None:
    data, problems = _singular_P_qp(shared)
    grad_x = torch.randn(2, 6, generator=torch.Generator().manual_seed(3), dtype=F64)
    got, sol = _grads(data, backward, grad_x)
    assert sol.info.backward.linear_solver != "schur"
    for i, prob in enumerate(problems):
        ref = kkt_gradients(prob, grad_x[i])
        for name in ("q", "G", "h"):
            assert relative_error(got[name][i], ref[name]) <= 1e-8, (i, name)
        if not shared:
            assert relative_error(got["P"][i], ref["P"]) <= 1e-8, i


@pytest.mark.parametrize("alpha", [1.0, 1e-8, 1e8])
@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_duplicated_row_at_any_scale_is_dependent_and_exact(backward: str, alpha: float) -> None:
    """Row 0 of an active set duplicated as alpha * (g_0, h_0): LICQ fails, x is unique.
    dL/dq equals the null-space reference -Z (Z'PZ)^-1 Z' xbar, and the h-gradients of the
    two copies combine to the single row's: w_0 + alpha w_dup (a shift of h_0 moves both)."""
    base = complementary_qp(10, m=6, p=2, n_active=3, seed=11)
    assert base.G is not None and base.h is not None and base.active is not None
    j = int(torch.nonzero(base.active)[0])
    G = torch.cat([base.G, alpha * base.G[j : j + 1]])
    h = torch.cat([base.h, alpha * base.h[j : j + 1]])
    dup = base._replace(G=G, h=h)
    grad_x = torch.randn(10, generator=torch.Generator().manual_seed(1), dtype=F64)
    ref = kkt_gradients(base, grad_x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        got, sol = _grads(dup, backward, grad_x)
    assert sol.info.backward.dependent_rows == (1,)
    assert relative_error(got["q"], ref["q"]) <= 1e-8
    assert relative_error(got["h"][j] + alpha * got["h"][-1], ref["h"][j]) <= 1e-7
    torch.testing.assert_close(
        got["h"][:-1][~base.active], torch.zeros(int((~base.active).sum()), dtype=F64)
    )


@pytest.mark.parametrize(("eig", "seed"), [(1e-15, 4), (0.0, 4), (0.0, 5)])
@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_nearly_singular_P_pinned_by_its_active_row_stays_exact(
    backward: str, eig: float, seed: int
) -> None:
    """P with an eigenvalue 1e-15 or 0 whose eigenvector is an active row: K is well
    conditioned but P is (numerically) singular, so its Cholesky fails (seed 4, eig 0: the
    LU / penalty-H fallback) or succeeds with a round-off pivot (seed 5); either way the
    gradient must be the exact one."""
    gen = torch.Generator().manual_seed(seed)
    n = 8
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=F64))
    P = Q @ torch.diag(torch.cat([torch.linspace(1.0, 2.0, n - 1, dtype=F64),
                                  torch.tensor([eig], dtype=F64)])) @ Q.T  # fmt: skip
    P = 0.5 * (P + P.T)
    G = torch.cat([Q[:, -1:].T, torch.randn(3, n, generator=gen, dtype=F64)])
    x = torch.randn(n, generator=gen, dtype=F64)
    nu = torch.tensor([2.0, 0.0, 0.0, 0.0], dtype=F64)
    active = nu > 0
    h = G @ x + torch.where(active, 0.0, 1.0)
    data = QPData(P, -(P @ x) - G.T @ nu, None, None, G, h, x, None, nu, active)
    grad_x = torch.randn(n, generator=gen, dtype=F64)
    got, _ = _grads(data, backward, grad_x)
    ref = kkt_gradients(data, grad_x)
    for name in ("q", "G", "h"):
        assert relative_error(got[name], ref[name]) <= 1e-6, name
