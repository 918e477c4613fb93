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
    data. On the CPU daqp, through the lean paths of :mod:`dxopt.qp.lean.small` and
    :mod:`dxopt.qp.lean.small_batch`, is faster than the torch solver forward+backward at every
    size and batch measured (``python -m benchmarks.qp_torch.auto_rule``); a dense CPU batch, or
    one dense problem with n > 64, with the default options is solved under ``"auto"`` by
    dxopt's compiled dual active-set solver (:mod:`dxopt.qp.solvers.dual_active_set`;
    :func:`dxopt.qp.solve` routes it there before this function is asked). Among the qpsolvers
    backends daqp is the fastest on dense problems and piqp on sparse ones. The figures:
    ``benchmarks/qp_speed/results/routing_measurements.md``.
    """
    on_cpu = problem.device.type == "cpu"
    return auto_choice(sparse=problem.any_sparse, on_cpu=on_cpu, P=problem.P, q=problem.q)


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


DENSE_FALLBACK_MAX_N = 1000
"""daqp joins the fallback chain of a sparse problem up to this many variables (it is densified
for it). Its dense working-set solve grows about as n^3.5 on sparse Maros-Meszaros problems
(raw daqp at 1 thread, eps 1e-9, on a loaded machine: n = 1000 0.9 s, 1350 4.9 s, 1880 30 s,
2118 63 s, QPILOTNO n = 2172 72 s and then no solution), and on that set it settled a sample the
interior-point backends left only at n <= 262; past n = 1000 it costs more than all other
attempts together without a prospect of winning."""


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
