"""Box bounds :math:`lb \\le x \\le ub` as extra inequality rows.

Finite entries of ``lb`` become rows :math:`-e_i^\\top x \\le -lb_i` and finite entries of
``ub`` rows :math:`e_i^\\top x \\le ub_i`, appended to :math:`(G, h)` with differentiable torch
operations, so gradients reach ``lb`` and ``ub`` through autograd and the bound multipliers
come back as slices of the inequality multipliers. Infinite entries of the right sign
(``lb_i = -inf``, ``ub_i = +inf``) add no row; ``lb_i = +inf`` or ``ub_i = -inf`` makes the
sample infeasible (no ``x`` satisfies it): one zero row :math:`0^\\top x \\le -1` is appended
for those samples (``0 <= 1`` for the others), which the forward's certificate reports as
``INFEASIBLE``. A sparse ``G`` is concatenated by :class:`SparseRowCat`, whose backward hands
``G`` its own rows of the gradient (torch's ``cat`` has no sparse backward).

**Under vmap.** Which entries are finite decides which rows exist, and a bound batched by
:func:`torch.func.vmap` may have a different pattern per vmapped sample, which no Python
control flow may read. A vmapped ``lb``/``ub`` therefore gets one row per entry
(:func:`append_every_bound`), built with ``torch.where`` only: a finite bound its row
:math:`\\mp e_i^\\top x \\le \\mp b_i`, an infinite bound of the right sign the zero row
:math:`0^\\top x \\le 1` (satisfied with slack exactly 1 by every ``x``: never active, its
multiplier is zero, no large finite number stands in for the infinity), a wrong-signed one the
zero row :math:`0^\\top x \\le -1` (infeasible), and a NaN stays NaN in ``h``, which the
validation inside the solve rejects. The bound multipliers then have ``n`` entries, zero where
the bound is infinite.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dxopt.qp.problem.functorch import vmapped

__all__ = ["append_bounds", "append_every_bound"]


def _check_bound(name: str, bound: object, q: Tensor) -> Tensor:
    """Type, dtype, device and shape of ``lb``/``ub`` (no look at the values)."""
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
    return bound


def _finite_mask(name: str, bound: object, q: Tensor) -> tuple[Tensor, Tensor]:
    bound = _check_bound(name, bound, q)
    if bool(torch.isnan(bound).any()):
        raise ValueError(f"{name}: expected numbers or +-inf, got NaN. Use +-inf for no bound.")
    wrong = float("inf") if name == "lb" else float("-inf")
    finite = torch.isfinite(bound) | (bound == wrong)  # a wrong-signed inf keeps its row slot
    mask = finite if finite.ndim == 1 else finite[0]
    if finite.ndim == 2 and not bool((finite == mask).all()):
        raise ValueError(
            f"{name}: expected the same finite entries in every batch sample, got differing "
            "patterns. Use a large finite bound instead of inf where needed."
        )
    return mask, torch.nonzero(mask).flatten()


def impossible(name: str, bound: Tensor) -> Tensor:
    """Per-sample flag (``()`` or ``(B,)``): some entry is ``+inf`` in ``lb`` / ``-inf`` in
    ``ub`` (no ``x`` satisfies it)."""
    wrong = float("inf") if name == "lb" else float("-inf")
    return (bound == wrong).any(-1)


class SparseRowCat(torch.autograd.Function):
    """``cat([G, R], 0)`` for a sparse COO ``G`` with a constant sparse ``R``; the gradient of
    ``G`` is the rows ``< m`` of the incoming gradient (in ``G``'s shape)."""

    @staticmethod
    def forward(G: Tensor, R: Tensor) -> Tensor:
        return torch.cat([G.detach().coalesce(), R], 0).coalesce()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.shape = inputs[0].shape

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None]:
        m = ctx.shape[0]
        if grad.layout != torch.sparse_coo:
            grad = grad.to_sparse_coo() if grad.layout != torch.strided else grad.to_sparse()
        grad = grad.coalesce()
        idx, val = grad.indices(), grad.values()
        keep = idx[0] < m
        out = torch.sparse_coo_tensor(idx[:, keep], val[keep], ctx.shape)
        return out.coalesce(), None


def append_bounds(
    q: Tensor,
    G: Tensor | None,
    h: Tensor | None,
    lb: Tensor | None,
    ub: Tensor | None,
    *,
    sparse: bool,
) -> tuple[Tensor | None, Tensor | None, int, int]:
    """Return ``(G', h', k_lb, k_ub)``: ``G``/``h`` with the bound rows appended at the end
    (one row per finite entry; every entry when a bound is vmapped over, see
    :func:`append_every_bound`)."""
    if any(t is not None and vmapped(t) for t in (lb, ub)):
        return append_every_bound(q, G, h, lb, ub)
    rows: list[Tensor] = []
    rhs: list[Tensor] = []
    counts = []
    n = q.shape[-1]
    bad: Tensor | None = None
    for name, bound, sign in (("lb", lb, -1.0), ("ub", ub, 1.0)):
        if bound is None:
            counts.append(0)
            continue
        _, idx = _finite_mask(name, bound, q)
        flag = impossible(name, bound.detach())
        bad = flag if bad is None else bad | flag
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
        value = bound[..., idx]
        value = torch.where(torch.isfinite(value), value, torch.zeros_like(value))  # infeasible
        rhs.append(sign * value)
    if bad is not None and bool(bad.any()):  # the infeasibility row 0'x <= -1 (else <= 1)
        if sparse:
            empty = torch.zeros(2, 0, dtype=torch.int64, device=q.device)
            rows.append(torch.sparse_coo_tensor(empty, torch.zeros(0, dtype=q.dtype), (1, n)))
        else:
            rows.append(torch.zeros(1, n, dtype=q.dtype, device=q.device))
        one = torch.ones((), dtype=q.dtype, device=q.device)
        rhs.append(torch.where(bad, -one, one).unsqueeze(-1))
    if not rows:
        return G, h, 0, 0
    if G is not None and G.layout == torch.sparse_csr:
        G = G.to_sparse_coo()
    if G is not None and G.layout == torch.sparse_coo and G.requires_grad:
        tail = torch.cat(rows, 0).coalesce() if len(rows) > 1 else rows[0].coalesce()
        G_new = SparseRowCat.apply(G, tail)
        vectors = [h, *rhs] if h is not None else rhs
        batch = max(v.shape[0] if v.ndim == 2 else 0 for v in vectors)
        if batch:
            vectors = [v if v.ndim == 2 else v.expand(batch, -1) for v in vectors]
        return G_new, torch.cat(vectors, -1), counts[0], counts[1]
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


def append_every_bound(
    q: Tensor, G: Tensor | None, h: Tensor | None, lb: Tensor | None, ub: Tensor | None
) -> tuple[Tensor | None, Tensor | None, int, int]:
    """:func:`append_bounds` without data-dependent control flow: ``n`` rows per given bound,
    an infinite entry encoded as an exact zero row (module docstring). Dense ``G`` only."""
    if G is not None and G.layout != torch.strided:
        raise ValueError(
            f"G: expected a dense tensor when lb/ub are vmapped over, got {G.layout}. Pass "
            "G.to_dense(), or do not vmap over lb/ub."
        )
    n = q.shape[-1]
    eye = torch.eye(n, dtype=q.dtype, device=q.device)
    rows: list[Tensor] = [] if G is None else [G]
    rhs: list[Tensor] = [] if h is None else [h]
    counts = []
    for name, bound, sign in (("lb", lb, -1.0), ("ub", ub, 1.0)):
        if bound is None:
            counts.append(0)
            continue
        bound = _check_bound(name, bound, q)
        counts.append(n)
        finite = torch.isfinite(bound)
        wrong = bound == (float("inf") if name == "lb" else float("-inf"))
        rows.append(sign * eye * finite.to(q.dtype).unsqueeze(-2))  # row i: sign * e_i or 0
        inactive = torch.where(wrong, -1.0, 1.0).to(q.dtype)  # 0'x <= -1 / 0'x <= 1
        inactive = torch.where(torch.isnan(bound), bound, inactive)  # NaN: the solve rejects it
        rhs.append(torch.where(finite, sign * bound, inactive))
    mats = max((t.shape[0] for t in rows if t.ndim == 3), default=0)
    if mats:
        rows = [t if t.ndim == 3 else t.expand(mats, *t.shape) for t in rows]
    vecs = max((t.shape[0] for t in rhs if t.ndim == 2), default=0)
    if vecs:
        rhs = [t if t.ndim == 2 else t.expand(vecs, -1) for t in rhs]
    return torch.cat(rows, -2), torch.cat(rhs, -1), counts[0], counts[1]
