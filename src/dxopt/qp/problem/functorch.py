"""The torch.func glue shared by every layer: which transform is active, and the folding of
vmapped dimensions into the problem's batch dimension (and back).

Each :class:`torch.autograd.Function` of the QP has a ``vmap`` staticmethod that folds the
vmapped dimension (size :math:`V`) into the batch: inputs become ``(V * B, ...)`` (``V``
outermost), one batched call runs, and the outputs are unfolded to ``(V, B, ...)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dxopt._core.torch_compat import (
    functorch_get_unwrapped,
    functorch_is_batched,
    functorch_is_wrapped,
    functorch_transforms_active,
)

__all__ = [
    "BASES",
    "fold",
    "fold_index",
    "forward_ad_dual",
    "functorch_active",
    "logical_batch",
    "sparse_under_func",
    "unfold",
    "vmapped",
]

BASES = (2, 1, 2, 1, 2, 1)  # unbatched ndim of P, q, A, b, G, h


def functorch_active() -> bool:
    """True inside a :mod:`torch.func` transform (grad, vjp, jvp, jacrev, jacfwd, vmap)."""
    return bool(functorch_transforms_active())


def forward_ad_dual(t: object) -> bool:
    """True if ``t`` is a dual tensor of eager forward-mode AD (``torch.autograd.forward_ad``)."""
    return isinstance(t, Tensor) and torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def vmapped(t: Tensor) -> bool:
    """True if an enclosing :func:`torch.func.vmap` batches ``t`` (at any level): its values
    then differ per vmapped sample, so no Python control flow may depend on them."""
    while functorch_is_wrapped(t):
        if functorch_is_batched(t):
            return True
        t = functorch_get_unwrapped(t)
    return False


def sparse_under_func(name: str, layout: torch.layout) -> TypeError:
    """The refusal of a sparse matrix that a torch.func transform differentiates."""
    return TypeError(
        f"{name}: expected a dense tensor where torch.func (grad, jvp, jacrev, jacfwd, ...) "
        f"differentiates it, got a {layout} tensor. Pass {name}.to_dense(), keep the sparse "
        f"{name} a constant of the transformed function, or differentiate it with plain "
        "autograd (.backward()), which returns sparse gradients."
    )


# ---------------------------------------------------------------------------------------------
# folding a vmapped dimension into the batch


def logical_batch(
    tensors: tuple[Tensor | None, ...], in_dims: tuple[Any, ...], bases: tuple[int, ...]
) -> int | None:
    """The batch size ``B`` of the call seen inside vmap (``None``: no input is batched)."""
    for t, d, base in zip(tensors, in_dims, bases):
        if t is None:
            continue
        if t.ndim - (d is not None) == base + 1:
            return int(t.shape[0] if d is None else t.movedim(d, 0).shape[1])
    return None


def fold(V: int, t: Tensor | None, d: int | None, base: int, B: int | None) -> Tensor | None:
    """Fold the vmapped dimension ``d`` (size ``V``) of ``t`` into its batch dimension:
    ``(V * B, ...)`` (or ``(V, ...)`` when the call is unbatched); a batched input that is not
    vmapped over is repeated ``V`` times; a shared (unbatched, not vmapped) one stays shared."""
    if t is None:
        return None
    if d is None:
        if t.ndim == base + 1:
            return t.unsqueeze(0).expand(V, *t.shape).reshape(V * t.shape[0], *t.shape[1:])
        return t
    t = t.movedim(d, 0)
    if t.ndim == base + 2:
        return t.reshape(V * t.shape[1], *t.shape[2:])
    if B is None:
        return t
    return t.unsqueeze(1).expand(V, B, *t.shape[1:]).reshape(V * B, *t.shape[1:])


def fold_index(V: int, idx: Tensor, d: int | None, B: int | None) -> Tensor:
    out = fold(V, idx, d, 0, B)
    assert out is not None
    return out


def unfold(V: int, t: Tensor, B: int | None) -> Tensor:
    """Inverse of :func:`fold` for an output row block: ``(V * B, ...)`` -> ``(V, B, ...)``."""
    return t if B is None else t.reshape(V, B, *t.shape[1:])


# ---------------------------------------------------------------------------------------------
# the samples idx points to
