"""An exact reduction of the Jacobian :math:`J = [[P, A^\\top D], [A, D - I]]` before it is
factored: inactive cone rows and the variables that only they touch.

With ``n`` primal variables and the ``m`` cone rows of :mod:`dxopt.conic.kkt`:

- **E** (eliminated): a cone row ``i`` with :math:`D_{i,:} = D_{:,i} = 0` exactly (an inactive
  nonnegative row, a block projected to zero; the cones' own zero entries, no threshold). The
  column ``n + i`` of ``J`` is :math:`-e_{n+i}` and the row ``n + i`` is
  :math:`(A_i, -e_i^\\top)`: the unknown ``w_i`` appears in that one equation only.
- **Z** (decoupled): an index whose row and column of ``J`` are zero once E is removed, e.g.
  the epigraph variable ``t`` of CVXPY's ``abs`` (``|x| <= t <= 1``) when none of its rows is
  active. ``J`` is then singular: the rows Z of ``J`` are zero, so :math:`e_Z` span
  :math:`\\ker J^\\top`.
- **R**: the rest. :math:`J_R = J[R, R]` is factored, padded to the batch's largest ``R`` by
  :math:`c I` with :math:`c = \\Vert J_R\\Vert_1` (so that :math:`\\kappa_1` is that of
  :math:`J_R`).

In the order ``(R, Z, E)``, :math:`J = [[J_R, 0, 0], [0, 0, 0], [C_R, C, -I]]` with
:math:`C_R = J[E, R]`, :math:`C = J[E, Z] = A[E, Z]`. Where :math:`J_R` is nonsingular this
gives the minimum-norm least-squares solutions exactly (:math:`\\ker J^\\top = \\ker J^\\top J`
is spanned by :math:`e_Z`; the residual of the rows Z is the only one no solution removes):

- :math:`J^\\top u = g`: :math:`u_Z = 0`, :math:`u_E = e` minimising
  :math:`\\Vert C^\\top e - g_Z\\Vert^2 + \\Vert e + g_E\\Vert^2`, i.e.
  :math:`e = e_0 + C (I + C^\\top C)^{-1}(g_Z - C^\\top e_0)`, :math:`e_0 = -g_E`; then
  :math:`J_R^\\top u_R = g_R - C_R^\\top e`;
- :math:`J z = r`: :math:`J_R z_R = r_R`, :math:`e_0 = C_R z_R - r_E`, the free part
  :math:`z_Z = -(I + C^\\top C)^{-1} C^\\top e_0` (the smallest :math:`\\Vert z_Z\\Vert^2 +
  \\Vert z_E\\Vert^2`) and :math:`z_E = e_0 + C z_Z`.

Without Z both are the exact solutions of the regular system. The rows E of ``J`` depend on
``A`` only, so a factor of :math:`J_R` serves every ``J`` with the same E, Z (the polish's
chord steps, the backward's reuse of the polish's LU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Reduction", "reduce_jacobian", "reduced_solve", "zero_lines"]


@dataclass(frozen=True)
class Reduction:
    """The sets of :func:`reduce_jacobian` for ``k`` samples (module doc).

    ``perm`` ``(k, N)`` lists R first (in order), ``count`` ``(k,)`` is ``|R|``, ``idx`` =
    ``perm[:, :K]`` with ``K`` the largest count and ``pad`` its entries beyond each count;
    ``E`` ``(k, m)`` and ``Z`` ``(k, N)`` are masks, ``zidx``/``zpad`` list Z (padded) and
    ``C`` ``(k, m, nz)`` is :math:`A[E, Z]` (``None`` where no sample has a Z)."""

    n: int
    perm: Tensor
    count: Tensor
    idx: Tensor
    pad: Tensor
    E: Tensor
    Z: Tensor
    zidx: Tensor | None
    C: Tensor | None
    G_chol: Tensor | None

    trivial: bool
    """No sample has an E or Z index (``J_R`` is ``J`` itself)."""

    @property
    def has_z(self) -> Tensor:
        return self.Z.any(dim=-1)


def reduce_jacobian(
    J: Tensor,
    D: Tensor,
    A: Tensor,
    n: int,
    *,
    pad: Tensor | None = None,
    zero_rows: Tensor | None = None,
) -> tuple[Reduction, Tensor, Tensor]:
    """The :class:`Reduction` of ``J`` ``(k, N, N)`` (built from ``D`` ``(k, m, m)`` and ``A``
    ``(BA, m, n)``), the padded :math:`J_R` ``(k, K, K)`` and the pad scale ``c`` ``(k,)``
    (``pad`` given: that scale, so that a factor built with it serves this matrix too;
    ``zero_rows``: :func:`zero_lines` of ``J`` over its rows, where the caller has it)."""
    k, N = J.shape[0], J.shape[-1]
    # exact zero tests: a 1-norm is 0 iff every entry is (NaN and inf are not)
    E = (zero_lines(D, dim=-1) & zero_lines(D, dim=-2)) if D.shape[-1] else D.new_zeros((k, 0)) > 0
    Ef = torch.cat([torch.zeros(k, n, dtype=torch.bool, device=J.device), E], dim=-1)
    # a Z row is zero in J (its entries in the columns E are zero by construction); its
    # column is tested on the rows outside E only, for those candidates
    Z = (zero_lines(J, dim=-1) if zero_rows is None else zero_rows) & ~Ef
    if bool(Z.any()):
        cz = int(Z.sum(dim=-1).max())
        cidx = torch.argsort((~Z).to(torch.int8), dim=-1, stable=True)[:, :cz]
        cols = torch.gather(J, 2, cidx[:, None, :].expand(k, N, cz))
        live = ((cols != 0) & ~Ef[:, :, None]).any(dim=1)
        Z = Z & ~torch.zeros_like(Z).scatter(1, cidx, live & Z.gather(1, cidx))
    R = ~Ef & ~Z
    count = R.sum(dim=-1)
    K = int(count.max()) if k else N
    perm = torch.argsort((~R).to(torch.int8), dim=-1, stable=True)
    idx = perm[:, :K]
    padm = torch.arange(K, device=J.device)[None, :] >= count[:, None]
    trivial = not bool((~R).any())
    if trivial:
        Jr = J
        c = J.new_ones(k) if pad is None else pad
    else:
        bi = torch.arange(k, device=J.device)[:, None, None]
        Jr = J[bi, idx[:, :, None], idx[:, None, :]]
        Jr.masked_fill_(padm[:, :, None] | padm[:, None, :], 0.0)
        if pad is None:
            c = torch.linalg.vector_norm(Jr, 1, dim=-2).amax(dim=-1)
            c = torch.where(c > 0, c, torch.ones_like(c))
        else:
            c = pad
        Jr.diagonal(dim1=-2, dim2=-1).add_(padm * c[:, None])
    zidx = C = G_chol = None
    if bool(Z.any()):
        zcount = Z.sum(dim=-1)
        nzm = int(zcount.max())
        zidx = torch.argsort((~Z).to(torch.int8), dim=-1, stable=True)[:, :nzm]
        zok = torch.arange(nzm, device=J.device)[None, :] < zcount[:, None]
        zx = zok & (zidx < n)
        Ak = A.expand(k, *A.shape[1:])
        cols = torch.clamp(zidx, max=n - 1)[:, None, :].expand(k, A.shape[-2], nzm)
        C = torch.gather(Ak, 2, cols) * (E[:, :, None] & zx[:, None, :])
        eye = torch.eye(nzm, dtype=J.dtype, device=J.device)
        G_chol = torch.linalg.cholesky(eye + C.transpose(-1, -2) @ C)
    red = Reduction(n, perm, count, idx, padm, E, Z, zidx, C, G_chol, trivial)
    return red, Jr, c


def zero_lines(M: Tensor, *, dim: int) -> Tensor:
    """Per row (``dim=-1``) or column (``dim=-2``) of ``M`` ``(k, a, b)``: is it exactly zero?
    (Its 1-norm is 0 iff every entry is 0: NaN and inf are not; one pass, no temporary.)"""
    return torch.linalg.vector_norm(M, 1, dim=dim) == 0


def _gather(red: Reduction, v: Tensor) -> Tensor:
    return torch.gather(v, 1, red.idx).masked_fill(red.pad, 0.0)


def _scatter(red: Reduction, vr: Tensor, N: int) -> Tensor:
    # idx is a permutation's head: pads point at E or Z indices, written over below
    return vr.new_zeros((vr.shape[0], N)).scatter(1, red.idx, vr.masked_fill(red.pad, 0.0))


def _mv(M: Tensor, v: Tensor) -> Tensor:
    return (M @ v[..., None])[..., 0]


def reduced_solve(
    red: Reduction, A: Tensor, r: Tensor, solve_r: Callable[[Tensor], Tensor], *, adjoint: bool
) -> Tensor:
    """:math:`J z = r` (or :math:`J^\\top z = r`) through the reduction (module doc);
    ``solve_r(rhs)`` solves the padded :math:`J_R` system ``(k, K)`` (with or without the
    transpose, as ``adjoint``); ``A`` ``(BA, m, n)``."""
    n = red.n
    N = r.shape[-1]
    E = red.E
    if red.trivial:
        return solve_r(r)
    if adjoint:
        e = torch.where(E, -r[:, n:], torch.zeros_like(r[:, n:]))
        if red.C is not None and red.zidx is not None and red.G_chol is not None:
            h = torch.gather(r, 1, red.zidx)
            h = torch.where(red.Z.gather(1, red.zidx), h, torch.zeros_like(h))
            rhs = h - _mv(red.C.transpose(-1, -2), e)
            c = torch.cholesky_solve(rhs[..., None], red.G_chol)[..., 0]
            e = e + _mv(red.C, c)
        # g - J' e_E: the rows E of J are (A_E, -I)
        full = r.clone()
        full[:, :n] -= _mv(A.transpose(-1, -2), e)
        z = _scatter(red, solve_r(_gather(red, full)), N)
        z[:, n:] = torch.where(E, e, z[:, n:])
        return torch.where(red.Z, torch.zeros_like(z), z)
    z = _scatter(red, solve_r(_gather(red, r)), N)
    z = torch.where(red.Z, torch.zeros_like(z), z)
    e0 = _mv(A, z[:, :n]) - r[:, n:]
    e = torch.where(E, e0, torch.zeros_like(e0))
    if red.C is not None and red.zidx is not None and red.G_chol is not None:
        d = -torch.cholesky_solve(_mv(red.C.transpose(-1, -2), e)[..., None], red.G_chol)[..., 0]
        d = torch.where(red.Z.gather(1, red.zidx), d, torch.zeros_like(d))
        z = z.scatter_add(1, red.zidx, d)
        e = e + _mv(red.C, d)
    z[:, n:] = torch.where(E, e, z[:, n:])
    return z
