"""The Jacobian's and the LU storage's host memory (:func:`dxopt.conic.kkt.host_empty`): a
large batch reuses the memory of a Jacobian nobody holds any more (no fresh pages to fault
in), never memory still in use, and the matrix is the same either way."""

from __future__ import annotations

import torch

from dxopt.conic.cones.exp import ExpCone
from dxopt.conic.cones.nonneg import NonnegCone
from dxopt.conic.kkt import cone_jacobian, jacobian

F64 = torch.float64


def _data(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    k, n = 48, 30
    cones = (NonnegCone(12), *(ExpCone() for _ in range(16)))
    m = 12 + 3 * 16
    P = torch.eye(n, dtype=F64)[None]
    A = torch.randn(k, m, n, generator=g, dtype=F64)
    w = torch.randn(k, m, generator=g, dtype=F64)
    return P, A, w, cones  # type: ignore[return-value]


def _slices(cones: tuple) -> tuple[slice, ...]:  # type: ignore[type-arg]
    out, s = [], 0
    for c in cones:
        out.append(slice(s, s + c.dim))
        s += c.dim
    return tuple(out)


def test_a_large_jacobian_reuses_memory_no_one_holds() -> None:
    P, A, w, cones = _data(0)
    sl = _slices(cones)
    D = cone_jacobian(cones, sl, w)
    n, m = P.shape[-1], D.shape[-1]
    ref = torch.cat(
        [
            torch.cat([P.expand(A.shape[0], n, n), A.transpose(-1, -2) @ D], -1),
            torch.cat([A, D - torch.eye(m, dtype=F64)], -1),
        ],
        -2,
    )
    assert ref.numel() * 8 >= 1 << 20  # large enough for the pool
    J1 = jacobian(P, A, D, cones=cones, slices=sl)
    torch.testing.assert_close(J1, ref, atol=1e-14, rtol=0)
    ptr = J1.data_ptr()
    J2 = jacobian(P, A, D, cones=cones, slices=sl)
    assert J2.data_ptr() != ptr  # J1 is still held: not handed out twice
    del J1
    J3 = jacobian(P, A, D, cones=cones, slices=sl)
    assert J3.data_ptr() == ptr  # J1's memory, now unreferenced
    assert torch.equal(J3, J2)
