"""Certification and polishing of a forward solution (one sample, numpy / scipy).

**Certification** uses componentwise scales, never row norms (a zero or tiny row cannot
poison it). With :math:`r = \\max(\\varepsilon_{rel}, 10^{-10})` (the relative part never
goes below a round-off floor) and the scales

.. math::
    \\sigma^p_i = |h_i| + (|G||x|)_i,\\qquad \\sigma^e_j = |b_j| + (|A||x|)_j,\\qquad
    \\sigma^d = |P||x| + |q| + |A^\\top||\\mu| + |G^\\top||\\nu|,

a point :math:`(x, \\mu, \\nu)` is certified when every ratio below is at most 1:
primal :math:`(g_i^\\top x - h_i)_+/(\\varepsilon_{abs} + r\\sigma^p_i)` and
:math:`|a_j^\\top x - b_j|/(\\varepsilon_{abs} + r\\sigma^e_j)`; dual
:math:`|Px + q + A^\\top\\mu + G^\\top\\nu|_k/(\\varepsilon_{abs} + r\\sigma^d_k)`; sign
:math:`(-\\nu_i)_+\\|g_i\\|_\\infty/(\\varepsilon_{abs} + r\\|\\sigma^d\\|_\\infty)`;
complementarity as a natural residual,
:math:`\\min\\big((h_i - g_i^\\top x)_+/(\\varepsilon_{abs} + r\\sigma^p_i),\\
(\\nu_i)_+\\|g_i\\|_\\infty/(\\varepsilon_{abs} + r\\|\\sigma^d\\|_\\infty)\\big)`
(every row has its
slack or its multiplier within tolerance; an interior-point point with slack and multiplier
both of order :math:`\\sqrt\\mu` does not pass until polished).

**Zero rows** are handled explicitly: an all-zero row of ``G`` is never active (multiplier 0);
it is feasible iff :math:`h_i \\ge -\\varepsilon_{abs}`, otherwise the sample is infeasible. An
all-zero row of ``A`` needs :math:`|b_j| \\le \\varepsilon_{abs}` and gets multiplier 0.

**Polishing** (the idea of OSQP's polish, Stellato et al., arXiv 1711.08013, section 5.2):

1. Guess the active set :math:`J` from the solver's point: a nonzero row is active when its
   relative multiplier exceeds its relative slack,
   :math:`\\nu_i\\|g_i\\|_\\infty/\\|\\sigma^d\\|_\\infty > (h_i - g_i^\\top x)_+/\\hat\\sigma_i`
   with :math:`\\hat\\sigma_i = \\sigma^p_i + \\|g_i\\|_\\infty(1 + \\|x\\|_\\infty)`
   (:func:`identification_scale`).
2. Solve the equality-constrained QP on :math:`J` (rows :math:`C = [A; G_J]`) by the
   regularised saddle-point solve of :func:`dxopt.linalg.sparse.saddle_solve`, refined from the
   solver's own point, so on a problem with a non-unique solution it lands on the solution
   nearest to the solver's.
3. Drop rows of :math:`J` with negative multipliers and add rows that are violated; repeat (at
   most ``max_rounds`` times) until the multipliers have the right signs and the point is
   feasible.

The polished point is kept only if it certifies; otherwise the solver's point is certified as it
is. The returned active set is the polished :math:`J` (or, unpolished, the guess).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dxopt.linalg.sparse import FactorizationError, saddle_solve

__all__ = ["Certificate", "PolishResult", "certify", "identification_scale", "polish"]

RELATIVE_FLOOR = 1e-10


@dataclass(frozen=True)
class Certificate:
    """Largest tolerance ratios (pass: all at most 1) and whether the point passed."""

    primal: float
    dual: float
    sign: float
    complementarity: float
    zero_row_infeasible: bool

    @property
    def ok(self) -> bool:
        worst = max(self.primal, self.dual, self.sign, self.complementarity)
        return bool(np.isfinite(worst) and worst <= 1.0) and not self.zero_row_infeasible


@dataclass(frozen=True)
class PolishResult:
    x: np.ndarray
    mu: np.ndarray
    nu: np.ndarray
    active: np.ndarray
    polished: bool
    certificate: Certificate


def _abs(M: Any) -> Any:
    return abs(M) if sp.issparse(M) else np.abs(M)


def _row_inf(M: Any) -> np.ndarray:
    if M is None or M.shape[0] == 0:
        return np.zeros(0 if M is None else M.shape[0])
    if sp.issparse(M):
        return np.asarray(abs(M).max(axis=1).todense()).ravel()
    return np.abs(M).max(axis=1)


@dataclass
class _Data:
    P: Any
    q: np.ndarray
    A: Any
    b: np.ndarray | None
    G: Any
    h: np.ndarray | None
    g_inf: np.ndarray
    a_inf: np.ndarray
    eps_abs: float
    rel: float


def _make(P, q, A, b, G, h, eps_abs: float, eps_rel: float) -> _Data:  # type: ignore[no-untyped-def]
    return _Data(P, q, A, b, G, h, _row_inf(G), _row_inf(A), eps_abs, max(eps_rel, RELATIVE_FLOOR))


def certify(d: _Data, x: np.ndarray, mu: np.ndarray, nu: np.ndarray) -> Certificate:
    """Componentwise certificate of ``(x, mu, nu)`` (module docstring)."""
    ax = np.abs(x)
    dual = d.P @ x + d.q
    sigma_d = _abs(d.P) @ ax + np.abs(d.q)
    primal = comp = sign = 0.0
    zero_bad = False
    if d.A is not None and d.A.shape[0]:
        res = d.A @ x - d.b
        sig = np.abs(d.b) + _abs(d.A) @ ax
        primal = max(primal, float(np.max(np.abs(res) / (d.eps_abs + d.rel * sig))))
        dual = dual + d.A.T @ mu
        sigma_d = sigma_d + _abs(d.A).T @ np.abs(mu)
        zero = d.a_inf == 0
        zero_bad = bool(np.any(np.abs(d.b[zero]) > d.eps_abs))  # type: ignore[index]
    if d.G is not None and d.G.shape[0]:
        s = d.h - d.G @ x
        sig = np.abs(d.h) + _abs(d.G) @ ax
        tol_p = d.eps_abs + d.rel * sig
        primal = max(primal, float(np.max(np.maximum(-s, 0.0) / tol_p)))
        dual = dual + d.G.T @ nu
        sigma_d = sigma_d + _abs(d.G).T @ np.abs(nu)
        zero = d.g_inf == 0
        zero_bad = zero_bad or bool(np.any(d.h[zero] < -d.eps_abs))  # type: ignore[index]
    dual_ratio = float(np.max(np.abs(dual) / (d.eps_abs + d.rel * sigma_d), initial=0.0))
    if d.G is not None and d.G.shape[0]:
        tol_d = d.eps_abs + d.rel * float(np.max(sigma_d, initial=0.0))
        sign = float(np.max(np.maximum(-nu, 0.0) * d.g_inf / tol_d))
        # natural residual: each row has its slack or its multiplier within tolerance
        both = np.minimum(np.maximum(s, 0.0) / tol_p, np.maximum(nu, 0.0) * d.g_inf / tol_d)
        comp = float(np.max(both))
    return Certificate(primal, dual_ratio, sign, comp, zero_bad)


def identification_scale(h: np.ndarray, G: Any, x: np.ndarray, g_inf: np.ndarray) -> np.ndarray:
    """Scale of the slack used to identify active rows:
    :math:`|h_i| + (|G||x|)_i + \\|g_i\\|_\\infty(1 + \\|x\\|_\\infty)` (never zero on a
    nonzero row, even where the entries of ``x`` that the row sees are zero)."""
    return np.abs(h) + _abs(G) @ np.abs(x) + g_inf * (1.0 + float(np.max(np.abs(x), initial=0.0)))


def _guess(d: _Data, x: np.ndarray, nu: np.ndarray) -> np.ndarray:
    if d.G is None or d.G.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    s = np.maximum(d.h - d.G @ x, 0.0)
    sig = identification_scale(d.h, d.G, x, d.g_inf)
    rel_s = s / np.maximum(sig, 1e-300)
    dual_scale = float(np.max(_abs(d.P) @ np.abs(x) + np.abs(d.q), initial=0.0))
    dual_scale = max(dual_scale, float(np.max(np.maximum(nu, 0.0) * d.g_inf, initial=0.0)))
    rel_nu = np.maximum(nu, 0.0) * d.g_inf / max(dual_scale, 1e-300)
    return (rel_nu > rel_s) & (d.g_inf > 0)


def _stack(d: _Data, J: np.ndarray) -> Any:
    blocks = []
    if d.A is not None and d.A.shape[0]:
        blocks.append(d.A)
    if d.G is not None and J.any():
        blocks.append(d.G[np.flatnonzero(J)])
    n = d.q.shape[0]
    sparse = any(sp.issparse(M) for M in (d.P, d.A, d.G) if M is not None)
    if not blocks:
        return sp.csr_matrix((0, n)) if sparse else np.zeros((0, n))
    if sparse:
        return sp.vstack([sp.csr_matrix(B) for B in blocks], format="csr")
    return np.concatenate(blocks, 0)


def _solve_on(
    d: _Data, J: np.ndarray, x0: np.ndarray, mu0: np.ndarray, nu0: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    C = _stack(d, J)
    n, p = d.q.shape[0], 0 if d.A is None else d.A.shape[0]
    rhs = [-d.q]
    if p:
        rhs.append(d.b)  # type: ignore[arg-type]
    if J.any():
        rhs.append(d.h[J])  # type: ignore[index]
    z0 = np.concatenate([x0, mu0, nu0[J]])
    try:
        z, info = saddle_solve(d.P, C, np.concatenate(rhs), z0=z0, tol=1e-14)
    except FactorizationError:
        return None
    if not info.residual <= 1e-9:
        return None
    nu = np.zeros_like(nu0)
    nu[J] = z[n + p :]
    return z[:n], z[n : n + p], nu


def polish(
    P: Any,
    q: np.ndarray,
    A: Any,
    b: np.ndarray | None,
    G: Any,
    h: np.ndarray | None,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    *,
    eps_abs: float,
    eps_rel: float,
    enabled: bool = True,
    force: bool = True,
    max_rounds: int = 8,
) -> PolishResult:
    """Certify, and (``enabled``) polish, one sample's solution (module docstring).

    ``force=False`` polishes only a point that does not certify as it is (used for backends
    that return an exact working set).
    """
    d = _make(P, q, A, b, G, h, eps_abs, eps_rel)
    m = 0 if G is None else G.shape[0]
    nu = np.maximum(nu, 0.0) if m else np.zeros(0)
    if m:
        nu = np.where(d.g_inf > 0, nu, 0.0)  # zero rows are never active
    J = _guess(d, x, nu)
    raw = certify(d, x, mu, nu)
    if raw.zero_row_infeasible:
        return PolishResult(x, mu, nu, J, False, raw)
    if enabled and (force or not raw.ok):
        seen: set[bytes] = set()
        for _ in range(max_rounds):
            key = J.tobytes()
            if key in seen:
                break
            seen.add(key)
            out = _solve_on(d, J, x, mu, nu)
            if out is None:
                break
            xp, mup, nup = out
            if not m:
                cert = certify(d, xp, mup, nup)
                if cert.ok:
                    return PolishResult(xp, mup, np.maximum(nup, 0.0), J, True, cert)
                break
            s = h - G @ xp  # type: ignore[operator]
            tol_p = eps_abs + d.rel * (np.abs(h) + _abs(G) @ np.abs(xp))
            violated = (s < -tol_p) & ~J & (d.g_inf > 0)
            negative = J & (nup < 0)
            if not violated.any() and not negative.any():
                cert = certify(d, xp, mup, nup)
                if cert.ok:
                    return PolishResult(xp, mup, np.maximum(nup, 0.0), J, True, cert)
                break
            # drop wrong-signed multipliers, add violated rows
            J = (J & ~negative) | violated
    return PolishResult(x, mu, nu, J, False, raw)
