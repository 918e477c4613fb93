"""The blocks of the identification's unit Gram matrix gathered from one shared product
(numba), for problems whose ``A`` and ``G`` are shared by the whole batch (QPTL: only ``q`` and
``b`` are per sample).

:func:`~dxopt.qp.backward.degenerate_rule.weak_rows_with_factor` needs, per sample, the Gram
matrix of the unit rows :math:`C = [\\hat A; \\hat G_{\\text{used}}]`, their products with the
unit weak rows :math:`\\hat W` and the weak rows' own Gram matrix. All three are sub-matrices of
the unit Gram matrix :math:`\\hat R\\hat R^\\top` of :math:`R = [A; G]`: one product of the
shared rows (:func:`shared_unit_gram`) and a gather per sample (:func:`gather_gram_blocks`)
replace the three batched products of the stacked rows (the entries agree to round-off; the
order of the sums may differ).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import njit
from torch import Tensor

from dxopt.qp.certify.tolerances import RULE_GRAM_SHIFT

__all__ = ["gather_gram_blocks", "shared_unit_gram"]

_jit: Any = njit(cache=True, nogil=True)


def shared_unit_gram(A: Tensor | None, G: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(gram, norms)``: the unit Gram matrix :math:`\\hat R\\hat R^\\top` (p + m, p + m) of
    the shared rows :math:`R = [A; G]` (2-D, dense; zero rows stay zero) and their norms."""
    R = G if A is None else torch.cat([A, G], 0)
    R = R.to(torch.float64)
    norms = torch.linalg.vector_norm(R, dim=-1)
    Rn = R / norms.clamp_min(torch.finfo(R.dtype).tiny)[:, None]
    return (Rn @ Rn.T).numpy(), norms.numpy()


@_jit
def gather_gram_blocks(
    full: np.ndarray,
    norms: np.ndarray,
    p: int,
    index: np.ndarray,
    valid: np.ndarray,
    widx: np.ndarray,
    wvalid: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(gram, cross, wgram, nonzero)`` per sample, gathered from ``full``
    (:func:`shared_unit_gram` of ``[A; G]`` with ``p`` equality rows): the shifted unit Gram
    matrix (S, p + K, p + K) of the rows ``[A; G[index]]`` (diagonal plus ``1e-14``, plus 1 on
    zero and padding rows, whose other entries are zero), their products (S, p + K, kw) with
    the weak rows ``G[widx]`` (zero on padding), the weak rows' Gram matrix (S, kw, kw) (zero
    on padding) and the nonzero rows (S, p + K). ``index``/``valid`` (S, K) and
    ``widx``/``wvalid`` (S, kw): compressed row indices and their validity."""
    S, K = index.shape
    kw = widx.shape[1]
    k1 = p + K
    gram = np.zeros((S, k1, k1))
    cross = np.zeros((S, k1, kw))
    wgram = np.zeros((S, kw, kw))
    nonzero = np.zeros((S, k1), dtype=np.bool_)
    rows = np.empty(k1, dtype=np.int64)
    on = np.empty(k1, dtype=np.bool_)
    wrows = np.empty(kw, dtype=np.int64)
    for i in range(p):
        rows[i] = i
        on[i] = True
    for s in range(S):
        for j in range(K):
            rows[p + j] = p + index[s, j]
            on[p + j] = valid[s, j]
        for j in range(kw):
            wrows[j] = p + widx[s, j]
        for i in range(k1):
            if on[i]:
                ri = rows[i]
                nonzero[s, i] = norms[ri] > 0
                for j in range(k1):
                    if on[j]:
                        gram[s, i, j] = full[ri, rows[j]]
                for j in range(kw):
                    if wvalid[s, j]:
                        cross[s, i, j] = full[ri, wrows[j]]
            gram[s, i, i] += (0.0 if nonzero[s, i] else 1.0) + RULE_GRAM_SHIFT
        for i in range(kw):
            if wvalid[s, i]:
                for j in range(kw):
                    if wvalid[s, j]:
                        wgram[s, i, j] = full[wrows[i], wrows[j]]
    return gram, cross, wgram, nonzero
