"""Warm working sets for the lean routes' active-set solvers from a previous solution's
multipliers (:func:`dxopt.qp.api.solve.warm_duals`): daqp's ``dual_start`` and the compiled
dual active-set solver's warm rows (:mod:`dxopt.qp.solvers.dual_active_set`, *Warm starts*)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["warm_rows"]


def warm_rows(
    warm_duals: Tensor | None, batch: int, m: int, p: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(dual_start, rows)`` of a previous solve's inequality multipliers ``warm_duals``
    ((B, m) or (m,)): daqp's ``dual_start`` (B, m + p) (the multipliers, zero on the equality
    rows: daqp's initial working set is the rows of positive multiplier) and the compiled
    solver's warm working sets (B, m + 1) int64, each sample's rows of positive multiplier
    followed by -1. The set is read off the signs, exactly, with no threshold: both solvers
    return zero off their working set, and any set is a valid start (a wrong one costs
    iterations, not the answer). ``None`` without ``warm_duals``, or for multipliers of another
    shape or with NaN (another problem's solution: a cold start)."""
    if warm_duals is None or warm_duals.shape not in ((m,), (batch, m)) or not m:
        return None
    lam = warm_duals.detach().to(torch.float64).numpy()
    if not np.isfinite(lam).all():
        return None
    lam = np.broadcast_to(lam, (batch, m))
    dual_start = np.zeros((batch, m + p))
    dual_start[:, :m] = np.maximum(lam, 0.0)
    positive = lam > 0.0
    rows = np.full((batch, m + 1), -1, np.int64)
    sample, row = np.nonzero(positive)  # row-major: each sample's rows in order
    first = np.cumsum(positive.sum(axis=1)) - positive.sum(axis=1)  # its first entry's index
    rows[sample, np.arange(sample.size) - first[sample]] = row
    return dual_start, rows
