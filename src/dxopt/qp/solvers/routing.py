"""Backend routing and options: which backend ``"auto"`` picks, the stopping tolerances and
options handed to each backend, and the arrays each backend is given.

Owns :func:`default_solver` (the CPU/device and dense/sparse/LP routing of ``"auto"``),
:func:`backend_kwargs` (the requested tolerance in each backend's own setting names),
:func:`numpy_views`/:func:`sample_view` (each parameter once as numpy or scipy CSC, shared by
all samples) and :func:`daqp_certifies_psd`. It does not solve anything: the attempts are run
by :class:`dxopt.qp.solvers.chain.FallbackChain`.

The requested tolerance is passed to every backend in its own setting names (daqp included:
``primal_tol``), with the relative part never below ``BACKEND_RELATIVE_FLOOR = 1e-12``: asked
for more than double precision can reach on badly scaled data, a backend stalls until its
iteration limit (piqp on Maros-Meszaros CVXQP1_L, n = 10000: the dual residual stops at 1e-8
on data of size 1e8, and the absolute 1e-9 kept it iterating for 250 iterations of about 4 s;
with the floor it stops after 14). The floor stays below the certificate's own
(``RELATIVE_FLOOR = 1e-10`` in :mod:`dxopt.qp.certify.polish`): at ``eps_rel = 1e-10`` piqp
stops at points whose polish fails on a QP scaled by 1e8, at ``1e-12`` it does not. Sparse
matrices are handed over as scipy CSC; daqp takes dense arrays only (:mod:`dxopt.qp.solvers.daqp`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import qpsolvers
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt.qp.problem.canonical import QPProblem

__all__ = [
    "BACKEND_RELATIVE_FLOOR",
    "DENSE_FALLBACK_MAX_N",
    "LP_PIQP_MIN_N",
    "SPARSE_ONLY",
    "available_backends",
    "backend_kwargs",
    "daqp_certifies_psd",
    "default_solver",
    "numpy_views",
    "routes_lp_to_piqp",
    "sample_view",
]

BACKEND_RELATIVE_FLOOR = 1e-12
"""The least relative stopping tolerance passed to a backend (:mod:`dxopt.qp.solvers.routing`)."""

_TOLERANCE_KEYS: dict[str, Callable[[float, float], dict[str, float]]] = {
    "daqp": lambda a, r: {"primal_tol": a},
    "piqp": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "osqp": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "proxqp": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "scs": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "clarabel": lambda a, r: {
        "tol_gap_abs": a,
        "tol_gap_rel": max(r, BACKEND_RELATIVE_FLOOR),
        "tol_feas": a,
        "tol_ktratio": 1e-8,
    },
    "highs": lambda a, r: {"primal_feasibility_tolerance": a, "dual_feasibility_tolerance": a},
}


def default_solver(problem: QPProblem) -> str:
    """``"torch"`` for dense inputs off the CPU, else ``"daqp"`` for dense problems and
    ``"piqp"`` when any matrix is sparse or the problem is a pure LP with ``n >= 65``
    (:func:`routes_lp_to_piqp`).

    Inputs on a GPU (any non-CPU device) get the batched torch interior point
    (:mod:`dxopt.qp.solvers.torch_ipm`): it runs on the device, with no host round trip of the
    data. On the CPU daqp, through the lean paths of :mod:`dxopt.qp.lean.small` and
    :mod:`dxopt.qp.lean.small_batch`, is faster than the torch solver forward+backward at every
    size and batch measured (``python -m benchmarks.qp_torch.auto_rule``); a dense CPU batch, or
    one dense problem with n > 64, with the default options is solved under ``"auto"`` by
    dxopt's compiled dual active-set solver (:mod:`dxopt.qp.solvers.dual_active_set`;
    :func:`dxopt.qp.solve` routes it there before this function is asked). Among the qpsolvers
    backends daqp is the fastest on dense problems and piqp on sparse ones. The figures:
    ``benchmarks/qp_speed/results/routing_measurements.md``.
    """
    if problem.any_sparse:
        return "piqp"
    if problem.device.type != "cpu":
        return "torch"
    if routes_lp_to_piqp(problem.P, problem.q):  # a larger pure LP (routes_lp_to_piqp)
        return "piqp"
    return "daqp"


LP_PIQP_MIN_N = 65
"""Pure LPs (``P = 0``) with at least this many variables go to piqp under ``"auto"``."""


def routes_lp_to_piqp(P: object, q: object) -> bool:
    """Whether ``"auto"`` sends this problem to piqp as a pure LP: a dense CPU ``P`` of zeros
    (not under a torch.func transform) and ``n >= LP_PIQP_MIN_N``.

    DAQP solves an LP by proximal-point iterations on :math:`\\tfrac{\\epsilon}{2}\\|x -
    x_k\\|^2 + q^\\top x`; their number grows with the size, and from about n = 100 piqp is
    faster (random LPs, PyEPO's shortest path and knapsack; the figures:
    ``benchmarks/qp_speed/results/routing_measurements.md``). So small LPs stay with daqp,
    larger ones go to piqp."""
    from dxopt.qp.problem.functorch import functorch_active

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


SPARSE_ONLY = ("clarabel", "osqp", "scs")
"""Backends that take scipy CSC matrices only (dense data is converted for them)."""
_DENSE_ONLY = ("daqp",)
DENSE_FALLBACK_MAX_N = 3000  # daqp joins the chain of sparse problems up to this size


def numpy_views(problem: QPProblem, solver: str) -> dict[str, Any]:
    """Each parameter once as numpy (dense) or scipy CSC (sparse), shared by all samples."""
    views: dict[str, Any] = {"sparse_only": solver in SPARSE_ONLY}
    if not problem.csr and not views["sparse_only"]:  # all dense, kept dense: numpy views
        for name in ("P", "q", "A", "b", "G", "h"):
            t = getattr(problem, name)
            views[name] = None if t is None else t.numpy()
        return views
    for name in ("P", "q", "A", "b", "G", "h"):
        t = getattr(problem, name)
        if t is None:
            views[name] = None
        elif t.layout == torch.sparse_coo and solver in _DENSE_ONLY:
            views[name] = problem.csr[name][0].toarray()  # daqp takes dense arrays only
        elif t.layout == torch.sparse_coo:
            views[name] = problem.csr[name][0].tocsc()
        elif solver in SPARSE_ONLY and name in ("P", "A", "G") and t.ndim == 2:
            views[name] = sp.csc_matrix(t.numpy())  # what the backend converts to anyway
        else:
            views[name] = t.numpy()
    return views


def sample_view(views: dict[str, Any], name: str, i: int) -> Any:
    v = views[name]
    if views["sparse_only"] and v is not None and not sp.issparse(v) and v.ndim == 3:
        return sp.csc_matrix(v[i])  # batched dense matrix for a CSC-only backend
    base = 2 if name in ("P", "A", "G") else 1
    if v is None or sp.issparse(v) or v.ndim == base:
        return v
    return v[i]


def backend_kwargs(
    solver: str, eps_abs: float, eps_rel: float, options: dict[str, Any] | None
) -> dict[str, Any]:
    """The keyword arguments for ``solver`` through qpsolvers: its stopping tolerances from
    ``eps_abs``/``eps_rel`` (relative ones at least :data:`BACKEND_RELATIVE_FLOOR`), then the
    user's ``options``."""
    kw: dict[str, Any] = dict(_TOLERANCE_KEYS.get(solver, lambda a, r: {})(eps_abs, eps_rel))
    kw.update(options or {})
    return kw


def daqp_certifies_psd(
    problem: QPProblem, solver: str, solver_options: dict[str, Any] | None
) -> bool:
    """Whether daqp's own Cholesky can stand in for the PSD check of ``P``: daqp is the
    requested backend, ``P`` is dense, and the user did not set daqp's ``eps_prox``."""
    return (
        solver == "daqp"
        and problem.P.layout == torch.strided
        and "eps_prox" not in (solver_options or {})
    )


def available_backends() -> tuple[str, ...]:
    """The qpsolvers backends installed here."""
    return tuple(qpsolvers.available_solvers)
