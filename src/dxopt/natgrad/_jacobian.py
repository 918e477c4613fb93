"""Residuals and their per-row Jacobians via :mod:`torch.func`.

A *residual function* maps a parameter dictionary (as for
:func:`torch.func.functional_call`) and a batch to a 1-D residual vector :math:`r`, whose
loss is :math:`\\tfrac12\\|r\\|^2`. The optimizers need :math:`r` and
:math:`J = \\partial r / \\partial \\theta \\in \\mathbb{R}^{N \\times P}`:

- a plain callable gets its Jacobian from :func:`torch.func.jacrev` over the parameters
  (vectorised over output rows, ``chunk_size`` rows at a time);
- a :class:`RowwiseResidual` (rows that each depend on one data point, such as PINN residuals)
  gets it from ``vmap(grad_and_value(row))`` over single points, which costs :math:`O(N)`
  instead of :math:`O(N^2)` and is chunked the same way, while its residual alone is one
  batched call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch.func import grad_and_value, jacrev, vmap

__all__ = [
    "ResidualFunction",
    "RowwiseResidual",
    "flatten_rows",
    "residual_and_jacobian",
]

Params = Mapping[str, torch.Tensor]
RowFunction = Callable[[Params, torch.Tensor], torch.Tensor]


class ResidualFunction(Protocol):
    """``residual(params, batch) -> Tensor`` of shape ``(N,)``."""

    def __call__(self, params: Params, batch: Any) -> torch.Tensor: ...


@runtime_checkable
class _HasJacobian(Protocol):
    def residual_and_jacobian(
        self, params: Params, batch: Any, *, chunk_size: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def flatten_rows(per_param: Mapping[str, torch.Tensor], n_rows: int) -> torch.Tensor:
    """Concatenate per-parameter Jacobian blocks ``(N, *shape)`` into one ``(N, P)`` matrix."""
    return torch.cat([block.reshape(n_rows, -1) for block in per_param.values()], dim=1)


class RowwiseResidual:
    """A residual made of blocks of per-point rows, weighted by :math:`1/\\sqrt{N_b}`.

    .. math::

        r = \\big( \\rho_1(\\theta, x^{(1)}_i)/\\sqrt{N_1} \\big)_{i} \\,\\Vert\\, \\cdots
            \\,\\Vert\\, \\big( \\rho_m(\\theta, x^{(m)}_i)/\\sqrt{N_m} \\big)_{i},

    so :math:`\\tfrac12\\|r\\|^2 = \\sum_b \\tfrac{1}{2N_b}\\sum_i \\rho_b(\\theta, x^{(b)}_i)^2`,
    a sum of mean squared residuals (for a PINN: interior and boundary terms).

    Args:
        rows: one function per block, ``row(params, points) -> (n,)`` evaluated on a batch of
            ``n`` points, where entry ``i`` may depend on ``points[i]`` only (it is also called
            with ``n = 1`` under :func:`torch.func.vmap` to get per-row gradients).
        names: optional block names (for messages).

    A batch is a sequence of tensors, one per block, each ``(N_b, d_b)``.

    The per-point contract is checked at every :meth:`residual_and_jacobian`: the rows of one
    full-batch call ``row(params, points)`` must equal the per-point values
    :math:`\\rho_b(\\theta, x_i)` up to round-off, i.e.
    :math:`\\max_i |r^{\\rm full}_i - r^{\\rm point}_i| \\le \\sqrt{\\varepsilon}\\, s` with
    the scale :math:`s = \\max_i (|r^{\\rm full}_i| + |r^{\\rm point}_i| +
    \\|\\nabla_\\theta r^{\\rm point}_i\\|_2 \\|\\theta\\|_2)`, which does not vanish as the
    residual does near a fit. A row function that reads the whole batch (``out -
    out.mean()``, batch normalisation in train mode, a division by ``n``) fails the check with
    a ``ValueError``; it needs a plain residual function (Jacobian by ``jacrev``) instead.
    """

    def __init__(self, rows: Sequence[RowFunction], *, names: Sequence[str] | None = None):
        if not rows or not all(callable(f) for f in rows):
            raise TypeError("rows: expected a non-empty sequence of callables row(params, x).")
        self.rows = tuple(rows)
        self.names = (
            tuple(names) if names is not None else tuple(f"block{i}" for i in range(len(rows)))
        )
        if len(self.names) != len(self.rows):
            raise ValueError(
                f"names: expected {len(self.rows)} names (one per row function), "
                f"got {len(self.names)}."
            )

    def _check_batch(self, batch: Any) -> Sequence[torch.Tensor]:
        if not isinstance(batch, (tuple, list)) or len(batch) != len(self.rows):
            raise ValueError(
                f"batch: expected a tuple of {len(self.rows)} tensors {self.names}, "
                f"got {type(batch).__name__}"
                + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
                + "."
            )
        for name, points in zip(self.names, batch, strict=True):
            if not isinstance(points, torch.Tensor) or points.ndim != 2 or points.shape[0] == 0:
                raise ValueError(
                    f"batch[{name}]: expected a non-empty (N, d) tensor of points, got "
                    f"{tuple(points.shape) if isinstance(points, torch.Tensor) else type(points)}."
                )
        return batch

    def __call__(self, params: Params, batch: Any) -> torch.Tensor:
        parts = []
        for name, row, points in zip(self.names, self.rows, self._check_batch(batch), strict=True):
            values = row(params, points)
            if values.shape != (points.shape[0],):
                raise ValueError(
                    f"rows: block {name!r} returned shape {tuple(values.shape)} for "
                    f"{points.shape[0]} points; expected ({points.shape[0]},)."
                )
            parts.append(values / math.sqrt(points.shape[0]))
        return torch.cat(parts)

    def residual_and_jacobian(
        self, params: Params, batch: Any, *, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual ``(N,)`` and Jacobian ``(N, P)`` (parameters in ``params`` order)."""
        values, jacobians = [], []
        for name, row, points in zip(self.names, self.rows, self._check_batch(batch), strict=True):

            def single(p: Params, x: torch.Tensor, row: RowFunction = row) -> torch.Tensor:
                return row(p, x.unsqueeze(0)).reshape(())

            grads, vals = vmap(grad_and_value(single), in_dims=(None, 0), chunk_size=chunk_size)(
                params, points
            )
            self._check_rowwise(name, row, params, points, vals, grads)
            scale = 1.0 / math.sqrt(points.shape[0])
            values.append(vals * scale)
            jacobians.append(flatten_rows(grads, points.shape[0]) * scale)
        return torch.cat(values), torch.cat(jacobians)

    @staticmethod
    def _check_rowwise(
        name: str,
        row: RowFunction,
        params: Params,
        points: torch.Tensor,
        per_point: torch.Tensor,
        grads: Mapping[str, torch.Tensor],
    ) -> None:
        """Refuse a block whose full-batch rows differ from its per-point rows beyond
        round-off (the test and scale of the class docstring)."""
        with torch.no_grad():
            full = row(params, points).detach()
            if full.shape != per_point.shape:
                raise ValueError(
                    f"rows: block {name!r} returned shape {tuple(full.shape)} for "
                    f"{points.shape[0]} points; expected ({points.shape[0]},)."
                )
            point = per_point.detach()
            theta = math.sqrt(sum(float(p.detach().square().sum()) for p in params.values()))
            jac_norm = flatten_rows(grads, points.shape[0]).detach().norm(dim=1)
            gap = (full - point).abs()
            size = full.abs() + point.abs() + jac_norm * theta
            scale = float(torch.where(torch.isfinite(size), size, 0.0).max())
            # a non-finite row on the whole batch where the point alone is finite also fails
            gap = torch.where(torch.isfinite(full) | ~torch.isfinite(point), gap, math.inf)
            gap = torch.nan_to_num(gap, nan=0.0)  # both non-finite: not a contract question
            worst = int(gap.argmax())
            allowed = math.sqrt(torch.finfo(full.dtype).eps) * scale
        if float(gap[worst]) > allowed:
            raise ValueError(
                f"rows: block {name!r} of the RowwiseResidual is not per-point: on the whole "
                f"batch of {points.shape[0]} points its row {worst} is {float(full[worst]):.6g}, "
                f"evaluated at that point alone {float(point[worst]):.6g} (difference "
                f"{float(gap[worst]):.2e}, round-off allows {allowed:.2e}). "
                "RowwiseResidual differentiates each row on its own point, so row i must "
                "depend on points[i] only (no batch means or normalisation, no division by "
                "the batch size); pass a plain residual(params, batch) function instead, "
                "whose Jacobian comes from jacrev over the whole batch."
            )


def residual_and_jacobian(
    residual: ResidualFunction, params: Params, batch: Any, *, chunk_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual vector and its ``(N, P)`` Jacobian with respect to ``params``.

    Args:
        residual: a residual function; a :class:`RowwiseResidual` (or anything with a
            ``residual_and_jacobian`` method) uses its own per-row rule.
        params: parameter dictionary (detached tensors).
        batch: passed through to ``residual``.
        chunk_size: at most this many rows are differentiated at once (bounds memory).

    Returns:
        ``(r, J)``.

    Raises:
        ValueError: if the residual is not a 1-D vector.
    """
    if isinstance(residual, _HasJacobian):
        return residual.residual_and_jacobian(params, batch, chunk_size=chunk_size)

    def with_aux(p: Params) -> tuple[torch.Tensor, torch.Tensor]:
        r = residual(p, batch)
        if not isinstance(r, torch.Tensor) or r.ndim != 1:
            raise ValueError(
                "residual: expected the residual function to return a 1-D tensor (N,), got "
                f"{tuple(r.shape) if isinstance(r, torch.Tensor) else type(r).__name__}; "
                "flatten it with .reshape(-1)."
            )
        return r, r

    per_param, r = jacrev(with_aux, has_aux=True, chunk_size=chunk_size)(params)
    return r, flatten_rows(per_param, r.shape[0])
