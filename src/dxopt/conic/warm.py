"""Warm starts of :func:`dxopt.conic.solve`: a previous point tried first, certified as a cold one.

Clarabel (an interior-point method) takes no warm start, so a warm start pays the other way:
the previous point :math:`(x, y, s)` goes first through dxopt's own clean-up, Newton polish
and certificate (:func:`dxopt.conic.certify.certify_points`, the very code that checks every
backend's answer, with the caller's ``atol``/``rtol``), as the attempt ``"warm"`` at the head
of the forward chain (:func:`dxopt.conic.forward.solve_forward`). Where the polished point
certifies, the backends are skipped for that sample (``info.solvers[i] == "warm"``,
``info.warm[i]``); where it does not, the sample runs the cold chain unchanged, so a bad warm
start costs one polish and changes nothing else (the cold attempts see exactly the problem a
cold call sees). The polish is a few Newton steps on the optimality map
:math:`F(x, w) = 0` (:mod:`dxopt.conic.kkt`), which converge quadratically from a point of
the same active structure: a slowly changing problem (a trajectory, training epochs) is the
case that gains. An accepted point meets the same certificate as a cold answer, and the
kink classification and the backward run on it as on any certified point.

The warm start is a :class:`~dxopt.conic.types.ConicSolution` (its ``x, y, s``) or a tuple
``(x, y, s)`` with the shapes of the call's outputs (``(n,)``/``(m,)`` or with the batch axis;
an unbatched point is used for every sample). Non-finite rows (a failed sample's NaN) simply
fail the certificate and go cold.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dxopt.conic.backends import RawPoints
from dxopt.conic.forward import Attempt, ChainProblem
from dxopt.conic.problem import ConicProblem
from dxopt.conic.types import ConicSolution

__all__ = ["WarmStart", "warm_attempt", "warm_points"]

WarmStart = ConicSolution | tuple[Tensor, Tensor, Tensor] | None
"""What ``warm_start=`` takes."""


def _part(name: str, t: object, B: int, d: int) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(
            f"warm_start: expected {name} to be a torch.Tensor, got {type(t).__name__}; pass "
            "a previous ConicSolution or a tuple (x, y, s)"
        )
    if t.shape[-1:] != (d,) or t.ndim > 2 or (t.ndim == 2 and t.shape[0] not in (1, B)):
        raise ValueError(
            f"warm_start: expected {name} of shape ({d},) or ({B}, {d}), got "
            f"{tuple(t.shape)}; pass the solution of a call with the same problem sizes"
        )
    return t.detach().to(dtype=torch.float64, device="cpu").reshape(-1, d).expand(B, d)


def warm_points(prob: ChainProblem, warm: object) -> tuple[Tensor, Tensor, Tensor] | None:
    """``warm`` checked and laid out as float64 CPU ``(B, n), (B, m), (B, m)`` (or ``None``)."""
    if warm is None:
        return None
    if isinstance(warm, ConicSolution):
        parts: tuple[object, ...] = (warm.x, warm.y, warm.s)
    elif isinstance(warm, tuple) and len(warm) == 3:
        parts = warm
    else:
        raise TypeError(
            "warm_start: expected None, a ConicSolution or a tuple (x, y, s), got "
            f"{type(warm).__name__}"
        )
    B, n, m = prob.batch, prob.n, prob.m
    x, y, s = (_part(k, t, B, d) for k, t, d in zip("xys", parts, (n, m, m)))
    return x.contiguous(), y.contiguous(), s.contiguous()


def warm_attempt(points: tuple[Tensor, Tensor, Tensor]) -> Attempt:
    """The attempt ``"warm"``: it returns the warm point of each pending sample as a claimed
    solution, for the forward's certificate to accept or reject."""
    x, y, s = points

    def run(prob: ConicProblem, idx: list[int], tol: float, max_iter: int) -> RawPoints:
        ix = torch.as_tensor(idx, dtype=torch.long)
        xs, ys, ss = (np.ascontiguousarray(t[ix].numpy()) for t in (x, y, s))
        return RawPoints(list(idx), ["solved"] * len(idx), xs, ys, ss, [0] * len(idx))

    return Attempt("warm", run, 0.0)
