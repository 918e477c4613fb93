"""Random inequality QPs with a known solution, shared by the failure table
(:mod:`benchmarks.qp_torch.failures`) and the device-path tests
(``tests/qp/solvers/test_torch_fallback.py``)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["known_solution_batch"]


def known_solution_batch(
    B: int, n: int, m: int, seed: int, *, weak: int = 0, cond: float = 7.0
) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """``B`` well-conditioned random inequality QPs ``(P, q, G, h)`` (float64, ``(B, ...)``,
    cond(P) up to ``cond``) and their known solutions ``x*`` ``(B, n)``: about 30% of the rows
    active with positive multipliers, plus ``weak`` rows per sample active with a zero
    multiplier (zero slack and zero multiplier). Built from the KKT conditions: ``h = G x* + s``
    and ``q = -P x* - G^T nu`` with ``s * nu = 0``, ``s, nu >= 0``."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((B, n, n)))[0]
    ev = np.exp(rng.uniform(0.0, np.log(cond), (B, n)))
    P = (Q * ev[:, None, :]) @ Q.transpose(0, 2, 1)
    P = 0.5 * (P + P.transpose(0, 2, 1))
    G = rng.standard_normal((B, m, n))
    x = rng.standard_normal((B, n))
    active = rng.uniform(size=(B, m)) < 0.3
    s = np.where(active, 0.0, np.abs(rng.standard_normal((B, m))))
    nu = np.where(active, np.abs(rng.standard_normal((B, m))), 0.0)
    if weak:
        rows = np.argsort(rng.uniform(size=(B, m)), -1)[:, :weak]
        np.put_along_axis(s, rows, 0.0, -1)
        np.put_along_axis(nu, rows, 0.0, -1)
    h = np.einsum("bmn,bn->bm", G, x) + s
    q = -np.einsum("bij,bj->bi", P, x) - np.einsum("bmn,bm->bn", G, nu)
    return {k: torch.tensor(v) for k, v in zip(("P", "q", "G", "h"), (P, q, G, h))}, x
