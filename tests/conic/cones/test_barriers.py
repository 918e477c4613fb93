"""Each cone's log-barrier gradient and Hessian against autodiff of the barrier itself."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import grad, hessian

import dxopt.conic as dc

F64 = torch.float64


def _psd_points(k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(3, k, k, generator=gen, dtype=F64)
    return dc.svec(M @ M.mT + 0.5 * torch.eye(k, dtype=F64))


CASES = [
    (dc.NonnegCone(3), torch.tensor([[0.5, 2.0, 1e-3], [1.0, 1.0, 3.0]], dtype=F64),
     lambda s: -torch.log(s).sum()),
    (dc.SecondOrderCone(4), torch.tensor([[2.0, 0.3, -0.5, 1.0], [1.0, 0.2, 0.1, 0.9]], dtype=F64),
     lambda s: -torch.log(s[0] ** 2 - (s[1:] ** 2).sum())),
    (dc.PSDCone(3), _psd_points(3), lambda v: -torch.logdet(dc.smat(v, 3))),
    (dc.ExpCone(), torch.tensor([[-1.0, 1.0, 1.0], [0.3, 2.0, 5.0], [-4.0, 0.5, 1e-2]], dtype=F64),
     lambda v: -torch.log(v[1] * torch.log(v[2] / v[1]) - v[0]) - torch.log(v[1] * v[2])),
]  # fmt: skip


@pytest.mark.parametrize(("cone", "points", "F"), CASES, ids=lambda c: type(c).__name__)
def test_barrier_gradient_and_hessian_are_those_of_the_barrier(cone, points, F):
    g, H, inside = cone.barrier(points)
    assert bool(inside.all())
    for i in range(points.shape[0]):
        ref_g, ref_H = grad(F)(points[i]), hessian(F)(points[i])
        scale = float(ref_H.abs().max())
        torch.testing.assert_close(g[i], ref_g, rtol=1e-12, atol=1e-12 * scale)
        torch.testing.assert_close(H[i], ref_H, rtol=1e-12, atol=1e-12 * scale)
    center = cone.barrier_center()
    assert bool(cone.barrier(center[None])[2].all())


def test_points_outside_are_flagged():
    assert not bool(dc.NonnegCone(2).barrier(torch.tensor([[1.0, 0.0]], dtype=F64))[2])
    assert not bool(dc.SecondOrderCone(3).barrier(torch.tensor([[1.0, 1.0, 0.0]], dtype=F64))[2])
    bad = dc.svec(torch.diag(torch.tensor([1.0, -1.0], dtype=F64)))[None]
    assert not bool(dc.PSDCone(2).barrier(bad)[2])
    assert not bool(dc.ExpCone().barrier(torch.tensor([[1.0, 1.0, math.e]], dtype=F64))[2])
