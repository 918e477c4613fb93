"""Shared problem zoo for the ``dxopt.qp`` tests (function names are stable; import freely).

Every builder returns a :class:`QPData` of float64 CPU tensors (cast with :meth:`QPData.to`).

- :func:`dense_random_qp`: the dQP generator (qp.md section 5): :math:`P = MM^\\top + 10^{-4}I`,
  :math:`M, q, G, A \\sim U[0,1]`, ``m = n``, ``p = ceil(n/2)``, :math:`h = G1 + 1`, :math:`b = A1`.
- :func:`complementary_qp`: built backwards from its KKT conditions, so the solution, the
  multipliers and the active set are known and strictly complementary with a margin.
- :func:`simplex_qp`: projection of ``y`` onto the probability simplex, dense or sparse, with
  :func:`simplex_projection` and :func:`simplex_vjp` (closed forms, qp.md section 5).
- :func:`sparse_complementary_qp`: the same construction with torch sparse ``P``, ``A``, ``G``.
- :func:`weakly_active_qp`: rows with zero slack *and* zero multiplier.
- :func:`stack`: stack problems along a new leading batch dimension.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

F64 = torch.float64


class QPData(NamedTuple):
    """A QP ``min 1/2 x'Px + q'x s.t. Ax = b, Gx <= h`` plus known solution data if any."""

    P: Tensor
    q: Tensor
    A: Tensor | None = None
    b: Tensor | None = None
    G: Tensor | None = None
    h: Tensor | None = None
    x: Tensor | None = None
    eq_duals: Tensor | None = None
    ineq_duals: Tensor | None = None
    active: Tensor | None = None

    def args(self) -> tuple[Tensor | None, ...]:
        """``(P, q, A, b, G, h)`` in the order of ``dxopt.qp.solve``."""
        return (self.P, self.q, self.A, self.b, self.G, self.h)

    def to(self, dtype: torch.dtype) -> QPData:
        """Cast every floating tensor (sparse ones included) to ``dtype``."""
        cast = [t.to(dtype) if t is not None and t.is_floating_point() else t for t in self]
        return QPData(*cast)


def dense_random_qp(n: int, *, seed: int = 0, m: int | None = None, p: int | None = None) -> QPData:
    """The dQP random dense QP (Magoon et al.; qp.md section 5); ``m`` or ``p`` = 0 drops it."""
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    p = math.ceil(n / 2) if p is None else p
    M = torch.rand(n, n, generator=gen, dtype=F64)
    P = M @ M.T + 1e-4 * torch.eye(n, dtype=F64)
    P = 0.5 * (P + P.T)
    q = torch.rand(n, generator=gen, dtype=F64)
    G = torch.rand(m, n, generator=gen, dtype=F64) if m else None
    A = torch.rand(p, n, generator=gen, dtype=F64) if p else None
    ones = torch.ones(n, dtype=F64)
    h = G @ ones + 1.0 if G is not None else None
    b = A @ ones if A is not None else None
    return QPData(P, q, A, b, G, h)


def complementary_qp(
    n: int,
    *,
    m: int = 0,
    p: int = 0,
    n_active: int | None = None,
    seed: int = 0,
    margin: float = 0.5,
    weak: int = 0,
) -> QPData:
    """Strictly complementary QP with known ``(x, mu, nu)`` and active mask.

    ``weak`` extra rows (taken from the inactive ones) get zero slack *and* zero multiplier.
    Needs ``n_active + weak + p <= n`` for LICQ (generic Gaussian rows).
    """
    gen = torch.Generator().manual_seed(seed)
    if n_active is None:
        n_active = min(m - weak, max(0, (n - p) // 2)) if m else 0
    M = torch.randn(n, n, generator=gen, dtype=F64) / n**0.5
    P = M @ M.T + 0.5 * torch.eye(n, dtype=F64)
    P = 0.5 * (P + P.T)
    x = torch.randn(n, generator=gen, dtype=F64)
    q = -(P @ x)
    A = b = G = h = mu = nu = active = None
    if p:
        A = torch.randn(p, n, generator=gen, dtype=F64)
        mu = torch.randn(p, generator=gen, dtype=F64)
        b = A @ x
        q = q - A.T @ mu
    if m:
        G = torch.randn(m, n, generator=gen, dtype=F64)
        order = torch.randperm(m, generator=gen)
        active = torch.zeros(m, dtype=torch.bool)
        active[order[:n_active]] = True
        weak_mask = torch.zeros(m, dtype=torch.bool)
        weak_mask[order[n_active : n_active + weak]] = True
        spread = torch.rand(m, generator=gen, dtype=F64)
        nu = torch.where(active, margin + spread, torch.zeros_like(spread))
        slack = torch.where(active | weak_mask, torch.zeros_like(spread), margin + spread)
        h = G @ x + slack
        q = q - G.T @ nu
    return QPData(P, q, A, b, G, h, x, mu, nu, active)


def stack(problems: list[QPData]) -> QPData:
    """Stack problems (same sizes, dense) along a new leading batch dimension."""
    return QPData(*(None if v[0] is None else torch.stack(list(v)) for v in zip(*problems)))


def simplex_projection(y: Tensor) -> Tensor:
    """Euclidean projection of ``y`` (last dimension) onto the probability simplex (sort-based)."""
    u, _ = torch.sort(y, dim=-1, descending=True)
    css = u.cumsum(-1) - 1.0
    k = torch.arange(1, y.shape[-1] + 1, dtype=y.dtype)
    cond = u - css / k > 0
    rho = cond.to(torch.int64).cumsum(-1).argmax(-1, keepdim=True)
    tau = css.gather(-1, rho) / (rho + 1).to(y.dtype)
    return (y - tau).clamp_min(0.0)


def simplex_qp(n: int, *, seed: int = 0, sparse: bool = False) -> QPData:
    """``min 1/2||x - y||^2 s.t. x >= 0, 1'x = 1`` with ``y ~ N(0, I)``: P = I, q = -y, G = -I."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(n, generator=gen, dtype=F64)
    if sparse:
        idx = torch.arange(n).repeat(2, 1)
        P = torch.sparse_coo_tensor(idx, torch.ones(n, dtype=F64), (n, n)).coalesce()
        G = torch.sparse_coo_tensor(idx, -torch.ones(n, dtype=F64), (n, n)).coalesce()
        a_idx = torch.stack([torch.zeros(n, dtype=torch.int64), torch.arange(n)])
        A = torch.sparse_coo_tensor(a_idx, torch.ones(n, dtype=F64), (1, n)).coalesce()
    else:
        P, G, A = torch.eye(n, dtype=F64), -torch.eye(n, dtype=F64), torch.ones(1, n, dtype=F64)
    x = simplex_projection(y)
    return QPData(P, -y, A, torch.ones(1, dtype=F64), G, torch.zeros(n, dtype=F64), x)


def simplex_vjp(x: Tensor, grad_x: Tensor) -> dict[str, Tensor]:
    """Closed-form VJP of the simplex projection (qp.md section 5) w.r.t. ``q``, ``b``, ``h``.

    With support :math:`S`, :math:`\\bar g_S` the mean of :math:`\\bar g` over :math:`S`:
    :math:`\\partial L/\\partial q = -1_S \\circ (\\bar g - \\bar g_S)`,
    :math:`\\partial L/\\partial b = \\bar g_S`,
    :math:`\\partial L/\\partial h_i = \\bar g_S - \\bar g_i` off :math:`S`, 0 on :math:`S`.
    """
    support = x > 0
    mean_s = grad_x[support].mean()
    s = support.to(grad_x.dtype)
    return {
        "q": -s * (grad_x - mean_s),
        "b": mean_s.reshape(1),
        "h": torch.where(support, torch.zeros_like(grad_x), mean_s - grad_x),
    }


def _to_sparse(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.to_sparse_coo().coalesce()


def sparse_complementary_qp(
    n: int, *, m: int = 0, p: int = 0, density: float = 0.3, seed: int = 0
) -> QPData:
    """A strictly complementary QP with sparse ``P`` (tridiagonal + I), ``A``, ``G`` (COO).

    Built like :func:`complementary_qp` but with random sparse rows (``density``), each row
    having at least one nonzero.
    """
    gen = torch.Generator().manual_seed(seed)

    def sparse_rows(k: int) -> Tensor:
        mask = torch.rand(k, n, generator=gen) < density
        mask[torch.arange(k), torch.randint(0, n, (k,), generator=gen)] = True
        return torch.where(mask, torch.randn(k, n, generator=gen, dtype=F64), 0.0)

    P = 2.5 * torch.eye(n, dtype=F64)
    off = -torch.ones(n - 1, dtype=F64)
    P = P + torch.diag(off, 1) + torch.diag(off, -1)
    x = torch.randn(n, generator=gen, dtype=F64)
    q = -(P @ x)
    A = b = G = h = mu = nu = active = None
    if p:
        A = sparse_rows(p)
        mu = torch.randn(p, generator=gen, dtype=F64)
        b = A @ x
        q = q - A.T @ mu
    if m:
        G = sparse_rows(m)
        n_active = min(m, max(0, (n - p) // 2))
        active = torch.randperm(m, generator=gen) < n_active
        for _ in range(100):  # redraw the active rows until LICQ holds
            C = torch.cat([G[active], A if A is not None else G[:0]])
            if int(torch.linalg.matrix_rank(C)) == C.shape[0]:
                break
            G[active] = sparse_rows(int(active.sum()))
        spread = torch.rand(m, generator=gen, dtype=F64)
        nu = torch.where(active, 0.5 + spread, torch.zeros_like(spread))
        h = G @ x + torch.where(active, torch.zeros_like(spread), 0.5 + spread)
        q = q - G.T @ nu
    return QPData(_to_sparse(P), q, _to_sparse(A), b, _to_sparse(G), h, x, mu, nu, active)  # type: ignore[arg-type]


def weakly_active_qp(seed: int = 0, *, n: int = 12, weak: int = 3) -> QPData:
    """A QP with ``weak`` rows of zero slack *and* zero multiplier (not strictly complementary)."""
    return complementary_qp(n, m=10, p=2, n_active=3, weak=weak, seed=seed)
