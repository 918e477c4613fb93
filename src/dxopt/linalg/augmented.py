"""One large dense saddle-point system through its augmented matrix, in mixed precision.

The system is the reduced KKT system of :mod:`dxopt.linalg.schur`,

.. math:: K\\begin{bmatrix} u \\\\ w \\end{bmatrix} = \\begin{bmatrix} P & C^\\top \\\\ C & 0
    \\end{bmatrix}\\begin{bmatrix} u \\\\ w \\end{bmatrix}
    = \\begin{bmatrix} r_1 \\\\ r_2 \\end{bmatrix},
    \\qquad P\\ (n\\times n)\\ \\text{symmetric},\\ C\\ (k\\times n),

for one system with many rows (:math:`k` comparable to :math:`n`), where the block
elimination of :math:`P` costs :math:`n^3/3 + n^2k + nk^2 + k^3/3` flops.

**Augmented matrix** (the method of multipliers; Hestenes 1969, Powell 1969; as a
preconditioner: Golub & Greif, SIAM J. Sci. Comput. 24, 2003). For weights
:math:`W = \\operatorname{diag}(\\omega_j) \\succ 0`, :math:`M = P + C^\\top WC` and

.. math:: \\delta u = M^{-1}(a + C^\\top Wb),\\qquad \\delta w = W(C\\delta u - b)

solve the regularised system :math:`[[P, C^\\top], [C, -W^{-1}]][\\delta u; \\delta w] = [a; b]`
exactly. Used as the right preconditioner :math:`B` of :math:`K`, the preconditioned matrix
:math:`KB` has the eigenvalue 1 (:math:`n` times) and :math:`\\sigma_i/(1 + \\sigma_i)`,
:math:`\\sigma_i` the eigenvalues of :math:`W^{1/2}CP^{-1}C^\\top W^{1/2}` (a short
computation with :math:`(K_W^{-1})_{22} = -(W^{-1} + CP^{-1}C^\\top)^{-1}`), so a Krylov
method converges in a few steps once :math:`W` is large against :math:`(CP^{-1}C^\\top)^{-1}`.
Everything is read in equilibrated coordinates, :math:`SKS` with
:math:`S = \\operatorname{diag}(S_u, S_w)`, :math:`S_u = \\operatorname{diag}(P_{ii})^{-1/2}`
(1 where :math:`P_{ii}` is not positive) and :math:`S_w` giving the rows of :math:`CS_u` unit
norm: there :math:`W = \\gamma c_P I` (:math:`c_P` the mean :math:`|P_{ii}|` after scaling,
``gamma`` :math:`=\\gamma`), so every row's curvature is commensurate with :math:`P`, and
GMRES, which runs on :math:`SKS`, takes the same steps whatever the scaling of the variables
and of the rows. Forming :math:`M` is one SYRK (:math:`n^2k` flops) and its Cholesky
:math:`n^3/3`.

**Mixed precision.** :math:`M` is formed and factored in float32 (LAPACK ``ssyrk`` and
``spotrf``, about twice the float64 flop rate), and flexible GMRES (Saad, SIAM J. Sci. Comput.
14, 1993; flexible because a float32 solve is not exactly linear) runs in float64 on the exact
:math:`K` (its products read :math:`P`'s lower triangle, half the memory traffic; the true
residuals below read all of it, so a :math:`P` symmetric only up to round-off is solved
and judged as given). It converges to float64 accuracy while the float32 factor is a fair
approximate inverse of :math:`M` (roughly :math:`\\kappa(M)\\,\\varepsilon_{32} < 1`). The true
float64 residual is computed after each GMRES cycle; a cycle that stops short of ``tol`` on it
(the recurrence's estimate drifts from the truth near round-off) is followed by another on the
true residual (iterative refinement), and the final true residual is returned for the caller
to judge; :func:`augmented_solve` returns ``None`` when the float32 factorization fails.

**Linear independence of the rows, certified.** The augmented matrix is positive definite
whether or not the rows of :math:`C` are independent, so it cannot tell.
:func:`certify_independent_rows` certifies :math:`\\lambda_{\\min}(\\hat C\\hat C^\\top) \\ge`
``floor`` for the row-normalised :math:`\\hat C` (every squared pivot of the Gram test of
:func:`dxopt.qp.certify.dependence.count_dependent_dense` is at least :math:`\\lambda_{\\min}`) by a
float64 Cholesky of :math:`\\hat G - \\tau I`, :math:`\\hat G = fl(\\hat C\\hat C^\\top)`, with
:math:`\\tau` = ``floor`` plus rigorous bounds of the rounding errors (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., eqs. (3.4) and Theorem 10.3): the inner products
are off by at most :math:`\\gamma_n\\|\\hat c_i\\|\\|\\hat c_j\\|`, so
:math:`\\|\\hat G - G\\|_2 \\le k\\gamma_n(1 + \\epsilon)`, and a Cholesky factorization that
completes in floating point is the exact one of :math:`\\hat G - \\tau I + \\Delta` with
:math:`\\|\\Delta\\|_2 \\le k\\gamma_{k+1}\\max_i \\hat g_{ii}`. Round-off can therefore not fake
the certificate; where it cannot be given the caller uses the exact test of its general path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.linalg import blas, lapack, solve_triangular

from dxopt.linalg.threads import blas_threads

__all__ = ["AugmentedSolution", "augmented_solve", "certify_independent_rows"]

_U64 = float(np.finfo(np.float64).eps) / 2  # unit round-off of float64
_SUBSET_MIN_ROWS = 256  # from this many rows the certificate tries a column subset first


def _gamma(count: int) -> float:
    """:math:`\\gamma_m = mu/(1 - mu)` (Higham, eq. (3.4)) in float64."""
    return count * _U64 / (1.0 - count * _U64)


def certify_independent_rows(C: np.ndarray, *, floor: float) -> bool:
    """``True`` when :math:`\\lambda_{\\min}(\\hat C\\hat C^\\top) \\ge` ``floor`` is certified for
    the rows of ``C`` (``(k, n)`` float64) scaled to unit norm (module docstring); ``False``
    when it cannot be (dependent or nearly dependent rows, a zero or non-finite row, ``k > n``).

    Costs one ``dsyrk`` and one ``dpotrf`` (:math:`k^2n + k^3/3` flops). With many more columns
    than rows the Gram matrix of the ``k + max(32, k/16)`` columns of largest norm is tried
    first: :math:`\\hat C\\hat C^\\top = \\hat C_S\\hat C_S^\\top + \\hat C_R\\hat C_R^\\top
    \\succeq \\hat C_S\\hat C_S^\\top`, so a certificate for the columns :math:`S` is one for
    all of them (about a fifth of the flops saved at :math:`k = 0.75n`); where it fails the
    whole Gram matrix decides."""
    k, n = C.shape
    if k == 0:
        return True
    if k > n:
        return False
    norms = np.sqrt(np.einsum("ij,ij->i", C, C))
    if not bool(np.all(norms > 0)) or not bool(np.all(np.isfinite(norms))):
        return False
    keep = k + max(32, k // 16)
    if k >= _SUBSET_MIN_ROWS and n >= keep + keep // 8:
        # the columns' norms in the normalised rows (any subset gives a valid certificate;
        # these are only the likeliest to give one); the normalised subset is formed alone
        with np.errstate(all="ignore"):
            inv = 1.0 / norms
            columns = np.nan_to_num(np.einsum("ij,ij,i->j", C, C, inv * inv))
        subset = np.sort(np.argpartition(columns, n - keep)[n - keep :])
        unit = np.take(C, subset, axis=1)
        if _gram_certifies(np.divide(unit, norms[:, None], out=unit), floor, n):
            return True
    return _gram_certifies(C / norms[:, None], floor, n)


def _gram_certifies(unit: np.ndarray, floor: float, n: int) -> bool:
    """The Cholesky test of :func:`certify_independent_rows` on ``unit`` ``(k, width)``: the
    rows of ``C`` ``(k, n)`` divided by their computed norms, or some of their columns."""
    k, width = unit.shape
    gram = blas.dsyrk(1.0, unit.T, trans=1, lower=1)  # unit.T is Fortran-ordered
    # the margins (Higham, eq. (3.5) and Theorem 10.3; U = fl(C / norms)): (1) U differs from
    # the exactly normalised rows by the norms' relative error (at most gamma_{n+2}) and one
    # rounding per entry, which moves lambda_min by at most a factor (1 + gamma)^2 and 2.01 k u;
    # (2) |fl(UU') - UU'| <= gamma_w |U||U|' (w = width), in norm k gamma_w row^2 (row bounds
    # the norm of a row of U, or of its restriction to some columns); (3) a Cholesky
    # factorization that completes is exact for a matrix within k gamma_{k+1} max_i a_ii in
    # norm; (4) subtracting tau rounds each diagonal entry once more
    row = 1.0 + (n + 2) * _U64
    tau = floor * (1.0 + _gamma(n + 2)) ** 2 + 2.01 * k * _U64
    tau += k * _gamma(width) * row * row
    tau += k * _gamma(k + 1) * (row * row + tau) + 2 * _U64 * (row * row + tau)
    gram[np.diag_indices(k)] -= tau
    _, info = lapack.dpotrf(gram, lower=1, clean=0, overwrite_a=1)
    return int(info) == 0


@dataclass(frozen=True)
class AugmentedSolution:
    """The result of :func:`augmented_solve`.

    Attributes:
        u: ``(n,)`` primal part.
        w: ``(k,)`` multiplier part.
        residual: true relative residual
            :math:`\\|[r_1; r_2] - K[u; w]\\| / \\|[r_1; r_2]\\|`, computed in float64.
        iterations: GMRES iterations (each one float32 solve with :math:`M`).
    """

    u: np.ndarray
    w: np.ndarray
    residual: float
    iterations: int


def augmented_solve(
    P: np.ndarray,
    C: np.ndarray,
    r1: np.ndarray,
    r2: np.ndarray,
    *,
    tol: float,
    gamma: float = 1e3,
    max_iterations: int = 30,
) -> AugmentedSolution | None:
    """Solve :math:`[[P, C^\\top], [C, 0]][u; w] = [r_1; r_2]` by flexible GMRES preconditioned
    with the float32 Cholesky factor of :math:`M = P + C^\\top WC` (module docstring).

    Args:
        P: ``(n, n)`` symmetric float64 (its lower triangle enters :math:`M` and the GMRES
            products, all of it the true residuals, so it must be symmetric).
        C: ``(k, n)`` float64 rows, none of them zero.
        r1, r2: ``(n,)`` and ``(k,)`` float64 right-hand sides.
        tol: the relative residual of the equilibrated system (``S K S``, unit diagonal of
            ``P`` and unit rows) at which GMRES stops.
        gamma: the weight :math:`\\gamma` of :math:`\\omega_j = \\gamma c_P/\\|c_j\\|^2`, in the
            equilibrated coordinates (:math:`c_P` the mean diagonal of :math:`P` there).
        max_iterations: the most GMRES iterations, restarts included (each restart is a
            step of iterative refinement: GMRES on the true float64 residual).

    Returns:
        The :class:`AugmentedSolution` with its true residual, which the caller checks
        (GMRES stops at ``tol``, after ``max_iterations`` in all, or once a restart no longer
        halves the true residual), or ``None`` when the float32 Cholesky factorization of
        :math:`M` fails.
    """
    n = P.shape[0]
    P = np.ascontiguousarray(P)  # P.T is then Fortran-ordered: BLAS reads it without a copy
    # symmetric diagonal equilibration S = diag(s_u, s_w): unit diagonal of P (where positive)
    # and unit rows of C S_u; GMRES runs on S K S, so its iteration count and stopping test do
    # not depend on the scaling of the variables or of the rows
    diag = np.diagonal(P)
    positive = diag > 1e-12 * max(float(diag.max(initial=0.0)), 0.0)
    s_u = np.where(positive, 1.0 / np.sqrt(np.where(positive, diag, 1.0)), 1.0)
    norms2 = np.einsum("ij,ij,j->i", C, C, s_u * s_u)
    if not bool(np.all(norms2 > 0)):
        raise ValueError("C: expected rows that are not zero; drop the zero rows first.")
    s_w = 1.0 / np.sqrt(norms2)
    s = np.concatenate([s_u, s_w])
    c_p = float(np.mean(np.abs(diag) * s_u * s_u)) or 1.0  # mean |diagonal| of S_u P S_u
    omega = gamma * c_p  # W = omega I in the scaled coordinates: omega_j = omega s_w[j]^2
    root = np.sqrt(omega)
    scaled = np.empty(C.shape, dtype=np.float32)  # W^(1/2) C, scaled and rounded in one pass
    np.multiply(C, (root * s_w)[:, None], out=scaled, casting="same_kind")
    # M = P + scaled^T scaled (lower triangle) in one ssyrk; scaled.T and P32.T (= P32, P
    # symmetric) are Fortran-ordered views, so nothing is copied
    M = blas.ssyrk(1.0, scaled.T, beta=1.0, c=P.astype(np.float32).T, trans=0, lower=1,
                   overwrite_c=1)  # fmt: skip
    L, info = lapack.spotrf(M, lower=1, clean=0, overwrite_a=1)
    if int(info) != 0:
        return None
    strsv, dsymv, P_F = blas.strsv, blas.dsymv, P.T

    def step(v_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """In the scaled coordinates, ``z = S^-1 B S^-1 v`` and ``SKSz``: one float32 solve with
        M and one float32 product inside B, three float64 products for K (P by its lower
        triangle)."""
        a_s, b_s = v_s[:n], v_s[n:]
        t = scaled.T @ (root * b_s).astype(np.float32)  # C'Wb (Wb = omega s_w b_s)
        t += a_s / s_u  # + a
        t = strsv(L, t, lower=1, overwrite_x=1)
        du = strsv(L, t, lower=1, trans=1, overwrite_x=1).astype(np.float64)
        Cdu_s = (C @ du) * s_w
        dw_s = omega * (Cdu_s - b_s)  # S_w^-1 W (C du - b)
        top = dsymv(1.0, P_F, du, lower=0)  # P du: the upper triangle of P.T is P's lower
        top += (dw_s * s_w) @ C
        top *= s_u
        return np.concatenate([du / s_u, dw_s]), np.concatenate([top, Cdu_s])

    rhs = np.concatenate([r1, r2])
    with blas_threads(1):  # matrix-vector products: one BLAS thread (no oversubscription)
        z_s, iterations, res = _refine(step, partial(_residual, P, C, rhs), rhs, s, tol,
                                       max_iterations)  # fmt: skip
    z = z_s * s
    true = float(np.linalg.norm(res)) / (float(np.linalg.norm(rhs)) or 1.0)
    return AugmentedSolution(z[:n], z[n:], true, iterations)


def _residual(P: np.ndarray, C: np.ndarray, rhs: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The true float64 residual ``rhs - K z`` (all of ``P``)."""
    n = P.shape[0]
    u, w = z[:n], z[n:]
    top = P @ u
    top += w @ C
    return rhs - np.concatenate([top, C @ u])


def _refine(
    step: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    residual: Callable[[np.ndarray], np.ndarray],
    rhs: np.ndarray,
    s: np.ndarray,
    tol: float,
    max_iterations: int,
) -> tuple[np.ndarray, int, np.ndarray]:
    """Restarted FGMRES on the true float64 residual (iterative refinement):
    ``(z_s, steps, residual)``, ``z_s`` in the scaled coordinates (``z = S z_s``) and the
    unscaled true residual of ``z``."""
    scale = float(np.linalg.norm(rhs * s)) or 1.0
    z_s, res = np.zeros_like(rhs), rhs  # res = rhs - K S z_s
    rel, iterations = float(np.linalg.norm(res * s)) / scale, 0
    while rel > tol and iterations < max_iterations:
        # GMRES on the true float64 residual; a restart is iterative refinement, which takes
        # the result to the round-off floor where the recurrence's estimate has drifted
        inner_tol = max(tol / rel, 16 * _U64)
        dz, used = _fgmres(step, res * s, tol=inner_tol, max_iterations=max_iterations - iterations)
        iterations += used
        new_z = z_s + dz
        new_res = residual(new_z * s)
        new_rel = float(np.linalg.norm(new_res * s)) / scale
        if not new_rel < 0.5 * rel:  # no progress: round-off floor (or no convergence)
            if new_rel < rel:
                z_s, res, rel = new_z, new_res, new_rel
            break
        z_s, res, rel = new_z, new_res, new_rel
    return z_s, iterations, res


def _fgmres(
    step: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    b: np.ndarray,
    *,
    tol: float,
    max_iterations: int,
) -> tuple[np.ndarray, int]:
    """Flexible GMRES from :math:`x_0 = 0` (Saad 1993): ``step(v)`` returns the preconditioned
    vector :math:`z = B_jv` and :math:`Kz`; classical Gram-Schmidt applied twice, Givens
    rotations. Stops once the residual estimate is below ``tol * ||b||``, at an exact solution
    or after ``max_iterations``; returns ``(x, iterations)`` (the best iterate of the space)."""
    N, m = b.shape[0], max(max_iterations, 1)
    beta = float(np.linalg.norm(b))
    V = np.empty((m + 1, N))
    Z = np.empty((m, N))
    H = np.zeros((m + 1, m))
    cs, sn = np.zeros(m), np.zeros(m)
    g = np.zeros(m + 1)
    V[0], g[0] = b / beta, beta
    j = 0
    for j in range(m):
        Z[j], w = step(V[j])
        h = V[: j + 1] @ w
        w -= h @ V[: j + 1]
        h2 = V[: j + 1] @ w
        w -= h2 @ V[: j + 1]
        H[: j + 1, j] = h + h2
        norm_w = float(np.linalg.norm(w))
        H[j + 1, j] = norm_w
        for i in range(j):  # the earlier rotations on the new column
            a, c = H[i, j], H[i + 1, j]
            H[i, j], H[i + 1, j] = cs[i] * a + sn[i] * c, -sn[i] * a + cs[i] * c
        radius = float(np.hypot(H[j, j], H[j + 1, j]))
        if radius == 0.0:  # K B singular on the Krylov space: keep the previous iterate
            break
        cs[j], sn[j] = H[j, j] / radius, H[j + 1, j] / radius
        H[j, j], H[j + 1, j] = radius, 0.0
        g[j + 1], g[j] = -sn[j] * g[j], cs[j] * g[j]
        if abs(g[j + 1]) <= tol * beta or norm_w == 0.0:  # converged, or an exact solution
            j += 1
            break
        V[j + 1] = w / norm_w
    else:
        j = m
    if j == 0:
        return np.zeros_like(b), 1
    y = solve_triangular(H[:j, :j], g[:j], lower=False, check_finite=False)
    return y @ Z[:j], j
