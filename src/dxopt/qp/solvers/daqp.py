"""DAQP called through its own Python API (no :mod:`qpsolvers` round trip).

:func:`qpsolvers.solve_problem` builds a ``Problem``, checks it and binds the keyword
arguments of the backend with :func:`inspect.signature` on every call: about 20 us per solve,
as much as DAQP itself needs for a small problem. Here the bounds and the constraint senses
are built once per batch, the constraint matrix :math:`[G; A]` once when ``G`` and ``A`` are
shared (else per sample, :class:`DaqpBatch`), and each sample is one call of
:func:`daqp.solve` on

.. math:: \\min_x \\tfrac12 x^\\top P x + q^\\top x \\quad\\text{s.t.}\\quad
    -\\infty \\le Gx \\le h,\\; Ax = b

(the layout qpsolvers uses: inequality rows first, equality rows with sense 5), so ``x``, the
multipliers and the exit flags are the same as through qpsolvers.

**Exit flags** (DAQP documentation, "Parameters"; :data:`EXIT_STATUS`): ``1`` optimal, ``2``
optimal with soft constraints, ``-1`` infeasible, ``-2`` cycling, ``-3`` unbounded, ``-4``
iteration limit, ``-5`` non-convex (the Cholesky factorization of ``P`` failed), ``-6``
overdetermined initial working set. A point is returned only for a positive flag; DAQP's ``x``
buffer is stale otherwise.

**DAQP's Cholesky as the PSD certificate.** With ``eps_prox=0`` DAQP factors ``P`` before its
first iteration and stops with ``-5`` if the factorization fails, so any flag that is reached
only after iterating (:data:`FACTORED_FLAGS`) certifies that ``P`` is positive definite up to
round-off, the same certificate as the Cholesky of :func:`dxopt.qp.problem.canonical.check_psd`, at
no
extra cost. A sample that stops with ``-5`` is checked by
:func:`~dxopt.qp.problem.canonical.check_psd`
(positive semidefinite passes, indefinite raises ``ValueError``) and solved again with DAQP's
automatic proximal regularisation (``eps_prox=-1e-6``, its default), as before.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dxopt.qp.problem.types import QPStatus

__all__ = ["EXIT_STATUS", "FACTORED_FLAGS", "DaqpBatch", "DaqpPoint", "status_of"]

EXIT_STATUS: dict[int, QPStatus] = {
    1: QPStatus.SOLVED,
    2: QPStatus.SOLVED,
    -1: QPStatus.INFEASIBLE,
    -2: QPStatus.FAILED,
    -3: QPStatus.UNBOUNDED,
    -4: QPStatus.FAILED,
    -5: QPStatus.FAILED,
    -6: QPStatus.FAILED,
}
"""DAQP exit flag -> status of the attempt (the certificate still decides ``SOLVED``)."""

FACTORED_FLAGS = frozenset((1, 2, -1, -2, -3, -4))
"""Exit flags reached only after DAQP factored ``P`` (with ``eps_prox=0``: ``P`` is PD)."""

DEFAULT_EPS_PROX = -1e-6  # DAQP's own default: automatic proximal regularisation


def status_of(flag: int) -> QPStatus:
    """The status an exit flag stands for (unknown flags: ``FAILED``)."""
    return EXIT_STATUS.get(int(flag), QPStatus.FAILED)


class DaqpPoint(NamedTuple):
    """One sample's DAQP output: ``x`` and multipliers ``None`` unless ``flag > 0`` (a named
    tuple: built once per sample, so it is kept cheap)."""

    x: np.ndarray | None
    eq_duals: np.ndarray | None
    ineq_duals: np.ndarray | None
    flag: int


class DaqpBatch:
    """The DAQP arrays of a batch of dense QPs, built once; :meth:`solve` solves sample ``i``.

    ``P, q, A, b, G, h`` are numpy arrays, each either shared (``(n, n)``, ``(n,)``, ...) or
    batched with a leading sample dimension; ``A, b`` and ``G, h`` may be ``None``.

    When ``G`` or ``A`` is batched and both are present, the constraint matrix
    :math:`[G_i; A_i]` is stacked per sample right before its solve (a small, cache-warm
    copy) instead of once for the batch: the batch-wide copy is a multi-megabyte allocation
    whose fresh pages measured about 900 page faults, 1 ms, per call at 128 x (n = 50,
    m = 50, p = 25), more than the per-sample copies.
    """

    def __init__(
        self,
        P: np.ndarray,
        q: np.ndarray,
        A: np.ndarray | None,
        b: np.ndarray | None,
        G: np.ndarray | None,
        h: np.ndarray | None,
    ) -> None:
        n = q.shape[-1]
        m = 0 if G is None else G.shape[-2]
        p = 0 if A is None else A.shape[-2]
        self.n, self.m, self.p = n, m, p
        self.P, self.q = P, q
        mats = [M for M in (G, A) if M is not None and M.shape[-2]]
        # a batched [G; A] is stacked per sample in solve (see the class docstring)
        self._parts: tuple[tuple[np.ndarray, bool], ...] = ()
        if not mats:
            self.C: np.ndarray | None = np.zeros((0, n))
        elif len(mats) == 1:
            self.C = mats[0]
        elif all(M.ndim == 2 for M in mats):
            self.C = np.concatenate(mats, axis=-2)
        else:
            self.C = None
            self._parts = tuple((M, M.ndim == 3) for M in mats)
        vecs = [v for v, k in ((h, m), (b, p)) if v is not None and k]
        if not vecs:
            self.upper: np.ndarray = np.zeros(0)
        elif len(vecs) == 1:
            self.upper = vecs[0]
        else:
            batch = max(v.shape[0] if v.ndim == 2 else 0 for v in vecs)
            if batch:
                vecs = [
                    v if v.ndim == 2 else np.broadcast_to(v, (batch, v.shape[-1])) for v in vecs
                ]
            self.upper = np.concatenate(vecs, axis=-1)
        self.lower = np.full(m + p, -1e30)  # as qpsolvers: a sense-5 row is held at its upper
        self.sense = np.zeros(m + p, dtype=np.intc)
        self.sense[m:] = 5
        # which arrays carry a sample dimension (picked per sample in solve)
        batched_c = self.C is not None and self.C.ndim > 2
        self._batched = (P.ndim > 2, q.ndim > 1, batched_c, self.upper.ndim > 1)

    def solve(
        self, i: int, options: dict[str, Any], primal_start: np.ndarray | None = None
    ) -> DaqpPoint:
        """Solve sample ``i`` with DAQP settings ``options`` (``primal_tol``, ...).

        Raises ``TypeError`` for a setting name DAQP does not know (the caller maps it to a
        ``ValueError`` naming ``solver_options``)."""
        import daqp

        bP, bq, bC, bu = self._batched
        C = self.C
        if C is None:  # batched G and/or A: this sample's [G_i; A_i]
            C = np.concatenate([M[i] if batched else M for M, batched in self._parts])
        elif bC:
            C = C[i]
        x, _, flag, info = daqp.solve(
            self.P[i] if bP else self.P,
            self.q[i] if bq else self.q,
            C,
            self.upper[i] if bu else self.upper,
            self.lower,
            self.sense,
            primal_start=primal_start,
            **options,
        )
        flag = int(flag)
        if flag <= 0:
            return DaqpPoint(None, None, None, flag)
        lam = info["lam"]
        return DaqpPoint(np.asarray(x, dtype=np.float64), lam[self.m :], lam[: self.m], flag)
