"""gradcheck of the exact reduced-KKT backward for every parameter (dense and sparse)."""

from __future__ import annotations

import pytest
import torch
from qp_zoo import complementary_qp, sparse_complementary_qp

import dxopt.qp as dqp

BLOCKS = [(0, 0), (6, 0), (0, 3), (6, 3)]  # (m, p): none, inequalities, equalities, both


def _solve_outputs(sol: dqp.QPSolution) -> tuple[torch.Tensor, ...]:
    outs = [sol.x]
    outs += [t for t in (sol.eq_duals, sol.ineq_duals) if t is not None]
    return tuple(outs)


@pytest.mark.parametrize(("m", "p"), BLOCKS)
def test_gradcheck_dense_every_parameter(m: int, p: int) -> None:
    data = complementary_qp(6, m=m, p=p, seed=m + 10 * p)
    args = [t for t in data.args() if t is not None]

    def fn(M: torch.Tensor, q: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        P = 0.5 * (M + M.T)  # gradcheck perturbs single entries; keep P symmetric
        A, b = (rest[0], rest[1]) if p else (None, None)
        G, h = (rest[-2], rest[-1]) if m else (None, None)
        return _solve_outputs(dqp.solve(P, q, A=A, b=b, G=G, h=h, backward="kkt"))

    inputs = [t.clone().requires_grad_() for t in args]
    assert torch.autograd.gradcheck(fn, inputs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("m", "p"), BLOCKS)
def test_gradcheck_dense_batched(m: int, p: int) -> None:
    problems = [complementary_qp(6, m=m, p=p, seed=s) for s in range(2)]
    q = torch.stack([d.q for d in problems]).requires_grad_()
    P = problems[0].P.clone().requires_grad_()  # shared: gradient summed over the batch
    A = torch.stack([d.A for d in problems]).requires_grad_() if p else None  # type: ignore[misc]
    b = torch.stack([d.b for d in problems]).requires_grad_() if p else None  # type: ignore[misc]
    G = torch.stack([d.G for d in problems]).requires_grad_() if m else None  # type: ignore[misc]
    h = torch.stack([d.h for d in problems]).requires_grad_() if m else None  # type: ignore[misc]
    inputs = [t for t in (P, q, A, b, G, h) if t is not None]

    def fn(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(flat)
        M, qq = next(it), next(it)
        AA, bb = (next(it), next(it)) if p else (None, None)
        GG, hh = (next(it), next(it)) if m else (None, None)
        return _solve_outputs(
            dqp.solve(0.5 * (M + M.T), qq, A=AA, b=bb, G=GG, h=hh, backward="kkt")
        )

    assert torch.autograd.gradcheck(fn, inputs, atol=1e-6, rtol=1e-5, fast_mode=True)


def _transpose_permutation(indices: torch.Tensor) -> torch.Tensor:
    key = {(int(i), int(j)): k for k, (i, j) in enumerate(indices.T)}
    return torch.tensor([key[(int(j), int(i))] for i, j in indices.T])


@pytest.mark.parametrize(("m", "p"), BLOCKS)
@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_gradcheck_sparse_every_parameter(m: int, p: int, backward: str) -> None:
    data = sparse_complementary_qp(12, m=m, p=p, seed=3 + m + p)
    P_idx, perm = data.P.indices(), _transpose_permutation(data.P.indices())
    A_idx = data.A.indices() if p else None  # type: ignore[union-attr]
    G_idx = data.G.indices() if m else None  # type: ignore[union-attr]
    values = [data.P.values(), data.q]
    if p:
        values += [data.A.values(), data.b]  # type: ignore[union-attr, list-item]
    if m:
        values += [data.G.values(), data.h]  # type: ignore[union-attr, list-item]

    def fn(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(flat)
        pv, q = next(it), next(it)
        P = torch.sparse_coo_tensor(P_idx, 0.5 * (pv + pv[perm]), data.P.shape)
        A = b = G = h = None
        if p:
            A = torch.sparse_coo_tensor(A_idx, next(it), data.A.shape)  # type: ignore[union-attr, arg-type]
            b = next(it)
        if m:
            G = torch.sparse_coo_tensor(G_idx, next(it), data.G.shape)  # type: ignore[union-attr, arg-type]
            h = next(it)
        sol = dqp.solve(
            P, q, A=A, b=b, G=G, h=h, backward=backward, solver="clarabel", eps_abs=1e-11
        )
        return _solve_outputs(sol)

    inputs = [v.clone().requires_grad_() for v in values]
    assert torch.autograd.gradcheck(fn, inputs, atol=1e-5, rtol=1e-4, fast_mode=True)


def test_sparse_gradient_keeps_pattern_and_layout() -> None:
    data = sparse_complementary_qp(15, m=8, p=2, seed=1)
    P = data.P.clone().requires_grad_()
    G = data.G.to_sparse_csr().requires_grad_()  # type: ignore[union-attr]
    sol = dqp.solve(P, data.q, A=data.A, b=data.b, G=G, h=data.h, backward="kkt")
    sol.x.square().sum().backward()
    assert P.grad is not None and G.grad is not None
    assert P.grad.layout == torch.sparse_coo and G.grad.layout == torch.sparse_csr
    assert torch.equal(P.grad.coalesce().indices(), data.P.indices())
    assert torch.equal(G.grad.col_indices(), G.col_indices())
    P_dense = data.P.to_dense().requires_grad_()
    G_dense = data.G.to_dense().requires_grad_()  # type: ignore[union-attr]
    A_dense = data.A.to_dense()  # type: ignore[union-attr]
    dense = dqp.solve(P_dense, data.q, A=A_dense, b=data.b, G=G_dense, h=data.h, backward="kkt")
    dense.x.square().sum().backward()
    assert P_dense.grad is not None and G_dense.grad is not None
    rows, cols = data.P.indices()
    torch.testing.assert_close(P.grad.coalesce().values(), P_dense.grad[rows, cols])
    torch.testing.assert_close(G.grad.to_dense(), G_dense.grad * (G.to_dense() != 0))
