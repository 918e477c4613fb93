"""The protocol every cone of :mod:`dxopt.conic` implements: one file per cone.

A cone program is ``min 1/2 x'Px + q'x  s.t.  Ax + s = b,  s in K`` with ``K`` a product of
cones; each factor owns a contiguous slice of ``s`` (and of the dual ``y``). A cone class
answers, for a batch of vectors ``v`` of shape ``(..., dim)`` (torch, float32 or float64):

- :meth:`Cone.project`: the Euclidean projection :math:`\\Pi_K(v)`;
- :meth:`Cone.project_dual`: :math:`\\Pi_{K^*}(v)`, by Moreau's decomposition
  :math:`v = \\Pi_{K^*}(v) - \\Pi_K(-v)` unless the cone is self-dual;
- :meth:`Cone.dproject` / :meth:`Cone.dproject_dual`: the Jacobians ``(..., dim, dim)`` of
  the two projections (where a projection is not differentiable, the derivative of one
  defined side; :meth:`Cone.kink` says where that happens);
- :meth:`Cone.dist` / :meth:`Cone.dist_dual`: :math:`\\Vert v - \\Pi(v)\\Vert` (membership
  checks of the certificate);
- :meth:`Cone.kink`: ``True`` where ``v`` is within ``tol`` (relative to ``|v|``, or to
  ``scale`` where given) of a point where :math:`\\Pi_{K^*}` is not differentiable (an apex, a
  face with a zero multiplier); ``tol`` is a float or a tensor of shape ``v.shape[:-1]``;
- :meth:`Cone.dproject_dual_snapped`: the Jacobian of :math:`\\Pi_{K^*}` with the points that
  :meth:`Cone.kink` flags moved onto one defined side (the engine's one-sided rule: each cone
  documents its side; the default is the plain Jacobian);
- :meth:`Cone.scs_perm`: where SCS stores this cone's entries in a different order (the PSD
  triangle), the permutation ``p`` with ``v_scs = v[p]``;
- :meth:`Cone.barrier` / :meth:`Cone.barrier_center`: the gradient and Hessian of the cone's
  logarithmic barrier :math:`F` at an interior point and one interior point (the smoothed
  backward, :mod:`dxopt.conic.smoothed`; a cone without them is refused there).

The defaults below derive the dual side from the primal one; a self-dual cone sets
``self_dual = True`` and implements only the primal side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor


@dataclass(frozen=True)
class Cone:
    """One cone factor of dimension :attr:`dim` (subclasses are frozen dataclasses)."""

    name: ClassVar[str] = "cone"
    self_dual: ClassVar[bool] = False

    @property
    def dim(self) -> int:
        """The length of this cone's slice of ``s`` and ``y``."""
        raise NotImplementedError

    def project(self, v: Tensor) -> Tensor:
        """:math:`\\Pi_K(v)` for ``v`` of shape ``(..., dim)``."""
        raise NotImplementedError

    def dproject(self, v: Tensor) -> Tensor:
        """The Jacobian of :math:`\\Pi_K` at ``v``: shape ``(..., dim, dim)``."""
        raise NotImplementedError

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        """``True`` where :math:`\\Pi_K` is within ``tol`` of a non-differentiable point."""
        raise NotImplementedError

    def clarabel(self) -> object:
        """This cone as one Clarabel cone object (``clarabel.ExponentialConeT()``, ...)."""
        raise NotImplementedError

    def scs(self) -> tuple[str, float | int]:
        """This cone's SCS cone-dictionary key and entry (``("ep", 1)``, ``("p", alpha)``, ...).

        SCS wants the blocks of ``A`` in its fixed order ``z, l, q, s, ep, ed, p``; the engine
        permutes rows, a cone only names its key.
        """
        raise NotImplementedError

    def project_dual(self, v: Tensor) -> Tensor:
        """:math:`\\Pi_{K^*}(v) = v + \\Pi_K(-v)` (Moreau)."""
        if self.self_dual:
            return self.project(v)
        return v + self.project(-v)

    def dproject_dual(self, v: Tensor) -> Tensor:
        """The Jacobian of :math:`\\Pi_{K^*}` at ``v``: :math:`I - D\\Pi_K(-v)`."""
        if self.self_dual:
            return self.dproject(v)
        eye = torch.eye(self.dim, dtype=v.dtype, device=v.device)
        return eye - self.dproject(-v)

    def kink(self, v: Tensor, tol: float | Tensor, *, scale: Tensor | None = None) -> Tensor:
        """``True`` where :math:`\\Pi_{K^*}` is within ``tol`` of a non-differentiable point.

        ``tol`` is relative to ``|v|``; with ``scale`` (shape ``v.shape[:-1]``) it is relative
        to ``scale`` instead (the engine passes the scale of the whole point, so that a cone
        slice of one tiny entry is not judged against itself)."""
        if scale is not None:
            norm = torch.linalg.vector_norm(v, dim=-1)
            eps, tiny = torch.finfo(v.dtype).eps, torch.finfo(v.dtype).tiny
            floor = torch.clamp(eps * scale, min=tiny)  # a slice below round-off: all kink
            tol = tol * scale / torch.maximum(norm, floor)
        return self.kink_primal(v if self.self_dual else -v, tol)

    def dproject_dual_snapped(self, v: Tensor, atol: Tensor) -> Tensor:
        """The Jacobian of :math:`\\Pi_{K^*}` at ``v`` with the kinks within ``atol`` (absolute,
        shape ``v.shape[:-1]``) resolved to this cone's documented side (default: the plain
        Jacobian :meth:`dproject_dual`)."""
        return self.dproject_dual(v)

    def barrier(self, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The barrier's gradient ``(..., dim)`` and Hessian ``(..., dim, dim)`` at ``v``, and
        a mask ``(...)`` of the points in the interior of ``K`` (elsewhere the first two are
        finite placeholders)."""
        raise NotImplementedError(f"{type(self).__name__} has no log-barrier in dxopt.conic")

    def barrier_center(self) -> Tensor:
        """A point of the interior of ``K`` (float64, ``(dim,)``)."""
        raise NotImplementedError(f"{type(self).__name__} has no log-barrier in dxopt.conic")

    def scs_perm(self) -> list[int] | None:
        """``p`` with ``v_scs = v[p]`` where SCS orders this cone's entries differently
        (``None``: the same order)."""
        return None

    def dist(self, v: Tensor) -> Tensor:
        """:math:`\\Vert v - \\Pi_K(v)\\Vert` over the last axis."""
        return torch.linalg.vector_norm(v - self.project(v), dim=-1)

    def dist_dual(self, v: Tensor) -> Tensor:
        """:math:`\\Vert v - \\Pi_{K^*}(v)\\Vert` over the last axis."""
        return torch.linalg.vector_norm(v - self.project_dual(v), dim=-1)
