"""Multipliers of a backend point that came without them (or with the wrong number):
:func:`recover_duals`, least squares on the active rows,
:math:`[G_J^\\top\\ A^\\top][\\nu_J; \\mu] = -(Px^\\star + q)`."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["finite_or_zero", "recover_duals"]


def recover_duals(
    P: Any, q: np.ndarray, A: Any, G: Any, h: Any, x: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Multipliers ``(mu, nu)`` of a point ``x`` whose backend returned none: least squares on
    the rows active within ``1e3 max(eps, 1e-9)(1 + ||x||_inf)`` and the equalities, the
    inequality multipliers clipped at 0 (the certificate then judges them)."""
    grad = P @ x + q
    rows, slack_scale = [], 1e3 * max(eps, 1e-9) * (1.0 + np.abs(x).max(initial=0.0))
    active = np.zeros(0, dtype=bool)
    if G is not None:
        Gd = G.toarray() if sp.issparse(G) else G
        active = (h - Gd @ x) <= slack_scale
        rows.append(Gd[active])
    if A is not None:
        rows.append(A.toarray() if sp.issparse(A) else A)
    if not rows:
        return np.zeros(0), np.zeros(0)
    C = np.concatenate(rows, axis=0)
    lam = np.linalg.lstsq(C.T, -grad, rcond=None)[0]
    k = int(active.sum())
    nu = np.zeros(0 if G is None else G.shape[0])
    if G is not None:
        nu[active] = np.maximum(lam[:k], 0.0)
    return (lam[k:] if A is not None else np.zeros(0)), nu


def finite_or_zero(v: np.ndarray) -> np.ndarray:
    return v if np.isfinite(v).all() else np.nan_to_num(v)
