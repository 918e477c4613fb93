"""The sparse route's problem: ``P`` and ``A`` kept as scipy CSC matrices, never densified.

:func:`sparse_route_wanted` decides the route of a call (``options.route``: ``"auto"`` takes
the sparse route when ``P`` (or ``None``) and ``A`` are 2-D sparse COO/CSR tensors shared by
the batch and :math:`n + m \\ge` :data:`SPARSE_MIN`). :func:`sparse_problem` checks the
inputs as :func:`dxopt.conic.problem.conic_problem` does (shapes, dtypes, devices,
finiteness, symmetry and semidefiniteness of ``P``, the cones against the rows) and returns a
:class:`SparseConicProblem`: ``P`` (symmetrised, :math:`\\tfrac12(P + P^\\top)`) and ``A``
as float64 CSC, ``q`` and ``b`` as float64 ``(B, n)``, ``(B, m)`` tensors, and the stored
entries of the inputs (:class:`Pattern`) that the gradients are returned on.

Semidefiniteness of a sparse ``P`` is checked without an eigendecomposition: a symmetric
LU without off-diagonal pivoting (an :math:`LDL^\\top`) of :math:`P + \\delta I`,
:math:`\\delta = n \\cdot 10^{-12} \\Vert P\\Vert_\\infty`, has positive pivots iff
:math:`P + \\delta I \\succ 0`, i.e. :math:`\\lambda_{\\min}(P) > -\\delta` (the dense check's
floor with :math:`\\Vert P\\Vert_\\infty \\ge \\max|\\lambda|` in place of
:math:`\\max|\\lambda|`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.exp import ExpDualCone
from dxopt.conic.problem import check_cones
from dxopt.conic.sparse import check_sparse_matrix
from dxopt.conic.types import ConicOptions, Smoothed

__all__ = [
    "SPARSE_MIN",
    "Pattern",
    "SparseConicProblem",
    "sparse_problem",
    "sparse_route_wanted",
]

SPARSE_MIN = 800
"""``route="auto"`` takes the sparse route for sparse shared ``P``, ``A`` from this
:math:`n + m` on: about twice the size at which the sparse route's forward+backward
overtakes the dense route's on least squares with a box and a norm ball, at batch 1 and 16
(``benchmarks/conic/large.py --crossover``; the margin is for less sparse data)."""

_SPARSE = (torch.sparse_coo, torch.sparse_csr)


@dataclass(frozen=True)
class Pattern:
    """The stored entries of a sparse input: ``rows``, ``cols`` (numpy) and what rebuilds a
    tensor of the input's layout, indices and shape from values on them."""

    rows: np.ndarray
    cols: np.ndarray
    layout: torch.layout
    shape: tuple[int, int]
    indices: tuple[Tensor, ...]
    dtype: torch.dtype
    device: torch.device

    def tensor(self, values: np.ndarray) -> Tensor:
        """The sparse tensor of this pattern holding ``values`` (one per stored entry)."""
        v = torch.from_numpy(values).to(dtype=self.dtype, device=self.device)
        if self.layout == torch.sparse_csr:
            crow, col = self.indices
            return torch.sparse_csr_tensor(crow, col, v, self.shape, check_invariants=False)
        (idx,) = self.indices
        return torch.sparse_coo_tensor(
            idx, v, self.shape, is_coalesced=True, check_invariants=False
        )


@dataclass(frozen=True)
class SparseConicProblem:
    """A checked batch on the sparse route (float64; ``P``, ``A`` CSC and shared)."""

    P: sp.csc_matrix  # (n, n), symmetric
    A: sp.csc_matrix  # (m, n)
    q: Tensor  # (B, n)
    b: Tensor  # (B, m)
    cones: tuple[Cone, ...]
    slices: tuple[slice, ...]
    batched: bool
    dtype: torch.dtype
    device: torch.device
    P_given: bool
    P_pattern: Pattern | None
    A_pattern: Pattern

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def n(self) -> int:
        return self.q.shape[1]

    @property
    def m(self) -> int:
        return self.b.shape[1]


def _is_sparse(M: object) -> bool:
    return isinstance(M, Tensor) and M.layout in _SPARSE


def sparse_route_wanted(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    cones: tuple[Cone, ...],
    options: ConicOptions,
) -> bool:
    """Whether this call takes the sparse route (module doc).

    Raises:
        ValueError: ``route="sparse"`` for a call the sparse route does not take (dense
            ``P``/``A``, dual exponential cones, ``infeasible="relax"``,
            ``backward=Smoothed``), naming what to change.
    """
    if options.route == "dense":
        return False
    reasons = []
    if not _is_sparse(A) or not (P is None or _is_sparse(P)):
        reasons.append("P (or None) and A as 2-D sparse COO/CSR tensors")
    if any(isinstance(c, ExpDualCone) for c in cones):
        reasons.append("no ExpDualCone rows (use ExpCone rows)")
    if options.infeasible != "fail":
        reasons.append("infeasible='fail'")
    if isinstance(options.backward, Smoothed):
        reasons.append("backward='kkt'")
    if options.route == "sparse":
        if reasons:
            raise ValueError(
                "route: 'sparse' needs " + ", ".join(reasons) + "; pass route='dense' or "
                "'auto' for this call"
            )
        return True
    if reasons or not isinstance(q, Tensor) or A.ndim != 2:
        return False
    return int(A.shape[0]) + int(A.shape[1]) >= SPARSE_MIN


def _entries(name: str, M: Tensor) -> tuple[sp.csc_matrix, Pattern]:
    check_sparse_matrix(name, M)
    indices: tuple[Tensor, ...]
    if M.layout == torch.sparse_csr:
        crow, col = M.crow_indices(), M.col_indices()
        rows = np.repeat(np.arange(M.shape[0]), np.diff(crow.cpu().numpy()))
        cols = col.cpu().numpy()
        vals = M.values().detach()
        indices = (crow, col)
    else:
        if not M.is_coalesced():
            M = M.coalesce()
        idx = M._indices()
        rows, cols = idx[0].cpu().numpy(), idx[1].cpu().numpy()
        vals = M._values().detach()
        indices = (idx,)
    v = vals.to(dtype=torch.float64, device="cpu").numpy()
    if not np.isfinite(v).all():
        raise ValueError(f"{name}: expected finite values, got NaN or infinity")
    shape = (int(M.shape[0]), int(M.shape[1]))
    csc = sp.csc_matrix((v, (rows, cols)), shape=shape)
    pattern = Pattern(rows, cols, M.layout, shape, indices, M.dtype, M.device)
    return csc, pattern


def _dense(name: str, t: object, ndims: tuple[int, int], what: str) -> Tensor:
    if not isinstance(t, Tensor) or t.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense torch.Tensor ({what}), got {type(t).__name__}")
    if t.ndim not in ndims:
        raise ValueError(f"{name}: expected {what}, got shape {tuple(t.shape)}")
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name}: expected dtype float32 or float64, got {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: expected finite values, got NaN or infinity")
    return t


def _check_psd(P: sp.csc_matrix) -> None:
    """The :math:`LDL^\\top` test of the module doc (raises ``ValueError``)."""
    n = P.shape[0]
    norm = float(abs(P).sum(axis=1).max()) if P.nnz else 0.0
    if norm == 0.0:
        return
    delta = n * 1e-12 * norm
    shifted = sp.csc_matrix(P + delta * sp.identity(n, format="csc"))
    try:
        lu = spla.splu(
            shifted,
            permc_spec="MMD_AT_PLUS_A",
            diag_pivot_thresh=0.0,
            options={"SymmetricMode": True},
        )
        pivots = lu.U.diagonal()
        ok = bool((lu.perm_r == lu.perm_c).all()) and bool((pivots > 0).all())
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            "P: expected a positive semidefinite matrix, got one with an eigenvalue below "
            f"-{delta:.3g} (a symmetric LU of P + {delta:.3g} I has a non-positive pivot); "
            "the objective must be convex (or pass check_psd=False if P is PSD up to "
            "round-off you trust)"
        )


def sparse_problem(
    P: Tensor | None, q: Tensor, A: Tensor, b: Tensor, cones: object, *, check_psd: bool
) -> SparseConicProblem:
    """Check the inputs of the sparse route and lay them out (module doc).

    Raises:
        TypeError, ValueError: as :func:`dxopt.conic.problem.conic_problem`, each naming the
            argument.
    """
    q = _dense("q", q, (1, 2), "(n,) or (B, n)")
    b = _dense("b", b, (1, 2), "(m,) or (B, m)")
    Acsc, A_pattern = _entries("A", A)
    n, m = q.shape[-1], b.shape[-1]
    if Acsc.shape != (m, n):
        raise ValueError(f"A: expected shape ({m}, {n}) (len(b), len(q)), got {Acsc.shape}")
    dtypes = {"q": q.dtype, "A": A.dtype, "b": b.dtype}
    devices = {"q": q.device, "A": A.device, "b": b.device}
    P_pattern = None
    if P is not None:
        Pcsc, P_pattern = _entries("P", P)
        dtypes["P"], devices["P"] = P.dtype, P.device
        if Pcsc.shape != (n, n):
            raise ValueError(f"P: expected shape ({n}, {n}) (n = len(q)), got {Pcsc.shape}")
        big = float(abs(Pcsc).max()) if Pcsc.nnz else 0.0
        asym = float(abs(Pcsc - Pcsc.T).max()) if Pcsc.nnz else 0.0
        if asym > 64 * np.finfo(np.float64).eps * big:
            raise ValueError(
                f"P: expected a symmetric matrix, got max |P - P'| = {asym:.3g} (largest "
                f"entry {big:.3g}); pass (P + P.mT) / 2"
            )
        Pcsc = sp.csc_matrix(0.5 * (Pcsc + Pcsc.T))
        if check_psd:
            _check_psd(Pcsc)
    else:
        Pcsc = sp.csc_matrix((n, n))
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in dtypes.items())
        raise ValueError(
            f"P, q, A, b: expected one dtype, got mixed dtypes ({listed}); cast them all "
            "with .double() (or .float())"
        )
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in devices.items())
        raise ValueError(f"P, q, A, b: expected one device, got {listed}; move them with .to()")
    batches = {k: t.shape[0] for k, t in (("q", q), ("b", b)) if t.ndim == 2}
    if len(set(batches.values())) > 1:
        raise ValueError(
            f"q, b: the batched inputs disagree on the batch size ({batches}); give every "
            "batched input the same leading dimension B"
        )
    batched = bool(batches)
    B = next(iter(batches.values())) if batched else 1
    if B == 0:
        raise ValueError("q, b: the batch is empty (B = 0)")
    cone_list = check_cones(cones, m)
    f64: dict[str, Any] = {"dtype": torch.float64, "device": "cpu"}
    slices, start = [], 0
    for cone in cone_list:
        slices.append(slice(start, start + cone.dim))
        start += cone.dim
    Acsc.sort_indices()
    Pcsc.sort_indices()
    return SparseConicProblem(
        P=Pcsc,
        A=Acsc,
        q=q.detach().to(**f64).reshape(-1, n).expand(B, n).contiguous(),
        b=b.detach().to(**f64).reshape(-1, m).expand(B, m).contiguous(),
        cones=cone_list,
        slices=tuple(slices),
        batched=batched,
        dtype=q.dtype,
        device=q.device,
        P_given=P is not None,
        P_pattern=P_pattern,
        A_pattern=A_pattern,
    )
