"""Backend routing: which backend ``"auto"`` picks and the arrays each backend is given.

Owns the one rule of ``"auto"`` (:func:`auto_choice`, read by :func:`default_solver` on the
canonical problem and by :func:`dxopt.qp.api.route.plan` on the raw inputs; its answers named
once in :data:`AUTO`), :func:`numpy_views`/:func:`sample_view` (each parameter once as numpy or
scipy CSC, in the format the backend's entry of :mod:`dxopt.qp.solvers.backends` takes, shared
by all samples) and :func:`daqp_certifies_psd`. It does not solve anything: the attempts are
run by :class:`dxopt.qp.solvers.chain.FallbackChain`; what each backend is asked for (its
settings) is :mod:`dxopt.qp.solvers.backends`'s.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import qpsolvers
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.functorch import functorch_active
from dxopt.qp.solvers.backends import backend

__all__ = [
    "AUTO",
    "DENSE_FALLBACK_MAX_N",
    "LP_PIQP_MIN_N",
    "auto_choice",
    "available_backends",
    "daqp_certifies_psd",
    "default_solver",
    "numpy_views",
    "routes_lp_to_piqp",
    "sample_view",
]

AUTO = MappingProxyType({"sparse": "piqp", "device": "torch", "lp": "piqp", "dense": "daqp"})
"""What ``"auto"`` names for each kind of problem (:func:`auto_choice`)."""


def auto_choice(*, sparse: bool, on_cpu: bool, P: object, q: object) -> str:
    """The rule of ``"auto"``: :data:`AUTO`'s ``"sparse"`` backend when ``P``, ``A`` or ``G``
    is sparse, its ``"device"`` solver for dense inputs off the CPU, its ``"lp"`` backend for a
    larger pure LP (:func:`routes_lp_to_piqp`), else its ``"dense"`` backend (the measurements:
    :func:`default_solver`)."""
    if sparse:
        return AUTO["sparse"]
    if not on_cpu:
        return AUTO["device"]
    if routes_lp_to_piqp(P, q):
        return AUTO["lp"]
    return AUTO["dense"]


def default_solver(problem: QPProblem) -> str:
    """``"torch"`` for dense inputs off the CPU, else ``"daqp"`` for dense problems and
    ``"piqp"`` when any matrix is sparse or the problem is a pure LP with ``n >= 65``
    (:func:`routes_lp_to_piqp`).

    Inputs on a GPU (any non-CPU device) get the batched torch interior point
    (:mod:`dxopt.qp.solvers.torch_ipm`): it runs on the device, with no host round trip of the
    data. On the CPU daqp is the fastest in every cell of this measurement (``python -m
    benchmarks.qp_torch.auto_rule``): ``dxopt.qp.solve`` forward+backward, ``solver="daqp"``
    (the lean paths of :mod:`dxopt.qp.lean.small` and :mod:`dxopt.qp.lean.small_batch`) against
    ``solver="torch"`` back to back in one process, 1 torch thread, dQP's random dense QPs
    (m = n, p = n/2), medians of 3-5 on the 2-core machine at a load average of 1
    (``benchmarks/qp_torch/results/auto_rule.json``); torch/daqp time ratio by batch size B:

    ======  =====================================================================
    n       torch / daqp
    ======  =====================================================================
    10      26.1 (B=1), 11.6 (32), 5.73 (128), 3.12 (512), 2.70 (2048)
    20      25.4 (B=1), 4.94 (128), 3.71 (1024)
    50      24.2 (B=1), 4.12 (32), 2.59 (128)
    100     4.30 (B=1), 2.03 (32)
    ======  =====================================================================

    (Before the lean batch path, torch measured 0.44-0.96 of daqp at B >= 512, n = 10, and
    ``"auto"`` picked it there.) A dense CPU batch, or one dense problem with n > 64, with
    the default options is solved under ``"auto"`` by dxopt's compiled dual active-set solver
    (:mod:`dxopt.qp.solvers.dual_active_set`; :func:`dxopt.qp.solve` routes it there before this
    function is asked): fwd+bwd against the raw qpsolvers daqp loop's forward, 128 x n=50
    1.12x (daqp: 1.58x), 1024 x n=20 0.93x (1.20x) (``dxopt bench qp_speed``); one dense
    problem, n = 1000, 0.64x raw daqp (``python -m benchmarks.qp_speed.dense``; its forward
    alone is 0.57x: the same iterations as daqp, LAPACK/BLAS for the factorization and the
    transformed rows).

    Backends on the CPU, measured through :func:`dxopt.qp.solvers.forward.solve_forward`
    (eps_abs = 1e-9, 1 thread, the shared 2-core machine under a load average of 5-9, medians):
    dense dQP problems (m = n, p = n/2) at n = 100 / 500: daqp 3.4 / 219 ms, piqp 5.5 / 429 ms,
    proxqp 9.9 / 308 ms, clarabel 260 ms / 10.9 s; sparse simplex projection at n = 1e4 / 1e5:
    piqp 30 ms / 1.18 s, clarabel 177 ms / 4.86 s, osqp hit its iteration limit (FAILED) at 1e4.
    The same ranking as earlier runs on a quiet machine (daqp 0.80 / 44 ms dense; piqp 16.5 /
    258 ms sparse, the fastest backend at every simplex size up to 1e6).
    """
    on_cpu = problem.device.type == "cpu"
    return auto_choice(sparse=problem.any_sparse, on_cpu=on_cpu, P=problem.P, q=problem.q)


LP_PIQP_MIN_N = 65
"""Pure LPs (``P = 0``) with at least this many variables go to piqp under ``"auto"``."""


def routes_lp_to_piqp(P: object, q: object) -> bool:
    """Whether ``"auto"`` sends this problem to piqp as a pure LP: a dense CPU ``P`` of zeros
    (not under a torch.func transform) and ``n >= LP_PIQP_MIN_N``.

    DAQP solves an LP by proximal-point iterations on :math:`\\tfrac{\\epsilon}{2}\\|x -
    x_k\\|^2 + q^\\top x`; their number grows with the size. Measured through
    :func:`dxopt.qp.solve` (1 torch thread, warm, medians of 4, the shared 2-core machine at a
    load average of 11; ``"auto"`` = daqp against ``solver="piqp"``, ms per LP): random LPs
    with :math:`1.5n` inequality rows and a box, n = 20: 4.1 / 12.9, 60: 10.0 / 18.9,
    100: 52.6 / 28.0, 150: 170 / 62, n = 200: 537 / 129, batch 8 x n = 100: 38.0 / 20.6; the
    5 x 5 grid shortest path (n = 40, PyEPO's DFL task): 1.0 / 5.5 (one LP), 0.37 / 1.8
    (batch of 32); a 32-item 2-row knapsack: 1.3-2.1 / 2.6-8.6. HiGHS through qpsolvers was
    slower than both (11-16 ms on the shortest path). So small LPs stay with daqp, larger ones
    go to piqp."""
    return (
        isinstance(q, Tensor)
        and isinstance(P, Tensor)
        and q.shape[-1] >= LP_PIQP_MIN_N
        and P.layout == torch.strided
        and P.device.type == "cpu"
        and not functorch_active()
        # a nonzero P has a nonzero diagonal entry if it is PSD (O(n)); the full scan only then
        and not bool(P.detach().diagonal(dim1=-2, dim2=-1).any())
        and not bool(P.detach().any())
    )


DENSE_FALLBACK_MAX_N = 3000  # daqp joins the chain of sparse problems up to this size


def numpy_views(problem: QPProblem, solver: str) -> dict[str, Any]:
    """Each parameter once as numpy (dense) or scipy CSC (sparse), shared by all samples, in
    the formats ``solver``'s entry takes (:class:`dxopt.qp.solvers.backends.Backend`)."""
    entry = backend(solver)
    views: dict[str, Any] = {"sparse_only": entry.sparse_only}
    if not problem.csr and not views["sparse_only"]:  # all dense, kept dense: numpy views
        for name in ("P", "q", "A", "b", "G", "h"):
            t = getattr(problem, name)
            views[name] = None if t is None else t.numpy()
        return views
    for name in ("P", "q", "A", "b", "G", "h"):
        t = getattr(problem, name)
        if t is None:
            views[name] = None
        elif t.layout == torch.sparse_coo and entry.dense_only:
            views[name] = problem.csr[name][0].toarray()  # daqp takes dense arrays only
        elif t.layout == torch.sparse_coo:
            views[name] = problem.csr[name][0].tocsc()
        elif name in ("P", "A", "G") and t.ndim == 2:
            views[name] = entry.matrix(t.numpy())  # CSC-only: what it converts to anyway
        else:
            views[name] = t.numpy()
    return views


def sample_view(views: dict[str, Any], name: str, i: int) -> Any:
    v = views[name]
    if views["sparse_only"] and v is not None and not sp.issparse(v) and v.ndim == 3:
        return sp.csc_matrix(v[i])  # batched dense matrix for a CSC-only backend (Backend.matrix)
    base = 2 if name in ("P", "A", "G") else 1
    if v is None or sp.issparse(v) or v.ndim == base:
        return v
    return v[i]


def daqp_certifies_psd(
    problem: QPProblem, solver: str, solver_options: dict[str, Any] | None
) -> bool:
    """Whether daqp's own Cholesky can stand in for the PSD check of ``P``: daqp is the
    requested backend, ``P`` is dense, and the user did not set daqp's ``eps_prox``."""
    return (
        backend(solver).call == "daqp"
        and problem.P.layout == torch.strided
        and "eps_prox" not in (solver_options or {})
    )


def available_backends() -> tuple[str, ...]:
    """The qpsolvers backends installed here."""
    return tuple(qpsolvers.available_solvers)
