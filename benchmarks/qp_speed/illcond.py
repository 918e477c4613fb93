"""The second problem kind of issue 38's 128 x n=50 target: ill-conditioned ``P`` and dense
positive ``G``, so that the target holds beyond dQP's random problems
(:func:`benchmarks.qp.generators.random_dense`, whose ``h = G1 + 1`` leaves most rows slack).

Per sample (seeded): :math:`P = Q\\,\\mathrm{diag}(10^{-6}, \\dots, 1)\\,Q^\\top + 10^{-8}I`
(``Q`` the orthogonal factor of a Gaussian matrix, eigenvalues log-spaced; condition about
:math:`10^6`), ``q`` Gaussian, ``G`` with entries uniform on ``(0, 1]`` (dense and positive:
every row couples every variable), ``A`` Gaussian with ``b = A x_0`` (``x_0`` Gaussian). With
:math:`x_E` the minimiser under the equalities alone, ``h = G x_E + s`` where ``s`` is
``-0.1 |G x_E|_\\infty`` scaled by a uniform factor on a few rows (``active`` of them,
violated at :math:`x_E`: some become active) and positive, uniform up to the same scale, on
the others."""

from __future__ import annotations

import numpy as np

from benchmarks.qp.generators import QPProblem

__all__ = ["ill_conditioned"]


def ill_conditioned(n: int, *, seed: int, m: int, p: int, active: int = 5) -> QPProblem:
    """One problem of the kind the module docstring describes."""
    rng = np.random.default_rng(10_000 + seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    P = (Q * np.logspace(-6, 0, n)) @ Q.T + 1e-8 * np.eye(n)
    P = 0.5 * (P + P.T)
    q = rng.standard_normal(n)
    G = rng.uniform(size=(m, n)) + 1e-3
    A = rng.standard_normal((p, n))
    b = A @ rng.standard_normal(n)
    K = np.block([[P, A.T], [A, np.zeros((p, p))]])
    x_E = np.linalg.solve(K, np.concatenate([-q, b]))[:n]
    Gx = G @ x_E
    scale = max(float(np.abs(Gx).max()), 1.0)
    s = scale * rng.uniform(0.05, 1.0, size=m)
    rows = rng.choice(m, size=min(active, m), replace=False)
    s[rows] = -0.1 * scale * rng.uniform(0.5, 1.0, size=rows.size)
    return QPProblem("ill-conditioned dense", n, P, q, A, b, G, Gx + s)
