"""Numerics shared by the three-dimensional cones whose boundary is a smooth surface
(the exponential and the power cone): input checks, a safeguarded scalar root-find, and the
Jacobian of a projection onto a curved surface.

Projection onto :math:`\\{\\varphi \\le 0\\}` at a point where the constraint is active: the
optimality conditions :math:`v - p = \\mu \\nabla\\varphi(p)`, :math:`\\varphi(p) = 0`,
:math:`\\mu \\ge 0`, differentiated implicitly, give

.. math::

    (I + \\mu H)\\,dp + d\\mu\\, g = dv, \\qquad g^\\top dp = 0,

with :math:`g = \\nabla\\varphi(p)`, :math:`H = \\nabla^2\\varphi(p)`; eliminating :math:`d\\mu`,

.. math::

    D\\Pi = M - \\frac{M g g^\\top M}{g^\\top M g}, \\quad M = (I + \\mu H)^{-1},

equivalently :math:`D\\Pi = T (T^\\top (I + \\mu H) T)^{-1} T^\\top` with :math:`T` an
orthonormal basis of :math:`g^\\perp`. For both cones :math:`H` has rank one on the surface,
:math:`\\mu H = c\\, w w^\\top`, so with :math:`P_g = I - \\hat g \\hat g^\\top` and
:math:`u = P_g w` (Sherman-Morrison on the tangent plane)

.. math::

    D\\Pi = P_g - \\gamma\\, \\hat u \\hat u^\\top, \\qquad
    \\gamma = \\frac{c \\Vert u\\Vert^2}{1 + c \\Vert u\\Vert^2} \\in [0, 1),

a symmetric form with no division by :math:`g^\\top M g` that stays finite in the limits
:math:`\\mu \\to 0` (:math:`\\gamma \\to 0`) and :math:`c \\to \\infty` (:math:`\\gamma \\to 1`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

#: The bracket ends of the scalar root-finds are clipped to this magnitude (beyond it the
#: projection has reached its limit to far below round-off).
RHO_MAX = 1e100


class ProjectionMemo:
    """The last :attr:`SIZE` results per tag of a cone's costly projection step (the root-find
    of the exponential and power cones, the PSD cone's eigendecomposition), keyed by the exact
    input rows (``torch.equal``: the same values give the same result bit for bit).

    The engine projects the same ``w`` several times per forward (the polish's residual and
    Jacobian, a rejected trial step that leaves ``w`` unchanged, the kink test, the backward's
    Jacobian); for these cones each is a batched scalar root-find of several Newton rounds or
    a batched ``eigh``. A memo is active
    only inside :func:`memo_scope` (the engine opens one per forward state, so a user's own
    :meth:`~dxopt.conic.cones.base.Cone.project` calls never share results and nothing stays
    alive beyond the state); inputs that carry autograd history are never memoised."""

    SIZE = 4

    def __init__(self) -> None:
        self._entries: list[tuple[Hashable, Tensor, Any]] = []

    def lookup(self, tag: Hashable, v: Tensor) -> Any:
        """The stored result for ``(tag, v)``, or ``None``."""
        for t, key, value in reversed(self._entries):
            if (
                t == tag
                and key.shape == v.shape
                and key.dtype == v.dtype
                and key.device == v.device
                and torch.equal(key, v)
            ):
                return value
        return None

    def latest(self, tag: Hashable, v: Tensor) -> Any:
        """The newest stored result for ``tag`` whose input has the shape of ``v`` (a warm
        start for the same cones at a nearby point), or ``None``."""
        for t, key, value in reversed(self._entries):
            if t == tag and key.shape == v.shape and key.dtype == v.dtype:
                return value
        return None

    def store(self, tag: Hashable, v: Tensor, value: Any) -> None:
        """Keep ``value`` as the result for ``(tag, v)``, dropping the oldest entry of ``tag``
        beyond :attr:`SIZE`."""
        entries = [*self._entries, (tag, v.detach().clone(), value)]
        same = [i for i, e in enumerate(entries) if e[0] == tag]
        drop = set(same[: max(0, len(same) - self.SIZE)])
        self._entries = [e for i, e in enumerate(entries) if i not in drop]


_MEMO: ContextVar[ProjectionMemo | None] = ContextVar("dxopt_conic_projection_memo", default=None)


@contextmanager
def memo_scope(memo: ProjectionMemo) -> Iterator[ProjectionMemo]:
    """Run the enclosed projections with ``memo`` (see :class:`ProjectionMemo`)."""
    token = _MEMO.set(memo)
    try:
        yield memo
    finally:
        _MEMO.reset(token)


def memoized(tag: Hashable, v: Tensor, compute: Callable[[Tensor, Any], Any]) -> Any:
    """``compute(v, hint)``, through the active :class:`ProjectionMemo` where there is one
    and ``v`` carries no autograd history; ``hint`` is :meth:`ProjectionMemo.latest` (or
    ``None``), for a warm start that must not change the result beyond its round-off.
    ``compute``'s result must not be modified in place."""
    memo = _MEMO.get()
    if memo is None or v.requires_grad:
        return compute(v, None)
    hit = memo.lookup(tag, v)
    if hit is None:
        hit = compute(v, memo.latest(tag, v))
        memo.store(tag, v, hit)
    return hit


def as_points(cls: str, v: object) -> tuple[Tensor, torch.Size, torch.dtype]:
    """Check ``v`` (a floating tensor of shape ``(..., 3)``) and return it flattened to
    ``(N, 3)`` in float64 (the scalar root-finds run in float64 for every input dtype), with
    the batch shape and the input dtype to cast back to."""
    if not isinstance(v, Tensor):
        raise TypeError(
            f"{cls}: v must be a torch.Tensor of shape (..., 3), got {type(v).__name__}"
        )
    if not v.dtype.is_floating_point:
        raise TypeError(
            f"{cls}: v must be a floating-point tensor (float32 or float64), got dtype "
            f"{v.dtype}; cast it with .double() or .float()"
        )
    if v.ndim < 1 or v.shape[-1] != 3:
        raise ValueError(
            f"{cls}: v must have shape (..., 3) (one 3-vector per cone), got shape {tuple(v.shape)}"
        )
    batch = v.shape[:-1]
    return v.reshape(-1, 3).to(torch.float64), batch, v.dtype


def flat_tol(tol: float | Tensor, batch: torch.Size, like: Tensor) -> Tensor:
    """``tol`` (a float, or a tensor broadcastable to ``batch``) as a float64 vector ``(N,)``."""
    t = torch.as_tensor(tol, dtype=torch.float64, device=like.device)
    return torch.broadcast_to(t, batch).reshape(-1)


def unit(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x / |x|`` over the last axis (zero rows stay zero) and ``|x|``, scaled by the largest
    entry first so that neither under- nor overflows (``|1e-200 e_1|`` is not 0)."""
    m = x.abs().amax(dim=-1, keepdim=True)
    y = x / torch.where(m > 0, m, torch.ones_like(m))
    n = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
    u = y / torch.where(n > 0, n, torch.ones_like(n))
    return u, (m * n)[..., 0]


def safeguarded_root(
    fun: Callable[[Tensor], tuple[Tensor, Tensor]],
    lo: Tensor,
    hi: Tensor,
    *,
    x0: Tensor | None = None,
    max_iter: int = 200,
) -> Tensor:
    """A root of ``f`` in ``[lo, hi]`` for each entry, given ``f(lo) <= 0 <= f(hi)``
    (``fun(x)`` returns ``f(x)`` and a value with the sign and Newton step of ``f'(x)``;
    any positive rescaling of both is allowed).

    Newton steps are taken while they at least halve :math:`|f|` (a step past an end of the
    bracket is clipped to it once: a root at round-off from that end); otherwise the bracket
    is bisected in the variable :math:`\\operatorname{asinh} x`
    (so that a bracket spanning many orders of magnitude is halved in magnitude, not only in
    length). The bracket is updated from the sign of ``f`` at every iterate, so the result
    is always inside a bracket that contains a sign change; an entry stops when the bracket
    is at round-off, ``f`` vanishes or a Newton correction is at round-off. The first iterate
    is ``x0`` (clipped to the bracket) or, where ``x0`` is not given or not finite, the
    bracket's middle in ``asinh``. The iteration
    count is the batch's maximum.
    """
    lo = lo.clone()
    hi = hi.clone()
    eps = torch.finfo(lo.dtype).eps
    x = torch.sinh(0.5 * (torch.asinh(lo) + torch.asinh(hi)))
    if x0 is not None:
        x = torch.where(torch.isfinite(x0), x0, x)
    x = torch.minimum(torch.maximum(x, lo), hi)
    done = torch.zeros_like(lo, dtype=torch.bool)
    f_prev = torch.full_like(lo, float("inf"))
    lo_seen = torch.zeros_like(done)
    hi_seen = torch.zeros_like(done)
    for _ in range(max_iter):
        f, df = fun(x)
        lo_seen = lo_seen | (x == lo)
        hi_seen = hi_seen | (x == hi)
        lo = torch.where(~done & (f < 0), x, lo)
        hi = torch.where(~done & (f > 0), x, hi)
        done = done | (f == 0) | (hi - lo <= 4 * eps * torch.maximum(lo.abs(), hi.abs()))
        if bool(done.all()):
            break
        newton = x - f / df
        # Newton while it at least halves |f|; a step past an end goes to that end once
        # (a root at round-off from an end), then it bisects
        out = ((newton <= lo) & lo_seen) | ((newton >= hi) & hi_seen)
        ok = torch.isfinite(newton) & (f.abs() <= 0.5 * f_prev) & ~out
        f_prev = torch.where(ok, f.abs(), torch.full_like(f, float("inf")))
        wide = (hi - lo) > 1.0
        mid = torch.where(
            wide, torch.sinh(0.5 * (torch.asinh(lo) + torch.asinh(hi))), 0.5 * (lo + hi)
        )
        step = torch.where(ok, torch.minimum(torch.maximum(newton, lo), hi), mid)
        # a Newton correction at round-off: the iterate is the root to machine precision
        tiny = torch.isfinite(newton) & ((newton - x).abs() <= 4 * eps * (x.abs() + 1))
        x = torch.where(done | tiny, x, step)
        done = done | tiny
    return x


def surface_jacobian(normal: Tensor, w: Tensor, c_inv: Tensor) -> Tensor:
    """:math:`P_g - \\gamma \\hat u \\hat u^\\top` (see the module docstring) for a batch:
    ``normal`` ``(N, 3)`` is :math:`g` (any positive scale), ``w`` ``(N, 3)`` spans the
    rank-one Hessian term :math:`\\mu H = c\\,w w^\\top`, ``c_inv`` ``(N,)`` is
    :math:`1/c \\in [0, \\infty]`."""
    g, _ = unit(normal)
    eye = torch.eye(3, dtype=g.dtype, device=g.device)
    pg = eye - g[:, :, None] * g[:, None, :]
    u = w - (w * g).sum(-1, keepdim=True) * g
    uh, un = unit(u)
    gamma = 1.0 / (1.0 + c_inv / (un * un))
    gamma = torch.where(un > 0, gamma, torch.zeros_like(gamma))
    return pg - gamma[:, None, None] * uh[:, :, None] * uh[:, None, :]
