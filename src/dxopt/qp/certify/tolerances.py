"""The certificate's tolerances, defined once for every route that certifies a point.

Four implementations judge a candidate point :math:`(x, \\mu, \\nu)` of
:math:`\\min \\tfrac12 x^\\top Px + q^\\top x` s.t. :math:`Ax = b`, :math:`Gx \\le h`:
:func:`dxopt.qp.certify.polish.certify` (one sample, numpy/scipy: the general CPU path),
:func:`dxopt.qp.certify.polish.batch_accept_exact` (a batch of daqp points, numpy), the compiled
``_certificate`` of :mod:`dxopt.qp.solvers.kernels.certify` (the lean path, numba) and
:func:`dxopt.qp.certify.torch_certify.certify` (the device path, torch). They share the rule
below and take its constants from here (``tests/qp/certify/test_routes_agree.py`` checks that
every route accepts and rejects the same samples).

**Acceptance** (the backends' own stopping rules use norm scales of the same form; a row is
never normalised, so a zero or tiny row cannot poison a threshold). With
:math:`r = \\max(\\varepsilon_{rel}, \\text{RELATIVE\\_FLOOR})`:

* primal, row by row: :math:`(g_i^\\top x - h_i)_+ \\le t_{p,i}` and :math:`|a_j^\\top x - b_j|
  \\le t_{e,j}` with :math:`t_{p,i} = \\varepsilon_{abs} + \\min(r\\sigma_p,\\
  r_{row}\\sigma_{p,i})`, :math:`\\sigma_p = \\max(\\|Gx\\|_\\infty, \\|h\\|_\\infty)` (the
  rows' common scale), :math:`\\sigma_{p,i} = \\max((|G||x|)_i, |h_i|)` (row :math:`i`'s own
  scale) and :math:`r_{row} = \\max(\\varepsilon_{rel}, \\text{ROW\\_FLOOR})`; the same for
  ``A, b`` (:math:`t_{e,j}`). The common scale alone lets a small row be violated at the scale
  of a large one (rows of norms 1e-6 and 1e6: 5% of a small row passed); the row's own scale
  alone, at :math:`r = 10^{-10}`, is stricter than what backends reach on rows they satisfy
  only to the accuracy of the whole problem (Maros-Meszaros QPILOTNO missed it by 6.8x). The
  minimum never accepts more than the common scale did; the complementarity test below keeps
  the common :math:`t_p = \\varepsilon_{abs} + r\\sigma_p`;
* tiny rows (:func:`row_floor`): a row with :math:`0 < \\|g_i\\|_\\infty < 1` whose own scale
  is below the absolute floor, :math:`\\sigma_{p,i} < \\varepsilon_{abs}`, has the absolute
  part :math:`\\varepsilon_{abs}\\|g_i\\|_\\infty` in place of :math:`\\varepsilon_{abs}`
  in :math:`t_{p,i}` (likewise a row of ``A`` in :math:`t_{e,j}`): its violation over its norm,
  a distance in ``x``, within :math:`\\varepsilon_{abs}`, as for a row of norm 1. The floor
  alone made such a row vacuous (a row of norm 1e-12 violated by 15% of its own size passed
  at 1e-9, the point 0.087 from the solution). The floor depends on the row's norm, never on
  ``x``: at a solution near 0 (every own scale near 0) a row of norm 1 keeps
  :math:`\\varepsilon_{abs}`; rows of own scale at least :math:`\\varepsilon_{abs}` (norms
  1e-6 next to 1e6 included) and zero rows are judged as before. The polish adds a tiny row
  violated beyond :math:`t_{p,i}` to its active set (its violation is below round-off of the
  common scale, the polish's own test);
* dual, componentwise: :math:`|(Px + q + A^\\top\\mu + G^\\top\\nu)_j| \\le t_d +
  c\\,u\\,(|P||x| + |q| + |A|^\\top|\\mu| + |G|^\\top|\\nu|)_j` with :math:`t_d =
  \\varepsilon_{abs} + r\\max(\\|Px\\|_\\infty, \\|q\\|_\\infty, \\|A^\\top\\mu\\|_\\infty,
  \\|G^\\top\\nu\\|_\\infty)` and :math:`c\\,u` = ``EVALUATION_ROUNDOFF`` (the round-off of the
  residual's own evaluation; see there);
* sign: :math:`(-\\nu_i)_+\\|g_i\\|_\\infty \\le t_d`;
* complementarity, row by row (the *settled* form): :math:`\\min((h_i - g_i^\\top x)_+/t_p,\\
  (\\nu_i)_+\\|g_i\\|_\\infty/t_d) \\le 1`; the general path alone also accepts, as a last
  resort, the duality-gap form :math:`\\sum_i (h_i - g_i^\\top x)_+\\nu_i \\le \\varepsilon_{abs}
  + r\\max(|x^\\top Px|, |q^\\top x|, |h^\\top\\nu|)` (an *unsettled* point, flagged by the
  backward);
* zero rows: an all-zero row of ``G`` is never active and is feasible iff
  :math:`h_i \\ge -\\varepsilon_{abs}`; an all-zero row of ``A`` needs :math:`|b_j| \\le
  \\varepsilon_{abs}`;
* an exact working set (daqp's) is accepted without polish only when no row outside it is
  violated beyond round-off: :math:`g_i^\\top x - h_i > \\text{ROUNDOFF}\\max(\\|Gx\\|_\\infty,
  \\|h\\|_\\infty)` rejects it.

**Active-set thresholds** (:func:`dxopt.qp.certify.active.identify_active`, the device path's
:func:`dxopt.qp.certify.torch_certify.regular` and the lean kernels): a row of the forward's
set is strongly active when :math:`\\nu_i\\|g_i\\|_\\infty > \\text{STRONG\\_MULTIPLIER}\\,
\\sigma^d`; rows with relative slack below :math:`\\tau = \\max(\\text{WEAK\\_FACTOR}\\,
\\varepsilon, \\text{WEAK\\_FLOOR})` and multiplier below :math:`\\tau\\sigma^d` are weakly
active. The lean path (:mod:`dxopt.qp.lean.small`) keeps the forward's set only when it is clear
of that test by the margin :math:`\\max(\\text{LEAN\\_MARGIN\\_FLOOR},
\\text{LEAN\\_MARGIN\\_FACTOR}\\,\\varepsilon)` (ten times the weak test's factor and floor), so
it never decides a case the general path would classify differently.

The compiled kernels read ``LEAN_MARGIN_FACTOR``, ``EVALUATION_ROUNDOFF`` and ``ROW_FLOOR`` as
globals, fixed when they are compiled;
numba's on-disk cache is keyed on the kernel's own file, so after changing a constant here,
delete the ``__pycache__`` of :mod:`dxopt.qp.solvers` (or ``NUMBA_CACHE_DIR``). The other
constants reach the kernels as arguments.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "AMBIGUITY",
    "CERT_TOL",
    "DAS_DEPENDENT",
    "DAS_REFINE_STEPS",
    "DENSE_SELECTION",
    "DEPENDENCE_DELTA",
    "DEPENDENCE_DELTA_LADDER",
    "DEPENDENCE_MAX_STEPS",
    "DEPENDENCE_REFINE_TOL",
    "DEPENDENCE_STALL_FLOOR",
    "DEPENDENT_TOL",
    "EVALUATION_ROUNDOFF",
    "GRAM_EIGEN_FLOOR",
    "IPM_EPS_FLOOR",
    "KKT_PIVOT_RATIO",
    "KKT_REFINE_STEPS",
    "KKT_REFINE_TOL",
    "LEAN_MARGIN_FACTOR",
    "LEAN_MARGIN_FLOOR",
    "NEAR_MISS",
    "PENALTY_PRECONDITIONER_BETA",
    "PINV_NORMAL_LIMIT",
    "PINV_NULL_X_PART",
    "PINV_RANK_TOL",
    "REFINE_ROUNDOFF",
    "RELATIVE_FLOOR",
    "ROUNDOFF",
    "ROUNDOFF_KKT",
    "ROW_FLOOR",
    "RULE_GRAM_SHIFT",
    "RULE_LSMR_TOL",
    "RULE_RANK_CUT",
    "SIMPLEX_DRIVE_OUT_TOL",
    "SIMPLEX_PIVOT_TOL",
    "SIMPLEX_RATIO_TIE",
    "SIMPLEX_SUPPORT_TOL",
    "STRONG_MULTIPLIER",
    "TORCH_REFINE_STEPS",
    "VERTEX_FEASIBLE_TOL",
    "WEAK_FACTOR",
    "WEAK_FLOOR",
    "relative_tolerance",
    "row_floor",
    "row_tolerance",
]

RELATIVE_FLOOR = 1e-10
"""The least relative tolerance :math:`r` of the acceptance tests: asked for less, a badly
scaled problem's residuals (sums of terms of size ``scale``) are round-off, not progress."""

ROW_FLOOR = 1e-8
"""The least relative tolerance :math:`r_{row}` of a row against its own scale (the primal
test): a violation of more than ``ROW_FLOOR`` of the row's own size means the point is wrong
in that row's direction (relative error of ``x`` there), not round-off."""

ROUNDOFF = 1e-12
"""Round-off level, relative to the norm scales: a row violated by more than ``ROUNDOFF``
times :math:`\\max(\\|Gx\\|_\\infty, \\|h\\|_\\infty)` is violated, and a multiplier below
``-ROUNDOFF`` times the dual scale is negative, whatever the requested tolerance (the polish's
active set and the exact-working-set acceptance do not depend on it)."""

EVALUATION_ROUNDOFF = 2.0 * 2.0**-53
"""The round-off allowance :math:`c\\,u` of the stationarity test, per component: a residual
:math:`r_j = (Px + q + A^\\top\\mu + G^\\top\\nu)_j` evaluated in float64 carries an error
up to :math:`\\gamma_k (|P||x| + |q| + |A|^\\top|\\mu| + |G|^\\top|\\nu|)_j`,
:math:`\\gamma_k = ku/(1 - ku)`, :math:`u = 2^{-53}`, :math:`k` the number of terms (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1, eq. 3.5); below that the
point's residual cannot be told from zero, so the test cannot certify or refute it and
counts it within tolerance. We take :math:`c = 2`, not the rigorous :math:`\\gamma_k` (:math:`k` up
to :math:`n + m + p`, a real loosening on long dense rows) nor the probabilistic
:math:`\\sqrt{k}\\,u` (Higham and Mary, 2019): :math:`2u` is of the order of the error that the
final additions of the four blocks alone make, whatever the row length, so the allowance stays below
the evaluation's round-off and accepts no residual that round-off could not have produced. It acts
only where those terms exceed about :math:`t_d/u` (huge multipliers that cancel: LISWET7 of
Maros-Meszaros, :math:`|G|^\\top|\\nu| \\approx 9\\cdot 10^6` against :math:`t_d \\approx 10^{-9}`);
sign and complementarity keep :math:`t_d`."""

AMBIGUITY = 1e4
"""A row whose slack and multiplier are both below ``AMBIGUITY`` times their tolerances is not
settled by the point (an interior-point point): the general path polishes it."""

DEPENDENT_TOL = 1e-10
"""A row is dependent on the others when its squared distance to their span, relative to its
squared norm (a pivot of the Cholesky factor of the row-normalised Gram matrix), is below
this (:mod:`dxopt.qp.certify.dependence`)."""

DENSE_SELECTION = 1_000_000
"""The most entries of the dense active rows :math:`C` (rows times columns) for which the
forward selects the minimum-norm multipliers (:mod:`dxopt.qp.certify.multipliers`: a Gram test
and an SVD of :math:`C`); bigger samples keep the backend's multipliers."""

STRONG_MULTIPLIER = 1e-10
"""A row of the forward's active set is strongly active when :math:`\\nu_i\\|g_i\\|_\\infty`
exceeds this times the dual scale :math:`\\sigma^d` (its multiplier is above round-off)."""

WEAK_FACTOR = 1e3
"""The weak-activity threshold :math:`\\tau` is ``WEAK_FACTOR`` times the achieved accuracy
:math:`\\varepsilon` (at least ``WEAK_FLOOR``): a relative slack or multiplier that small
cannot be told from zero at that accuracy."""

WEAK_FLOOR = 1e-9
"""The least weak-activity threshold :math:`\\tau` (an exact point still has round-off)."""

LEAN_MARGIN_FACTOR = 1e4
"""The lean path keeps the forward's active set only when every working multiplier and every
free row's relative slack exceeds ``max(LEAN_MARGIN_FLOOR, LEAN_MARGIN_FACTOR * eps)``: ten
times ``WEAK_FACTOR``, clear of the general path's weak test. A working multiplier within
``LEAN_MARGIN_FACTOR`` times the relative stationarity residual of zero also declines."""

LEAN_MARGIN_FLOOR = 1e-8
"""The lean path's margin floor: ten times ``WEAK_FLOOR``."""


def relative_tolerance(eps_rel: float) -> float:
    """:math:`r = \\max(\\varepsilon_{rel}, \\text{RELATIVE\\_FLOOR})`, the relative part of
    every acceptance test."""
    return max(eps_rel, RELATIVE_FLOOR)


def row_floor(eps_abs: float, row_scale: Any, row_norm: Any) -> Any:
    """The absolute part :math:`\\varepsilon_{abs,i}` of each row's primal tolerance, for
    numpy arrays or torch tensors (``row_scale`` :math:`\\sigma_{p,i}`, ``row_norm``
    :math:`\\|g_i\\|_\\infty`, same shape): ``eps_abs``, except on a *tiny row* (module
    docstring: :math:`0 < \\|g_i\\|_\\infty < 1` and :math:`\\sigma_{p,i} <
    \\varepsilon_{abs}`), which gets :math:`\\varepsilon_{abs}\\|g_i\\|_\\infty`."""
    if isinstance(row_scale, torch.Tensor):
        tiny = (row_scale < eps_abs) & (row_norm > 0.0) & (row_norm < 1.0)
        return torch.where(tiny, eps_abs * row_norm, eps_abs)
    tiny = (row_scale < eps_abs) & (row_norm > 0.0) & (row_norm < 1.0)
    return np.where(tiny, eps_abs * row_norm, eps_abs)


def row_tolerance(eps_abs: float, rel: float, scale: Any, row_scale: Any, row_norm: Any) -> Any:
    """The primal tolerances of the rows, :math:`\\varepsilon_{abs,i} + \\min(r\\sigma,\\
    r_{row}\\sigma_i)` (module docstring), for numpy arrays or torch tensors: ``scale`` the
    common scale (``(S, 1)`` for a batch), ``row_scale`` each row's own scale, ``row_norm``
    each row's max-norm (broadcast against ``row_scale``; :func:`row_floor`), ``rel`` =
    :func:`relative_tolerance`. The ``1e-300`` keeps a zero row at ``eps_abs = 0`` from
    dividing by zero."""
    own = max(rel, ROW_FLOOR) * row_scale
    common = rel * scale
    if isinstance(own, torch.Tensor):
        common = torch.as_tensor(common, dtype=own.dtype)
        return row_floor(eps_abs, row_scale, row_norm) + torch.minimum(own, common) + 1e-300
    return row_floor(eps_abs, row_scale, row_norm) + np.minimum(own, common) + 1e-300


# --- the smoothed (log-barrier) backward, :class:`dxopt.qp.Smoothed` ---------------------------
SMOOTHED_NEWTON_TOL = 1e-12
"""Relative residual of the central-path equations at which the barrier Newton stops
(:mod:`dxopt.qp.backward.smoothed`): each block over its own scale (module docstring there)."""
SMOOTHED_MAX_NEWTON = 100
"""Newton steps of the barrier solve before it is reported as not converged."""
SMOOTHED_REFINE_STEPS = 4
"""Iterative-refinement steps of the barrier adjoint solve against the barrier KKT matrix."""
SMOOTHED_MAX_RESIDUAL = 1e-10
"""Largest normwise backward error of the barrier adjoint solve accepted as a gradient."""
SMOOTHED_BOUNDARY = 0.995
"""Fraction-to-the-boundary factor of the barrier Newton step (keeps ``s, lambda > 0``)."""
SMOOTHED_ARMIJO = 1e-4
"""Sufficient-decrease constant of the barrier Newton's backtracking on ``||F||^2``."""
SMOOTHED_HALVINGS = 40
"""Step halvings of that backtracking before the smallest step is taken."""


# --- the backward (:mod:`dxopt.qp.backward`) --------------------------------------------------
KKT_PIVOT_RATIO = 1e-10
"""LU pivots of the exact KKT backward below this (relative) trigger the dependent-row test
(:mod:`dxopt.qp.backward.kkt`)."""
KKT_REFINE_STEPS = 5
"""Refinement steps of the exact Schur solve against the KKT matrix :math:`K`
(:mod:`dxopt.qp.backward.kkt`, and the lean adjoint of :mod:`dxopt.qp.lean.small_backward`)."""
KKT_REFINE_TOL = 1e-13
"""Relative residual at which that refinement stops."""
REFINE_ROUNDOFF = 4.0
"""The refinement against the reduced KKT matrix :math:`K` (the compiled kernels of
:mod:`dxopt.qp.solvers.kernels.adjoint` and :func:`dxopt.qp.backward.regular.schur_refine`)
also stops once its residual :math:`r = b - Kz` is at the round-off of its own evaluation:
:math:`|r_i| \\le c\\,(|b| + |K||z|)_i` for every component (the componentwise backward
error, Oettli & Prager 1964, as LAPACK's refinement tests it), :math:`c` this many times
``EVALUATION_ROUNDOFF``. Further steps there only move round-off; the relative residual,
which the refinement's tolerance and the residual bound judge, need not be small there (an
ill-conditioned :math:`P`: :math:`|P||u| \\gg |b|`)."""
PENALTY_PRECONDITIONER_BETA = 1e-6
"""The least penalty weight :math:`\\beta` of a penalty matrix that preconditions the refinement
against the exact reduced KKT system (:class:`dxopt.qp.PenaltyBackward`)."""
GRAM_EIGEN_FLOOR = 100 * DEPENDENT_TOL
"""The certified smallest eigenvalue of the normalised Gram matrix of the active rows on the
large dense path (:mod:`dxopt.qp.backward.dense_large`)."""
RULE_GRAM_SHIFT = 1e-14
"""The diagonal shift of the degenerate rule's Gram factor
(:mod:`dxopt.qp.backward.degenerate_rule`, :mod:`dxopt.qp.backward.gram_blocks`,
:mod:`dxopt.qp.backward.vertex_simplex`)."""
RULE_RANK_CUT = 1e-8
"""Relative singular value below which a direction of the active rows counts as dependent
(the degenerate rule, :mod:`dxopt.qp.backward.degenerate_rule`, and the batched vertex rule,
:mod:`dxopt.qp.backward.vertex_batch`)."""
RULE_LSMR_TOL = 1e-14
"""Tolerance of the LSMR solves of the degenerate rule
(:mod:`dxopt.qp.backward.degenerate_rule`)."""
VERTEX_FEASIBLE_TOL = 1e-9
"""Relative: a vertex's residual and negative entries below this are round-off (the batched
vertex rule), and a phase-1 optimum below this is zero, a feasible program (its simplex,
:mod:`dxopt.qp.backward.vertex_simplex`)."""
SIMPLEX_PIVOT_TOL = 1e-12
"""Entries and reduced costs of the vertex simplex below this are zero
(:mod:`dxopt.qp.backward.vertex_simplex`)."""
SIMPLEX_RATIO_TIE = 1e-15
"""Relative: ratio-test ratios within this of the minimum tie (the smallest basic index wins)."""
SIMPLEX_DRIVE_OUT_TOL = 1e-9
"""An artificial variable's row with no entry above this is redundant."""
SIMPLEX_SUPPORT_TOL = 1e-9
"""Relative to the largest entry: the support of a vertex."""
PINV_NORMAL_LIMIT = 1e-9
"""Relative residual of the normal equations accepted for :math:`K^+ r`
(:mod:`dxopt.qp.backward.fallbacks`)."""
PINV_RANK_TOL = 1e-12
""":math:`\\sigma_{min}/\\sigma_{max}` of the equilibrated :math:`K` below which :math:`K` is
singular."""
PINV_NULL_X_PART = 1e-6
"""The ``x`` part of a unit null vector of :math:`K` above which ``x`` is not unique."""


# --- the dependent-row test (:mod:`dxopt.qp.certify.dependence`) ------------------------------
DEPENDENCE_DELTA = 1e-8
"""The first relative regularisation of the dependent-row test's refinement
(:mod:`dxopt.qp.certify.dependence`)."""
DEPENDENCE_DELTA_LADDER = (DEPENDENCE_DELTA, 1e-11, 1e-13)
"""The relative regularisations tried in turn while that refinement stalls."""
DEPENDENCE_STALL_FLOOR = 1e-12
"""Relative residual below which a stalled refinement is at round-off."""
DEPENDENCE_MAX_STEPS = 60
"""Refinement steps of the regularised Gram solve at most."""
DEPENDENCE_REFINE_TOL = 1e-14
"""Relative residual at which the regularised Gram solve stops."""


# --- the compiled dual active-set solver (:mod:`dxopt.qp.solvers.dual_active_set`) ------------
DAS_DEPENDENT = 1e-12
"""A row joining the compiled dual active-set solver's working set is dependent when its squared
pivot is below this times :math:`\\|y_r\\|^2` (:mod:`dxopt.qp.solvers.dual_active_set`)."""
DAS_REFINE_STEPS = 2
"""Newton steps on the working set's KKT system at the end of that solver."""


# --- the certificates of failure (:mod:`dxopt.qp.certify.certificates`) ----------------------
CERT_TOL = 1e-7
"""Relative tolerance of the certificate checks (:mod:`dxopt.qp.certify.certificates`)."""
NEAR_MISS = 10.0
"""A point whose worst residual is at most this times its tolerance is a near miss: the
status is ``INACCURATE`` with the factor to loosen by, not ``MAX_ITER``
(:mod:`dxopt.qp.certify.certificates`)."""


# --- the torch device solver (:mod:`dxopt.qp.solvers.torch_ipm`, :mod:`~.torch_kkt`) ---------
IPM_EPS_FLOOR = 1e-6
"""The torch interior point (:mod:`dxopt.qp.solvers.torch_ipm`) stops at
``max(eps_abs, IPM_EPS_FLOOR)``: the polish solves the identified active set exactly and
certifies it at the user's ``eps_abs``; a sample whose polish fails resumes with a 1000x tighter
complementarity."""
ROUNDOFF_KKT = 1e-10
"""The relative residual of the torch polish's float64 KKT solve up to which the active set's KKT
matrix is taken as numerically nonsingular (a regular sample; else the CPU path): the float64
backward's own acceptance threshold (:mod:`dxopt.qp.autograd.torch_function`)."""
TORCH_REFINE_STEPS = 16
"""Default cap on the refinement passes of a KKT solve of the torch solver (polish and
backward, :mod:`dxopt.qp.solvers.torch_kkt`). Each pass after the first runs only while some
sample is above round-off and still halving its residual, so a well-conditioned batch takes
one or two."""
