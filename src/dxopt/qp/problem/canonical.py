"""Input validation and the canonical (float64, CPU) form of a batch of QPs.

The problem is :math:`\\min_x \\tfrac12 x^\\top P x + q^\\top x` s.t. :math:`Ax = b`,
:math:`Gx \\le h`. Dense inputs may carry a leading batch dimension; sparse ``P``, ``A``, ``G``
(torch COO or CSR) are shared by the batch. Every check raises a :class:`ValueError` (or a
:class:`TypeError` for a non-tensor) naming the argument, what was expected, what came, and
what to do about it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt._core import DxoptError
from dxopt.linalg.threads import small_work

__all__ = [
    "SYMMETRY_FACTOR",
    "NotPSDError",
    "QPProblem",
    "canonical_problem",
    "check_psd",
    "check_psd_sparse",
    "ldl_inertia",
    "sparse_positive_definite",
    "to_scipy_csr",
]

_NAMES = ("P", "q", "A", "b", "G", "h")
SYMMETRY_FACTOR = 100.0
"""``P`` is symmetric when :math:`|P - P^\\top|` is at most ``SYMMETRY_FACTOR`` times the dtype's
machine epsilon times its scale (every route's check: this layer's and the lean kernels'). It
lives here, below :mod:`dxopt.qp.certify.tolerances`, because validation is the lowest layer."""
_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr)


@dataclass(frozen=True)
class QPProblem:
    """Validated problem: float64 CPU copies (detached) plus what is needed to map back.

    Dense tensors keep their own shape (batched or not); sparse matrices are coalesced COO.
    ``batch`` is ``None`` when no input is batched (the call then returns unbatched outputs).
    """

    P: Tensor
    q: Tensor
    A: Tensor | None
    b: Tensor | None
    G: Tensor | None
    h: Tensor | None
    n: int
    m: int
    p: int
    batch: int | None
    dtype: torch.dtype
    device: torch.device
    layouts: tuple[torch.layout | None, ...]
    csr: dict[str, tuple[sp.csr_matrix, sp.csr_matrix]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # quantities derived from the data alone, computed once and shared by the forward and the
    # backward (:meth:`derived`); not an init field, so ``dataclasses.replace`` (a problem
    # restricted to some samples) starts with an empty cache
    _derived: dict[str, tuple[Tensor, np.ndarray]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def derived(self, key: str, name: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The quantity ``key`` derived from parameter ``name`` alone (e.g. the row
        max-norms of ``G``), computed by ``compute`` on first use and kept with the tensor it
        was computed from (a different tensor under the same name recomputes it)."""
        hit = self._derived.get(key)
        t = getattr(self, name)
        if hit is not None and hit[0] is t:
            return hit[1]
        value = compute()
        self._derived[key] = (t, value)
        return value

    def mv(self, name: str, v: Tensor) -> Tensor:
        """``M @ v`` per sample for parameter ``name`` (``v`` is (S, n); returns (S, k))."""
        M = getattr(self, name)
        if M.layout == torch.sparse_coo:
            out = self.csr[name][0] @ v.numpy().T
            return torch.from_numpy(np.ascontiguousarray(out.T))
        if M.ndim == 2:
            return v @ M.T
        return torch.bmm(M, v.unsqueeze(-1)).squeeze(-1)

    def rmv(self, name: str, w: Tensor) -> Tensor:
        """``M^T @ w`` per sample for parameter ``name`` (``w`` is (S, k); returns (S, n))."""
        M = getattr(self, name)
        if M.layout == torch.sparse_coo:
            out = self.csr[name][1] @ w.numpy().T
            return torch.from_numpy(np.ascontiguousarray(out.T))
        if M.ndim == 2:
            return w @ M
        return torch.bmm(w.unsqueeze(-2), M).squeeze(-2)

    def array(self, name: str) -> np.ndarray:
        """Dense parameter ``name`` as a numpy array sharing memory (no copy, no batch
        expansion); sparse ones are not supported here (use :attr:`csr`)."""
        return getattr(self, name).numpy()

    def np_mv(self, name: str, v: np.ndarray) -> np.ndarray:
        """:meth:`mv` in numpy: ``M @ v`` per sample, ``v`` (S, n) -> (S, k)."""
        M = getattr(self, name)
        if M.layout == torch.sparse_coo:
            return np.ascontiguousarray((self.csr[name][0] @ v.T).T)
        Mn = M.numpy()
        if Mn.ndim == 2:
            return v @ Mn.T
        return np.matmul(Mn, v[:, :, None])[:, :, 0]

    def np_rmv(self, name: str, w: np.ndarray) -> np.ndarray:
        """:meth:`rmv` in numpy: ``M^T @ w`` per sample, ``w`` (S, k) -> (S, n)."""
        M = getattr(self, name)
        if M.layout == torch.sparse_coo:
            return np.ascontiguousarray((self.csr[name][1] @ w.T).T)
        Mn = M.numpy()
        if Mn.ndim == 2:
            return w @ Mn
        return np.matmul(w[:, None, :], Mn)[:, 0, :]

    def np_vec(self, name: str) -> np.ndarray:
        """``q``, ``b`` or ``h`` as a numpy view, ``(size, k)``, or ``(1, k)`` if shared (it
        broadcasts against the ``(size, k)`` products)."""
        v = getattr(self, name).numpy()
        return v if v.ndim == 2 else v[None]

    @property
    def size(self) -> int:
        """Number of samples actually solved (1 for an unbatched call)."""
        return 1 if self.batch is None else self.batch

    def is_sparse(self, name: str) -> bool:
        return getattr(self, name) is not None and getattr(self, name).layout == torch.sparse_coo

    @cached_property
    def any_sparse(self) -> bool:
        return any(self.is_sparse(k) for k in ("P", "A", "G"))

    def dense_vec(self, name: str) -> Tensor:
        """``q``, ``b`` or ``h`` as an ``(size, k)`` tensor (expanded if shared)."""
        t = getattr(self, name)
        return t if t.ndim == 2 else t.unsqueeze(0).expand(self.size, -1)

    def dense(self, name: str) -> Tensor | None:
        """The parameter as a dense ``(size, ...)`` tensor (sparse ones densified)."""
        t = getattr(self, name)
        if t is None:
            return None
        if t.layout == torch.sparse_coo:
            t = t.to_dense()
        base = 2 if name in ("P", "A", "G") else 1
        if t.ndim == base:
            t = t.unsqueeze(0).expand(self.size, *t.shape)
        return t


def to_scipy_csr(t: Tensor) -> sp.csr_matrix:
    """A coalesced 2-D torch COO tensor as a scipy CSR matrix (float64)."""
    idx = t.indices().numpy()
    return sp.csr_matrix((t.values().numpy(), (idx[0], idx[1])), shape=tuple(t.shape))


def _fail(name: str, expected: str, got: str, fix: str) -> ValueError:
    return ValueError(f"{name}: expected {expected}, got {got}. {fix}")


def _check_tensor(name: str, t: object) -> Tensor | None:
    if t is None:
        return None
    if not isinstance(t, Tensor):
        raise TypeError(
            f"{name}: expected a torch.Tensor or None, got {type(t).__name__}. "
            f"Wrap it with torch.as_tensor({name}, dtype=torch.float64)."
        )
    if t.device.type == "meta":
        raise _fail(
            name, "a tensor holding data (cpu or cuda)", "device meta", "Materialise it first."
        )
    if t.dtype not in (torch.float32, torch.float64):
        raise _fail(name, "dtype float32 or float64", str(t.dtype), f"Use {name}.double().")
    if t.layout not in (torch.strided, *_SPARSE_LAYOUTS):
        raise _fail(name, "a dense, sparse COO or sparse CSR tensor", str(t.layout), "Convert it.")
    if t.layout in _SPARSE_LAYOUTS and name not in ("P", "A", "G"):
        raise _fail(name, "a dense tensor", str(t.layout), f"Use {name}.to_dense().")
    return t


def _finite(name: str, t: Tensor) -> None:
    if t.layout == torch.sparse_coo:
        values = t.detach().coalesce().values()
    else:
        values = t.detach().values() if t.layout == torch.sparse_csr else t.detach()
    # one reduction: any NaN/Inf makes the sum non-finite; only then look closer (overflow)
    suspicious = values.numel() > 0 and not math.isfinite(float(values.sum()))
    if suspicious and not bool(torch.isfinite(values).all()):
        if bool(torch.isnan(values).any()):
            raise _fail(
                name,
                "finite entries",
                "NaN",
                f"Check the computation that produced {name} (a NaN is never a valid value).",
            )
        if name == "h":
            fix = (
                "An infinite h_i is not a constraint: drop row i of G and h (box bounds can "
                "be passed as lb/ub, where +-inf means no bound)."
            )
        elif name == "b":
            fix = "An equality with an infinite right-hand side is infeasible: fix b."
        else:
            fix = f"Replace the infinite entries of {name} (or rescale the problem)."
        raise _fail(name, "finite entries", "Inf", fix)


def _canonical_sparse(t: Tensor) -> Tensor:
    if t.ndim != 2:
        raise ValueError("sparse matrices must be 2-D (shared by the batch)")
    return t.detach().to("cpu", torch.float64).to_sparse_coo().coalesce()


class NotPSDError(DxoptError, ValueError):
    """``P`` is not positive semidefinite (a :class:`ValueError`, and a :class:`DxoptError`;
    raised by :func:`check_psd` also from inside the forward, where backend errors are
    otherwise caught)."""


def _check_symmetric(
    P: Tensor, eps: float, csr: tuple[sp.csr_matrix, sp.csr_matrix] | None = None
) -> None:
    """``P`` symmetric up to :data:`SYMMETRY_FACTOR` ``eps`` relative (sparse: also its diagonal
    sign; ``csr`` is the scipy pair ``(P, P^T)`` of a sparse ``P`` when the caller has it)."""
    if P.layout == torch.sparse_coo:
        mat, mat_t = csr if csr is not None else (to_scipy_csr(P), to_scipy_csr(P).T.tocsr())
        scale = max(1.0, float(np.abs(mat.data).max())) if mat.nnz else 1.0
        diff = mat - mat_t
        worst = float(np.abs(diff.data).max()) if diff.nnz else 0.0
        if worst > SYMMETRY_FACTOR * eps * scale:
            raise _fail(
                "P",
                "a symmetric matrix",
                f"max |P - P^T| = {worst:.3g}",
                "Pass (P + P.T) / 2.",
            )
        diag = mat.diagonal()
        if bool((diag < -SYMMETRY_FACTOR * eps * scale).any()):
            raise NotPSDError(
                "P: expected a positive semidefinite matrix, got a negative diagonal entry. "
                "Check the sign of the quadratic term."
            )
        return
    Pn = P.cpu().numpy()
    # exact symmetry first (the common case); numpy beats torch.equal for small or batched P
    # (128 x 50 x 50: 139 vs 182 us), not at n = 1000
    if (Pn.ndim == 2 and Pn.shape[0] <= 64) or Pn.ndim == 3:
        if (Pn == (Pn.T if Pn.ndim == 2 else Pn.swapaxes(-1, -2))).all():
            return
    elif torch.equal(P, P.transpose(-1, -2)):
        return
    # numpy's strided transpose is much faster than torch's here
    asym = np.abs(Pn - np.swapaxes(Pn, -1, -2)).max(axis=(-2, -1))
    scale = np.maximum(np.abs(Pn).max(axis=(-2, -1)), 1.0)
    if bool((asym > SYMMETRY_FACTOR * eps * scale).any()):
        raise _fail(
            "P",
            "a symmetric matrix",
            f"max |P - P^T| = {float(asym.max()):.3g}",
            "Pass (P + P.mT) / 2.",
        )


def psd_shift(n: int, eps: float, scale: float) -> float:
    """The shift :math:`\\delta` under which ``P`` counts as positive semidefinite (dense and
    sparse alike): :math:`\\lambda_{\\min}(P) \\ge -\\delta`, :math:`\\delta = \\max(10^{-10},
    10\\,n\\,\\varepsilon)\\cdot\\max(1, \\max|P_{ij}|)`."""
    return max(1e-10, 10 * n * eps) * max(1.0, scale)


def ldl_inertia(P: sp.spmatrix) -> tuple[int, int] | None:
    """``(negative, zero)`` pivot counts of a symmetric LDLᵀ of sparse symmetric ``P``, which
    by Sylvester's law of inertia are the numbers of negative and zero eigenvalues of ``P``;
    ``None`` when the factorization could not be done without pivoting (undecided).

    SuperLU (:func:`scipy.sparse.linalg.splu`) run as a symmetric LDLᵀ: a fill-reducing
    ordering of :math:`P + P^\\top` applied to rows and columns alike (``SymmetricMode``) and
    no numerical pivoting (``diag_pivot_thresh=0``), so :math:`\\Pi^\\top P \\Pi = LU` with
    :math:`U = DL^\\top` and the diagonal of ``U`` is ``D``. SuperLU still swaps rows at an
    exactly zero diagonal pivot; the row and column permutations then differ and the pivots
    are no inertia count (``None``). An LU with its default partial pivoting is no inertia
    count either: the signs of its pivots are not the signs of the eigenvalues."""
    import scipy.sparse.linalg as spla

    M = sp.csc_matrix(P, dtype=np.float64)
    try:
        lu = spla.splu(
            M,
            permc_spec="MMD_AT_PLUS_A",
            diag_pivot_thresh=0.0,
            options={"SymmetricMode": True},
        )
    except RuntimeError:  # an exactly zero column during the elimination
        return None
    if not np.array_equal(lu.perm_r, lu.perm_c):
        return None
    d = lu.U.diagonal()
    return int((d < 0).sum()), int((d == 0).sum())


def sparse_positive_definite(P: sp.spmatrix) -> bool:
    """Whether sparse symmetric ``P`` is positive definite: its LDLᵀ (:func:`ldl_inertia`)
    has only positive pivots (undecided counts as not)."""
    inertia = ldl_inertia(P)
    return inertia is not None and inertia == (0, 0)


SPARSE_PSD_DENSE_MAX_N = 2000
"""Sparse ``P`` whose LDLᵀ needs pivoting is checked by dense eigenvalues up to this size."""


def check_psd_sparse(P: sp.spmatrix, eps: float) -> None:
    """Sparse symmetric ``P`` positive semidefinite, :math:`\\lambda_{\\min}(P) \\ge -\\delta`
    (:func:`psd_shift`), or :class:`NotPSDError`; cheapest test first:

    1. Gershgorin: :math:`P_{ii} - \\sum_{j \ne i}|P_{ij}| \\ge -\\delta` on every row
       (diagonal ``P``, LPs): one pass over the entries;
    2. the inertia of :math:`P + \\delta I` by a sparse LDLᵀ (:func:`ldl_inertia`): no negative
       or zero pivot proves :math:`\\lambda_{\\min}(P) > -\\delta`, ``k`` of them prove ``k``
       eigenvalues at or below :math:`-\\delta` (refused);
    3. only if that LDLᵀ needed pivoting: the dense eigenvalues (``n <= 2000``), else a Lanczos
       estimate of the smallest eigenvalue (ARPACK, ``which="SA"``, at most ``20 n``
       iterations); when it does not converge ``P`` is accepted with a
       :class:`~dxopt.DxoptWarning` (not certified).

    On the Maros-Meszaros set the whole check stays well below a solve (the figures:
    ``benchmarks/qp_speed/results/routing_measurements.md``)."""
    M = sp.csr_matrix(P, dtype=np.float64)
    n = M.shape[0]
    scale = float(np.abs(M.data).max()) if M.nnz else 0.0
    delta = psd_shift(n, eps, scale)
    diag = M.diagonal()
    off = np.asarray(abs(M).sum(axis=1)).reshape(-1) - np.abs(diag)
    if bool((diag - off >= -delta).all()):
        return
    inertia = ldl_inertia(M + delta * sp.identity(n, format="csr"))
    if inertia is not None:
        bad = inertia[0] + inertia[1]
        if bad == 0:
            return
        raise NotPSDError(
            f"P: expected a positive semidefinite matrix (convex QP), got a sparse P with {bad} "
            f"eigenvalue(s) below -{delta:.3g} (the inertia of a sparse LDL^T of P + "
            f"{delta:.3g} I). Use a convex objective, e.g. P = M @ M.T + eps * I."
        )
    if n <= SPARSE_PSD_DENSE_MAX_N:
        lowest = float(np.linalg.eigvalsh(M.toarray()).min())
    else:
        import warnings

        import scipy.sparse.linalg as spla

        try:
            lowest = float(spla.eigsh(M, k=1, which="SA", maxiter=20 * n, tol=1e-8)[0][0])
        except spla.ArpackNoConvergence:
            from dxopt._core import DxoptWarning

            warnings.warn(
                "P: the convexity of this sparse P could not be certified (its LDL^T needed "
                "pivoting and the Lanczos estimate of its smallest eigenvalue did not "
                "converge); it is accepted as positive semidefinite.",
                DxoptWarning,
                stacklevel=4,
            )
            return
    if lowest < -delta:
        raise NotPSDError(
            "P: expected a positive semidefinite matrix (convex QP), got a sparse P with "
            f"smallest eigenvalue {lowest:.3g}. Use a convex objective, e.g. "
            "P = M @ M.T + eps * I."
        )


def _check_psd_dense(P: Tensor, eps: float) -> None:
    """Dense (batched) ``P`` positive semidefinite: one Cholesky, a shifted one for
    semidefinite ``P``, the eigenvalues only to word the error (sparse ``P``:
    :func:`check_psd_sparse`)."""
    if P.layout == torch.sparse_coo:
        check_psd_sparse(to_scipy_csr(P), eps)
        return
    n = P.shape[-1]
    with small_work(P.numel() * n):  # batch * n^3: one thread for small factorizations
        _, info = torch.linalg.cholesky_ex(P)  # positive definite: done
        if bool((info != 0).any()):  # semidefinite P passes with a tiny relative shift
            dense_scale = P.abs().amax(dim=(-2, -1)).clamp_min(1.0)
            eye = torch.eye(n, device=P.device)
            shift = (max(1e-10, 10 * n * eps) * dense_scale)[..., None, None] * eye
            _, info = torch.linalg.cholesky_ex(P + shift.to(P.dtype))
        if bool((info != 0).any()):
            evals = torch.linalg.eigvalsh(P)
            raise NotPSDError(
                "P: expected a positive semidefinite matrix (convex QP), got smallest "
                f"eigenvalue {float(evals.min()):.3g}. Use a convex objective, e.g. "
                "P = M @ M.T + eps * I."
            )


def check_psd(problem: QPProblem, index: int | None = None) -> None:
    """The PSD part of the validation, run late (:func:`canonical_problem` with
    ``defer_psd=True`` checked only the symmetry): ``P`` of sample ``index`` (``None``: the
    whole ``P``) is positive semidefinite, or :class:`NotPSDError` (a ``ValueError``)."""
    P = problem.P
    if P.layout == torch.sparse_coo:
        pair = problem.csr.get("P")
        mat = pair[0] if pair is not None else to_scipy_csr(P)
        check_psd_sparse(mat, float(torch.finfo(problem.dtype).eps))
        return
    if index is not None and P.ndim == 3:
        P = P[index]
    _check_psd_dense(P, float(torch.finfo(problem.dtype).eps))


def canonical_problem(
    P: object,
    q: object,
    A: object = None,
    b: object = None,
    G: object = None,
    h: object = None,
    *,
    check_psd: bool = True,
    defer_psd: bool = False,
    keep_device: bool = False,
) -> QPProblem:
    """Validate the inputs and return the canonical float64 CPU :class:`QPProblem`.

    ``check_psd``: check that ``P`` is symmetric and positive semidefinite (dense: one
    Cholesky). ``defer_psd=True`` checks the symmetry only; the caller then runs
    :func:`check_psd` itself, or lets daqp's own factorization certify ``P``
    (:mod:`dxopt.qp.solvers.daqp`). ``keep_device=True`` (used only by ``solver="torch"``,
    :mod:`dxopt.qp.api.device`): dense tensors are validated the same way but stay on their
    device and dtype (detached)."""
    raw = {k: _check_tensor(k, v) for k, v in zip(_NAMES, (P, q, A, b, G, h))}
    if raw["P"] is None or raw["q"] is None:
        raise TypeError("P and q are required: pass tensors of shape (n, n) and (n,).")
    for mat, vec in (("A", "b"), ("G", "h")):
        if (raw[mat] is None) != (raw[vec] is None):
            raise _fail(
                vec if raw[vec] is None else mat,
                f"{mat} and {vec} together",
                f"only {mat if raw[mat] is not None else vec}",
                f"Pass both {mat} and {vec}.",
            )
    present = {k: v for k, v in raw.items() if v is not None}
    q_t = raw["q"]
    dtype, device = q_t.dtype, q_t.device
    for k, v in present.items():
        if v.dtype != dtype:
            raise _fail(k, f"dtype {dtype} like q", str(v.dtype), f"Use {k}.to(q.dtype).")
        if v.device != device:
            raise _fail(k, f"device {device} like q", str(v.device), f"Use {k}.to(q.device).")
        _finite(k, v)
    if q_t.ndim not in (1, 2):
        raise _fail("q", "shape (n,) or (B, n)", str(tuple(q_t.shape)), "Reshape q.")
    p_t = raw["P"]
    if q_t.ndim == 2 and q_t.shape[-1] == 1 and p_t.shape[-1] != 1 and p_t.ndim >= 2:
        raise _fail(
            "q",
            f"shape ({p_t.shape[-1]},) like P (or (B, {p_t.shape[-1]}) for a batch)",
            f"a column vector {tuple(q_t.shape)}",
            "Pass q.reshape(-1) (q is a vector, not an (n, 1) matrix).",
        )
    for mat in ("P", "A", "G"):
        t = raw[mat]
        if t is not None and t.ndim < 2:
            shape = {"P": "(n, n)", "A": "(p, n)", "G": "(m, n)"}[mat]
            raise _fail(
                mat,
                f"a matrix of shape {shape} or (B, *{shape})",
                f"a {t.ndim}-D tensor of shape {tuple(t.shape)}",
                f"For a single row use {mat}.reshape(1, -1).",
            )
    n = q_t.shape[-1]
    batch_sizes: dict[str, int] = {}
    rows = {"A": 0, "G": 0}
    expect = {"P": 2, "q": 1, "A": 2, "b": 1, "G": 2, "h": 1}
    for k, v in present.items():
        base = expect[k]
        if v.layout in _SPARSE_LAYOUTS and v.ndim != 2:
            raise _fail(
                k,
                "a 2-D sparse matrix shared by the batch",
                f"{v.ndim}-D",
                "Batch only the dense vectors, or pass a dense batched tensor.",
            )
        if v.ndim not in (base, base + 1):
            shape = {
                "P": "(n, n)",
                "q": "(n,)",
                "A": "(p, n)",
                "b": "(p,)",
                "G": "(m, n)",
                "h": "(m,)",
            }[k]
            raise _fail(k, f"shape {shape} or (B, *{shape})", str(tuple(v.shape)), "Reshape it.")
        if v.ndim == base + 1:
            batch_sizes[k] = v.shape[0]
        if k in ("P", "A", "G") and v.shape[-1] != n:
            raise _fail(k, f"{n} columns (n from q)", str(tuple(v.shape)), "Check the sizes.")
        if k == "P" and v.shape[-2] != n:
            raise _fail("P", f"shape ({n}, {n})", str(tuple(v.shape)), "P must be square.")
        if k in rows:
            rows[k] = v.shape[-2]
    for mat, vec in (("A", "b"), ("G", "h")):
        vec_t = raw[vec]
        if vec_t is not None and vec_t.shape[-1] != rows[mat]:
            raise _fail(
                vec,
                f"{rows[mat]} entries (rows of {mat})",
                str(tuple(vec_t.shape)),
                "Check the sizes.",
            )
    if len(set(batch_sizes.values())) > 1:
        raise _fail(
            ", ".join(batch_sizes),
            "one common batch size",
            str(batch_sizes),
            "Give every batched input the same leading dimension (or none, to broadcast).",
        )
    batch = next(iter(batch_sizes.values())) if batch_sizes else None
    canon: dict[str, Tensor | None] = {}
    for k in _NAMES:
        v_raw = raw[k]
        if v_raw is None:
            canon[k] = None
            continue
        v = v_raw
        if v.layout in _SPARSE_LAYOUTS:
            canon[k] = _canonical_sparse(v)
        else:
            canon[k] = v.detach() if keep_device else v.detach().to("cpu", torch.float64)
    eps = float(torch.finfo(dtype).eps)
    csr: dict[str, tuple[sp.csr_matrix, sp.csr_matrix]] = {}
    for k, t in canon.items():
        if t is not None and t.layout == torch.sparse_coo:
            mat = to_scipy_csr(t)
            csr[k] = (mat, mat.T.tocsr())
    if check_psd:
        _check_symmetric(canon["P"], eps, csr.get("P"))  # type: ignore[arg-type]
        if not defer_psd:
            _check_psd_dense(canon["P"], eps)  # type: ignore[arg-type]
    return QPProblem(
        P=canon["P"],  # type: ignore[arg-type]
        q=canon["q"],  # type: ignore[arg-type]
        A=canon["A"],
        b=canon["b"],
        G=canon["G"],
        h=canon["h"],
        n=n,
        m=rows["G"],
        p=rows["A"],
        batch=batch,
        dtype=dtype,
        device=device,
        csr=csr,
        layouts=tuple(None if raw[k] is None else raw[k].layout for k in _NAMES),  # type: ignore[union-attr]
    )


def numpy_sample(t: Tensor | None, i: int, base_ndim: int) -> np.ndarray | None:
    """Sample ``i`` of a dense canonical tensor as a numpy array (shared if unbatched)."""
    if t is None:
        return None
    return (t[i] if t.ndim > base_ndim else t).numpy()
