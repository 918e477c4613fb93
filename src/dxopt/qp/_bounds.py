"""Box bounds :math:`lb \\le x \\le ub` as extra inequality rows.

Finite entries of ``lb`` become rows :math:`-e_i^\\top x \\le -lb_i` and finite entries of
``ub`` rows :math:`e_i^\\top x \\le ub_i`, appended to :math:`(G, h)` with differentiable torch
operations, so gradients reach ``lb`` and ``ub`` through autograd and the bound multipliers
come back as slices of the inequality multipliers. Infinite entries add no row.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["append_bounds"]


def _finite_mask(name: str, bound: object, q: Tensor) -> tuple[Tensor, Tensor]:
    if not isinstance(bound, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(bound).__name__}.")
    if bound.dtype != q.dtype or bound.device != q.device:
        raise ValueError(
            f"{name}: expected dtype {q.dtype} on {q.device} like q, got {bound.dtype} on "
            f"{bound.device}. Use {name}.to(q)."
        )
    n = q.shape[-1]
    if bound.ndim not in (1, 2) or bound.shape[-1] != n:
        raise ValueError(
            f"{name}: expected shape ({n},) or (B, {n}), got {tuple(bound.shape)}. Reshape it."
        )
    if bool(torch.isnan(bound).any()):
        raise ValueError(f"{name}: expected numbers or +-inf, got NaN. Use +-inf for no bound.")
    finite = torch.isfinite(bound)
    mask = finite if finite.ndim == 1 else finite[0]
    if finite.ndim == 2 and not bool((finite == mask).all()):
        raise ValueError(
            f"{name}: expected the same finite entries in every batch sample, got differing "
            "patterns. Use a large finite bound instead of inf where needed."
        )
    return mask, torch.nonzero(mask).flatten()


def append_bounds(
    q: Tensor,
    G: Tensor | None,
    h: Tensor | None,
    lb: Tensor | None,
    ub: Tensor | None,
    *,
    sparse: bool,
) -> tuple[Tensor | None, Tensor | None, int, int]:
    """Return ``(G', h', k_lb, k_ub)``: ``G``/``h`` with the bound rows appended at the end."""
    rows: list[Tensor] = []
    rhs: list[Tensor] = []
    counts = []
    n = q.shape[-1]
    for name, bound, sign in (("lb", lb, -1.0), ("ub", ub, 1.0)):
        if bound is None:
            counts.append(0)
            continue
        _, idx = _finite_mask(name, bound, q)
        k = int(idx.numel())
        counts.append(k)
        if k == 0:
            continue
        if sparse:
            ind = torch.stack([torch.arange(k, device=q.device), idx])
            vals = torch.full((k,), sign, dtype=q.dtype, device=q.device)
            rows.append(torch.sparse_coo_tensor(ind, vals, (k, n)).coalesce())
        else:
            rows.append(sign * torch.eye(n, dtype=q.dtype, device=q.device)[idx])
        rhs.append(sign * bound[..., idx])
    if not rows:
        return G, h, 0, 0
    if G is not None and G.layout == torch.sparse_csr:
        G = G.to_sparse_coo()
    blocks = ([G] if G is not None else []) + rows
    if G is not None and G.layout == torch.strided and G.ndim == 3:
        blocks = [G] + [r.expand(G.shape[0], *r.shape) for r in rows]
    G_new = torch.cat(blocks, 0 if blocks[0].ndim == 2 else 1)
    vectors = ([h] if h is not None else []) + rhs
    batch = max(v.shape[0] if v.ndim == 2 else 0 for v in vectors)
    if batch:
        vectors = [v if v.ndim == 2 else v.expand(batch, -1) for v in vectors]
    h_new = torch.cat(vectors, -1)
    return G_new, h_new, counts[0], counts[1]
