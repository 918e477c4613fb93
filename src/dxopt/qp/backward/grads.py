"""Parameter gradients from the adjoint solution :math:`(u, w_J, w_E)`.

.. math::
    \\bar q = -u,\\quad \\bar P = -\\tfrac12(u x^\\top + x u^\\top),\\quad
    \\bar h_J = w_J,\\quad \\bar G_J = -(\\nu_J u^\\top + w_J x^\\top),\\quad
    \\bar b = w_E,\\quad \\bar A = -(\\mu u^\\top + w_E x^\\top),

zero on the rows off :math:`J`, with :math:`(\\nu, \\mu)` the multipliers of the degenerate
rule where the active rows are dependent (:mod:`dxopt.qp.backward.degenerate_rule`). Parameters
shared
by the batch get the *sum* over samples.
Sparse matrices get a gradient with exactly their own sparsity pattern (the values of the
dense formula at the stored entries), in their own layout (COO or CSR).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dxopt._core.memory import host_array
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import AdjointInput, AdjointSolution

__all__ = ["parameter_gradients"]


def _outer_sum(pairs: list[tuple[Tensor, Tensor]], template: Tensor, scale: float = -1.0) -> Tensor:
    """:math:`c\\sum_{(l, r)} l_s r_s^\\top` with ``c = scale`` (summed over samples unless
    ``template`` is batched), in the shape and sparsity pattern of ``template``. ``scale`` is
    folded into the (short) left factors, so each dense gradient is written once, by one
    product (no negated or scaled ``n x n`` temporaries); with ``scale`` a signed power of two
    the result is bit-identical to scaling afterwards (barring underflow)."""
    if template.layout == torch.sparse_coo:
        rows, cols = template.indices()
        values = torch.stack(
            [((scale * left)[:, rows] * right[:, cols]).sum(0) for left, right in pairs]
        )
        return torch.sparse_coo_tensor(
            template.indices(), values.sum(0), template.shape, is_coalesced=True
        )
    if template.ndim == 3:  # per sample: one bmm with inner dimension len(pairs)
        left = torch.stack([scale * pair[0] for pair in pairs], -1)
        right = torch.stack([pair[1] for pair in pairs], -2)
        return torch.bmm(left, right, out=_host_empty(left.shape[:2] + right.shape[2:], left))
    # one GEMM over (pairs x samples): sum_s sum_pairs l r^T = L^T R with stacked rows, into
    # reused memory where it can (_host_empty)
    left = torch.cat([pair[0] for pair in pairs], 0).mul_(scale)
    right = torch.cat([pair[1] for pair in pairs], 0)
    return torch.matmul(left.T, right, out=_host_empty((left.shape[1], right.shape[1]), left))


def _host_empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialized tensor of ``shape`` like ``like``: float64 on the CPU from
    :func:`dxopt._core.memory.host_array` (a large one: memory of an earlier gradient that is
    gone, once the user dropped it: ``zero_grad()``, ``.grad = None``), else torch's allocator.
    A fresh 48 MB gradient (``G`` at n=2000, m=3000) took 12-25 ms to allocate and write
    through torch's allocator (4 KB page faults) and up to 50 ms through numpy's when the
    kernel first had to assemble huge pages; a reused one 3-7 ms."""
    if like.device.type == "cpu" and like.dtype == torch.float64:
        return torch.from_numpy(host_array(shape))
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _vector(v: Tensor, template: Tensor) -> Tensor:
    return v if template.ndim == 2 else v.sum(0)


def _restore(g: Tensor, problem: QPProblem, index: int) -> Tensor:
    layout = problem.layouts[index]
    out = g.to(dtype=problem.dtype)
    if layout == torch.sparse_coo:
        out = out.coalesce()
    elif layout == torch.sparse_csr:
        out = out.coalesce().to_sparse_csr()
    return out.to(problem.device)


def parameter_gradients(
    data: AdjointInput, adj: AdjointSolution, needs: tuple[bool, ...] = (True,) * 6
) -> tuple[Tensor | None, ...]:
    """Gradients for ``(P, q, A, b, G, h)`` in the inputs' dtype, device and layout
    (``None`` where ``needs`` is False, so unneeded n x n products are skipped)."""
    problem = data.problem
    x, u = (data.x if adj.x is None else adj.x), adj.u
    grads: list[Tensor | None] = [None] * 6
    if needs[0]:
        grads[0] = _outer_sum([(u, x), (x, u)], problem.P, -0.5)
    if needs[1]:
        grads[1] = _vector(-u, problem.q)
    if problem.A is not None and problem.b is not None:
        w_eq = adj.w_eq
        if needs[2]:
            mu = data.eq_duals if adj.eq_duals is None else adj.eq_duals
            grads[2] = _outer_sum([(mu, u), (w_eq, x)], problem.A)
        if needs[3]:
            grads[3] = _vector(w_eq, problem.b)
    if problem.G is not None and problem.h is not None:
        used = adj.active.used.to(torch.float64)
        w_ineq = adj.w_ineq * used
        if needs[4]:
            nu_J = (data.ineq_duals if adj.ineq_duals is None else adj.ineq_duals) * used
            grads[4] = _outer_sum([(nu_J, u), (w_ineq, x)], problem.G)
        if needs[5]:
            grads[5] = _vector(w_ineq, problem.h)
    return tuple(None if g is None else _restore(g, problem, k) for k, g in enumerate(grads))
