"""Warm starts for the lean routes' active-set solvers: working sets from a previous solution's
multipliers (:func:`dxopt.qp.api.solve.warm_duals`), daqp's ``dual_start`` and the compiled
dual active-set solver's warm rows (:mod:`dxopt.qp.solvers.dual_active_set`, *Warm starts*),
and the factors of the last warm-started problem, which the next warm start reuses when its
``P`` and constraint rows are bitwise the same (*Reused factors* there)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit
from torch import Tensor

__all__ = [
    "FACTOR_CACHE_MAX_ENTRIES",
    "NO_FACTORS",
    "Factors",
    "cached_factors",
    "clear_factors",
    "dual_start",
    "keep_factors",
    "warm_rows",
]

FACTOR_CACHE_MAX_ENTRIES = 1 << 21
"""The most float64 entries (16 MB) of the factors :func:`keep_factors` keeps."""


@dataclass(frozen=True)
class Factors:
    """Copies of one problem's ``P`` (n, n) and rows ``C = [G; A]`` (rows, n) in daqp's layout
    (float64) with the compiled solver's factors of them: the Cholesky factor ``L`` of ``P``
    and ``Yt`` :math:`= (L^{-1}C^\\top)^\\top`. A solve reuses them only for a ``P`` and ``C``
    with the same bits (:func:`dxopt.qp.solvers.kernels.batch.same_bits`)."""

    P: np.ndarray
    C: np.ndarray
    L: np.ndarray
    Yt: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.P, self.C, self.L, self.Yt


NO_FACTORS = Factors(*(np.zeros((0, 0)) for _ in range(4)))
"""No factors (arrays without entries): what a cold start passes."""
_kept: list[Factors] = [NO_FACTORS]  # one entry, replaced whole (a reader sees one or the other)


def cached_factors() -> Factors:
    """The factors :func:`keep_factors` kept last (arrays without entries: none)."""
    return _kept[0]


def keep_factors(P: np.ndarray, C: np.ndarray, L: np.ndarray, Yt: np.ndarray) -> None:
    """Keep copies of ``P``, ``C`` and their factors ``L``, ``Yt`` for the next warm start (in
    place of the last ones); nothing above :data:`FACTOR_CACHE_MAX_ENTRIES` entries."""
    if 2 * (P.size + C.size) > FACTOR_CACHE_MAX_ENTRIES:
        return
    _kept[0] = Factors(P.copy(), C.copy(), L.copy(), Yt.copy())


def clear_factors() -> None:
    """Forget the kept factors."""
    _kept[0] = NO_FACTORS


def warm_rows(
    warm_duals: Tensor | None, batch: int, m: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(lam, rows)`` of a previous solve's inequality multipliers ``warm_duals`` ((B, m) or
    (m,)): ``lam`` the multipliers as float64 (a numpy view where they are float64 already;
    :func:`dual_start` makes daqp's start of them) and ``rows`` the compiled solver's warm
    working sets (B, m + 1) int64, each sample's rows of positive multiplier followed by -1
    (one compiled pass, :func:`_positive_rows`). The set is read off the signs, exactly, with
    no threshold: both solvers return zero off their working set, and any set is a valid start
    (a wrong one costs iterations, not the answer). ``None`` without ``warm_duals``, or for
    multipliers of another shape or with NaN (another problem's solution: a cold start)."""
    if warm_duals is None or warm_duals.shape not in ((m,), (batch, m)) or not m:
        return None
    lam = warm_duals.detach().numpy() if warm_duals.dtype is torch.float64 else (
        warm_duals.detach().to(torch.float64).numpy())  # fmt: skip
    rows = _positive_rows(lam.reshape(-1, m), batch)
    return None if rows.shape[0] < batch else (lam, rows)


def dual_start(lam: np.ndarray, i: int, p: int) -> np.ndarray:
    """daqp's ``dual_start`` (m + p,) for sample ``i`` of :func:`warm_rows`' ``lam``: the
    multipliers, clipped at zero, and zero on the ``p`` equality rows (daqp's initial working
    set is the rows of positive multiplier)."""
    row = lam[i] if lam.ndim == 2 else lam
    return np.concatenate((np.maximum(row, 0.0), np.zeros(p)))


@njit(cache=True, nogil=True)
def _positive_rows(lam: np.ndarray, batch: int) -> np.ndarray:
    """Each sample's rows of positive multiplier in ``lam`` ((B, m), or (1, m) for all
    ``batch``), in order and followed by -1, as (batch, m + 1) int64; (0, m + 1) when an entry
    is NaN or infinite."""
    m = lam.shape[1]
    rows = np.full((batch, m + 1), -1, np.int64)
    for i in range(batch):
        row = lam[0 if lam.shape[0] == 1 else i]
        k = 0
        for r in range(m):
            v = row[r]
            if not math.isfinite(v):
                return np.zeros((0, m + 1), np.int64)
            if v > 0.0:
                rows[i, k] = r
                k += 1
    return rows
