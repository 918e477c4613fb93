r"""One hypergradient estimate at a fixed ``x``, with a status: :func:`hypergradient`.

A method's estimate is :math:`d = \nabla_x f(x, y) - \nabla^2_{xy} g(x, y)\, v` at a lower-level
point :math:`y \approx y^*(x)` and an adjoint :math:`v \approx [\nabla^2_{yy} g]^{-1}
\nabla_y f` (each method says which pair it used through ``estimate_point``). The estimate is
trusted only when both solves are certified by their residuals, measured against the size of
the terms that cancel in them (a normwise backward error, as for a linear system
:math:`Ay = c`: :math:`\|Ay - c\| \le \mathrm{rtol}(\|Ay\| + \|c\|) + \mathrm{atol}`):

.. math::

    \|\nabla_y g(x, y)\| &\le \mathrm{rtol}\,\big(\|\nabla^2_{yy} g\, y\|
        + \|\nabla_y g(x, y) - \nabla^2_{yy} g\, y\|\big) + \mathrm{atol}, \\
    \|\nabla^2_{yy} g\, v - \nabla_y f(x, y)\| &\le \mathrm{rtol}\,\big(\|\nabla^2_{yy} g\,
        v\| + \|\nabla_y f(x, y)\|\big) + \mathrm{atol}.

For a quadratic lower level :math:`\nabla_y g = Qy + c` the first is the backward error of
:math:`Qy = -c`. Neither scale shrinks with a warm start at the solution (unlike a reduction
of the starting residual), and neither can hide a residual of the size of the data. A
backward error bounds the forward error by the condition number: :math:`\|y - y^*\| /
\|y^*\| \lesssim \kappa\,\mathrm{rtol}`.

A solve that misses its tolerance *diverged* (``Status.DIVERGED``: lower the step size) rather
than stopped short (``MAX_ITER``: raise ``max_iter``) when its residual is not finite or ends
above :data:`GROWTH` times the residual it started from. A convergent step never does that:
gradient descent with :math:`\alpha \le 2/L_g` on a convex :math:`L_g`-smooth :math:`g` does
not increase :math:`\|\nabla_y g\|` (co-coercivity of the gradient), Nesterov's method with
:math:`\alpha \le 1/L_g` and :math:`\beta < 1` started at rest does not increase it on a
quadratic (each eigen-component shrinks), and a Neumann series with :math:`\eta \le 2/L_g`
has residual :math:`(I - \eta\nabla^2_{yy} g)^K\nabla_y f`, of norm at most
:math:`\|\nabla_y f\|`. The adjoint is tested this way for Neumann-type solves only (a
:class:`~dxopt.bilevel.Neumann` series, :class:`~dxopt.bilevel.ITD`'s unroll of gradient
descent); a CG residual may grow on the way to convergence.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dxopt._core import (
    Cost,
    NotConvergedError,
    Status,
    check_on_failure,
    check_positive,
    handle_failure,
    renamed_kwargs,
)
from dxopt.bilevel.driver import HypergradientMethod, _start
from dxopt.bilevel.inner import CG
from dxopt.bilevel.methods import ITD
from dxopt.bilevel.oracles import BilevelOracle, BudgetExhaustedError, CountingOracle

__all__ = ["GROWTH", "HypergradientError", "HypergradientResult", "hypergradient"]

GROWTH = 2.0
"""A solve that ends with a residual above ``GROWTH`` times its starting residual (and misses
its tolerance) is reported ``DIVERGED`` (module docstring; the factor leaves room for a
non-quadratic lower level, where accelerated steps are not monotone)."""

_UNUSABLE = (Status.FAILED, Status.DIVERGED, Status.BUDGET_EXHAUSTED)
"""Statuses whose estimate is replaced by NaN (there is no approximate estimate to return)."""


class HypergradientError(NotConvergedError):
    """:func:`hypergradient` could not certify its estimate and ``on_failure="raise"``
    (``.status`` says why); a :class:`dxopt.DxoptError`."""


@renamed_kwargs(value="direction")
@dataclass(frozen=True)
class HypergradientResult:
    r"""One hypergradient estimate and whether its solves are trusted.

    Attributes:
        direction: the estimate of :math:`\nabla H(x)` (named as
            :attr:`BilevelResult.direction`; ``value`` is its deprecated name).
        y: the lower-level point the method used.
        status: ``SOLVED`` when both residuals are within tolerance, ``MAX_ITER`` when a
            solve stopped short of it (raise the inner loop's or the linear solver's
            ``max_iter``; for :class:`F2BA`, the penalty), ``DIVERGED`` when a residual grew
            (lower the step size; see :mod:`dxopt.bilevel.estimate`), ``FAILED`` for
            non-finite values, ``BUDGET_EXHAUSTED`` when a budgeted oracle refused a call,
            ``INACCURATE`` for a method that does not say which adjoint it used. For
            ``FAILED``, ``DIVERGED`` and ``BUDGET_EXHAUSTED`` ``direction`` is all NaN (under
            ``on_failure="warn"`` or ``"ignore"``): there is no estimate to use.
        inner_residual: :math:`\|\nabla_y g(x, y)\|` (``None`` for ``method="exact"``).
        linear_residual: :math:`\|\nabla^2_{yy} g\, v - \nabla_y f(x, y)\|` of the adjoint
            ``v`` the estimate used (``None`` for ``"exact"`` or an unknown method).
        cost: the method's oracle calls by kind and seconds (the residual checks are not
            counted, like the evaluation in :func:`minimize_bilevel`).
        state: the method's state afterwards (pass ``y`` back as ``y0`` to warm start;
            ``None`` when the budget ran out).
    """

    direction: torch.Tensor
    y: torch.Tensor
    cost: Cost
    status: Status = Status.SOLVED
    inner_residual: float | None = None
    linear_residual: float | None = None
    state: Any = field(default=None, repr=False)

    @property
    def value(self) -> torch.Tensor:
        """Deprecated name of :attr:`direction` (removed in the next release)."""
        warnings.warn(
            "HypergradientResult.value is renamed direction (as BilevelResult.direction); the "
            "old name will be removed in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.direction


@dataclass(frozen=True)
class _Check:
    residual: float
    bound: float
    start: float | None = None  # the residual the solve started from (None: not tested)

    @property
    def ok(self) -> bool:
        return self.residual <= self.bound  # False for NaN

    @property
    def diverged(self) -> bool:
        """Missed the bound and is not finite, or ended above ``GROWTH`` times its start."""
        if self.ok:
            return False
        if not math.isfinite(self.residual):
            return True
        return self.start is not None and self.residual > GROWTH * self.start


def _check(
    residual: torch.Tensor,
    *terms: torch.Tensor,
    rtol: float,
    atol: float,
    start: torch.Tensor | None = None,
) -> _Check:
    scale = sum(float(torch.linalg.vector_norm(t)) for t in terms)
    first = None if start is None else float(torch.linalg.vector_norm(start))
    return _Check(float(torch.linalg.vector_norm(residual)), rtol * scale + atol, first)


def _neumann_type(method: Any) -> bool:
    """Whether the method's adjoint comes from a Neumann-type iteration (whose residual
    cannot grow at a convergent step size), not from CG."""
    if isinstance(method, ITD):  # gradient descent's unroll implies a Neumann series
        return method.inner.momentum == 0.0
    linear = getattr(method, "linear", getattr(method, "neumann", None))
    return linear is not None and not isinstance(linear, CG)


def _certify(
    oracle: BilevelOracle,
    x: torch.Tensor,
    y: torch.Tensor,
    v: torch.Tensor | None,
    *,
    y0: torch.Tensor,
    adjoint_start: bool,
    rtol: float,
    atol: float,
) -> tuple[_Check, _Check | None]:
    r"""Residuals of the inner and the adjoint solve at ``(y, v)``, with the inner residual at
    the start ``y0`` and (``adjoint_start``) the adjoint residual at ``v = 0``, i.e.
    :math:`\|\nabla_y f\|` (uncounted oracle calls)."""
    gy = oracle.grad_g(x, y)[1]
    hy = oracle.hvp_yy(x, y, y)
    inner = _check(gy, hy, gy - hy, rtol=rtol, atol=atol, start=oracle.grad_g(x, y0)[1])
    if v is None:
        return inner, None
    fy = oracle.grad_f(x, y)[1]
    hv = oracle.hvp_yy(x, y, v)
    return inner, _check(hv - fy, hv, fy, rtol=rtol, atol=atol, start=fy if adjoint_start else None)


def _status(
    direction: torch.Tensor, inner: _Check, linear: _Check | None, known: bool
) -> tuple[Status, str]:
    if not bool(torch.isfinite(direction).all()) or not all(
        math.isfinite(c.residual) for c in (inner, linear) if c is not None
    ):
        return Status.FAILED, "the estimate or a residual is not finite"
    diverged = [
        f"{what} residual {check.residual:.3e} > {GROWTH:g} x its starting {check.start:.3e}"
        for what, check in (("inner", inner), ("adjoint", linear))
        if check is not None and check.diverged
    ]
    if diverged:
        return Status.DIVERGED, (
            "; ".join(diverged) + ": the iteration diverged, lower its step size (the inner "
            "loop's lr to at most 2/L_g for gradient descent, 1/L_g with momentum; a Neumann "
            "series' lr likewise), raising max_iter would not help"
        )
    misses = []
    if not inner.ok:
        misses.append(
            f"inner residual ||grad_y g|| = {inner.residual:.3e} > {inner.bound:.3e} (raise "
            "the inner loop's max_iter)"
        )
    if linear is not None and not linear.ok:
        misses.append(
            f"adjoint residual ||H v - grad_y f|| = {linear.residual:.3e} > {linear.bound:.3e} "
            "(raise the linear solver's max_iter; for F2BA, the penalty)"
        )
    if misses:
        return Status.MAX_ITER, "; ".join(misses)
    if not known:
        return Status.INACCURATE, (
            "the method has no estimate_point(before, after), so its adjoint cannot be checked "
            "(only the inner solve was)"
        )
    return Status.SOLVED, ""


def hypergradient(
    oracle: BilevelOracle,
    x: torch.Tensor,
    method: HypergradientMethod | str,
    *,
    y0: torch.Tensor | None = None,
    rtol: float | None = None,
    atol: float = 0.0,
    on_failure: str = "raise",
) -> HypergradientResult:
    r"""Estimate :math:`\nabla H(x)` once with ``method``, without moving ``x``, and certify it.

    The method runs one step from ``y0``; then the residuals of its inner solve and of its
    adjoint solve are checked at the pair :math:`(y, v)` it used (see
    :mod:`dxopt.bilevel.estimate` for the test, two gradients and two Hessian-vector
    products, not counted in ``cost``). Fixed-iteration loops (:class:`InnerLoop`,
    :class:`CG`, :class:`Neumann`) have no tolerance of their own: a capped solve whose
    residual misses the tolerance is ``Status.MAX_ITER``, never ``SOLVED``. With a stochastic
    oracle the residuals are one noisy sample.

    Args:
        oracle: the problem's oracle.
        x: where to estimate (a flat tensor of length ``oracle.dim_x``).
        method: a method instance such as ``AID(inner=..., linear=CG(max_iter=20),
            outer_lr=0.0)`` (its ``outer_lr`` is not used), or ``"exact"`` for the oracle's
            uncounted :meth:`exact_hypergradient` (a reference, not an estimate; always
            ``SOLVED``).
        y0: the lower-level start (default zero).
        rtol, atol: the residual test above; ``rtol`` defaults to :math:`\sqrt{\epsilon}` of
            the oracle's dtype (1.5e-8 in float64).
        on_failure: for a status other than ``SOLVED``: ``"raise"``
            (:class:`HypergradientError`, carrying the status), ``"warn"``
            (:class:`dxopt.DxoptWarning`, then the result) or ``"ignore"`` (only the status).
            An oracle with a budget (a :class:`CountingOracle`) that refuses a call gives
            ``BUDGET_EXHAUSTED`` under the same policy.

    Raises:
        ValueError: for an ``x`` / ``y0`` not matching the oracle, an unknown method name or
            a bad tolerance or ``on_failure``.
        HypergradientError: a solve is not certified, or the oracle's budget ran out, and
            ``on_failure="raise"``.
    """
    x = _start("x", x, oracle.dim_x, oracle.dtype)
    y = _start("y0", y0, oracle.dim_y, oracle.dtype)
    if rtol is None:
        rtol = torch.finfo(oracle.dtype).eps ** 0.5
    hint = "residuals are tested against rtol * (size of the cancelling terms) + atol."
    rtol = check_positive("rtol", rtol, allow_zero=True, hint=hint)
    atol = check_positive("atol", atol, allow_zero=True, hint=hint)
    check_on_failure(on_failure)
    if isinstance(method, str):
        if method != "exact":
            raise ValueError(
                f"method: expected a method instance (AID, ITD, StocBiO, SOBA, F2BA) or "
                f"'exact', got {method!r}."
            )
        start = time.perf_counter()
        value = oracle.exact_hypergradient(x)
        return HypergradientResult(
            direction=value, y=y, cost=Cost(seconds=time.perf_counter() - start)
        )
    if not (hasattr(method, "init") and hasattr(method, "step")):
        raise TypeError(
            f"method: expected a hypergradient method with init/step (e.g. AID), got "
            f"{type(method).__name__}."
        )
    counting = CountingOracle(oracle)
    name = type(method).__name__
    start = time.perf_counter()
    try:
        before = method.init(counting, x, y)
        direction, after = method.step(counting, x, before)
    except BudgetExhaustedError as err:  # a budgeted oracle passed in refused a call
        elapsed = time.perf_counter() - start
        handle_failure(
            on_failure,
            f"hypergradient: {name} could not finish its estimate: {err} after "
            f"{counting.total} calls. Give the oracle a larger budget, or pass "
            "on_failure='ignore' to get a BUDGET_EXHAUSTED result (direction NaN).",
            error=HypergradientError,
            status=Status.BUDGET_EXHAUSTED,
        )
        return HypergradientResult(
            direction=torch.full((oracle.dim_x,), math.nan, dtype=oracle.dtype),
            y=y,
            cost=replace(counting.cost, seconds=elapsed),
            status=Status.BUDGET_EXHAUSTED,
        )
    elapsed = time.perf_counter() - start
    locate = getattr(method, "estimate_point", None)
    y_used, v_used = locate(before, after) if locate is not None else (after.y, None)
    inner, linear = _certify(
        oracle,
        x,
        y_used,
        v_used,
        y0=before.y,
        adjoint_start=_neumann_type(method),
        rtol=rtol,
        atol=atol,
    )
    status, why = _status(direction, inner, linear, locate is not None)
    if status is not Status.SOLVED:
        handle_failure(
            on_failure,
            f"hypergradient: {name}'s estimate is not certified ({status.value}): {why}. Pass "
            "on_failure='ignore' to get the estimate with its status"
            + (" (NaN: there is none to use)" if status in _UNUSABLE else ", or loosen rtol")
            + f" (rtol now {rtol:.1e}).",
            error=HypergradientError,
            status=status,
        )
    if status in _UNUSABLE:
        direction = torch.full_like(direction, math.nan)
    return HypergradientResult(
        direction=direction,
        y=after.y,
        cost=replace(counting.cost, seconds=elapsed),
        status=status,
        inner_residual=inner.residual,
        linear_residual=None if linear is None else linear.residual,
        state=after,
    )
