"""Input checks shared by the oracles and layers of :mod:`dxopt.dfl`, written once: cost
vectors ``(d,)`` / ``(B, d)``, and the LP data (``A, b, G, h, lb, ub``) of
:class:`~dxopt.dfl.LPOracle`, :class:`~dxopt.dfl.QPTL` and :class:`~dxopt.dfl.LogBarrierLP`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt._core import Status, check_tensor


def check_cost_vectors(name: str, c: Any, dim: int) -> Tensor:
    """Require a float32/float64 ``(dim,)`` or ``(B, dim)`` tensor of finite costs; returns
    it. Half precision is refused: float16 keeps 11 significant bits and bfloat16 8, so
    distinct costs round to ties (every integer above 2048 is not representable in float16)
    and the argmin, the losses and the regrets computed from them change."""
    check_tensor(name, c, floating=True)
    if c.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"{name}: expected float32 or float64 costs, got {c.dtype}: half precision rounds "
            "distinct costs to ties and changes the decisions; cast with .float() (under "
            "torch.autocast, compute the loss outside the autocast region)."
        )
    if c.ndim not in (1, 2) or c.shape[-1] != dim:
        raise ValueError(
            f"{name}: expected shape ({dim},) or (B, {dim}) (the problem's dimension is {dim}), "
            f"got {tuple(c.shape)}."
        )
    check_tensor(name, c, finite=True, hint="predictions must be finite")
    return c


def lp_dimension(owner: str, *, A: Any, b: Any, G: Any, h: Any, lb: Any, ub: Any) -> int:
    """The LP's number of variables, from ``A``, ``G`` or a vector ``lb`` / ``ub`` (a number
    bounds every entry); checks that matrices come with their right-hand sides."""
    if (A is None) != (b is None) or (G is None) != (h is None):
        raise ValueError(
            f"{owner}: A, b / G, h: give both the matrix and its right-hand side, or neither."
        )
    dims = [np.shape(M)[-1] for M in (A, G) if M is not None]
    dims += [np.shape(v)[-1] for v in (lb, ub) if v is not None and np.ndim(v) > 0]
    if not dims:
        raise ValueError(
            f"{owner}: give the LP's constraints (A, b / G, h, or an lb / ub vector) to fix the "
            "dimension (numbers are bounds of every entry)."
        )
    return int(dims[0])


def as_array(name: str, value: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``value`` (tensor, array, list or number) as a float64 array of ``shape`` (a number is
    broadcast to a 1-D ``shape``); no NaN."""
    arr = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value, dtype=float)
    if shape is not None and arr.ndim == 0 and len(shape) == 1:
        arr = np.full(shape, float(arr))
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {arr.shape}.")
    if np.isnan(arr).any():
        raise ValueError(f"{name}: expected numbers, got NaN entries; fix the LP's data.")
    return arr


def lp_matrix(name: str, value: Any, dim: int) -> np.ndarray:
    """A constraint matrix ``(m, dim)`` as float64, finite."""
    arr = as_array(name, value)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"{name}: expected a 2-D matrix with {dim} columns, got {arr.shape}.")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: expected finite entries; fix the LP's data.")
    return arr


def lp_bounds(lb: Any, ub: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``lb``, ``ub`` as ``(dim,)`` float64 vectors (``None``: unbounded, a number: every entry);
    a ``ValueError`` where ``lb > ub``."""
    lo = np.full(dim, -np.inf) if lb is None else as_array("lb", lb, (dim,))
    hi = np.full(dim, np.inf) if ub is None else as_array("ub", ub, (dim,))
    if (lo > hi).any():
        i = int(np.argmax(lo > hi))
        raise ValueError(f"lb, ub: lb[{i}] = {lo[i]} > ub[{i}] = {hi[i]}; the LP is infeasible.")
    return lo, hi


def uncertified(oracle: Any) -> list[int]:
    """The samples of ``oracle``'s last call whose answer is not a certified optimum (from its
    ``last_status``; ``[]`` for oracles that do not report one)."""
    status = getattr(oracle, "last_status", None) or ()
    if status.count(Status.SOLVED) == len(status):  # the common case, without a Python loop
        return []
    return [i for i, s in enumerate(status) if not getattr(s, "ok", True)]


def check_not_negative(name: str, values: Tensor, scale: Tensor, oracle: Any, hint: str) -> None:
    """Raise a ``ValueError`` where ``values`` (per sample: a regret or an SPO+ loss, which an
    exact oracle makes :math:`\\ge 0`) is negative beyond rounding: below
    ``-tol * scale`` with ``scale`` the sum of the magnitudes of the terms it was computed from
    and ``tol = max(1e-6, 16 d eps)`` (``eps`` of its dtype, ``d`` the dimension; ``1e-6`` covers
    an LP solver's feasibility tolerance). Only call it with certified answers."""
    v = values.detach().reshape(-1)
    s = scale.detach().reshape(-1).to(v.dtype)
    tol = max(1e-6, 16 * getattr(oracle, "dim", 1) * torch.finfo(v.dtype).eps)
    bad = torch.nonzero(v < -tol * s).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"{name}: sample {i} is {float(v[i]):.6g} < 0 ({bad.numel()} of {v.numel()} negative), "
            f"impossible with an exact oracle. The oracle minimises when sense='min' (it is "
            f"{getattr(oracle, 'sense', '?')!r}): if it maximises (values, profits), build it "
            f"with sense='max'; otherwise {hint}."
        )
