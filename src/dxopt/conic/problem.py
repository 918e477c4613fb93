"""Validation and layout of a batch of cone programs
:math:`\\min \\tfrac12 x^\\top P x + q^\\top x` s.t. :math:`Ax + s = b`, :math:`s \\in K`.

:func:`conic_problem` checks the user's tensors once (shapes, batch sizes, dtypes, devices,
finiteness, symmetry and semidefiniteness of ``P``, the cones against the rows of ``A``) and
returns a :class:`ConicProblem`: float64 CPU tensors with a leading batch axis (``P`` and ``A``
keep a batch axis of 1 where they are shared), the cone slices and what the caller needs to
give the outputs back in the input's dtype, device and shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone

__all__ = ["ConicProblem", "check_cones", "conic_problem"]


@dataclass(frozen=True)
class ConicProblem:
    """A checked batch (float64, CPU, leading batch axis; ``P``/``A`` of batch 1 if shared)."""

    P: Tensor  # (BP, n, n), symmetric
    q: Tensor  # (B, n)
    A: Tensor  # (BA, m, n)
    b: Tensor  # (B, m)
    cones: tuple[Cone, ...]
    slices: tuple[slice, ...]
    batched: bool
    dtype: torch.dtype
    device: torch.device
    P_given: bool

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def n(self) -> int:
        return self.q.shape[1]

    @property
    def m(self) -> int:
        return self.b.shape[1]

    @property
    def shared(self) -> bool:
        """Whether ``P`` and ``A`` are the same for every sample."""
        return self.P.shape[0] == 1 and self.A.shape[0] == 1


def _tensor(name: str, value: object, ndims: tuple[int, int], what: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{name}: expected a torch.Tensor ({what}), got {type(value).__name__}; "
            "wrap it with torch.as_tensor(..., dtype=torch.float64)"
        )
    if value.layout != torch.strided:
        raise TypeError(
            f"{name}: expected a dense (strided) tensor, got layout {value.layout}; "
            "pass it as .to_dense()"
        )
    if value.ndim not in ndims:
        raise ValueError(
            f"{name}: expected {what}, i.e. a tensor with {ndims[0]} or {ndims[1]} dimensions, "
            f"got shape {tuple(value.shape)}"
        )
    if not value.dtype.is_floating_point or value.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"{name}: expected dtype float32 or float64, got {value.dtype}; cast it with "
            ".double() or .float()"
        )
    return value


def check_cones(cones: object, m: int) -> tuple[Cone, ...]:
    """``cones`` checked against the ``m`` rows (a non-empty sequence of cones whose
    dimensions add up to ``m``), as a tuple; shared with the sparse route."""
    if isinstance(cones, Cone):
        cones = (cones,)
    if not isinstance(cones, Sequence) or not cones:
        raise TypeError(
            "cones: expected a non-empty sequence of dxopt.conic cones (e.g. "
            f"[ZeroCone(2), NonnegCone(3), SecondOrderCone(4)]), got {cones!r}"
        )
    for i, cone in enumerate(cones):
        if not isinstance(cone, Cone):
            raise TypeError(
                f"cones[{i}]: expected a dxopt.conic cone (ZeroCone, NonnegCone, "
                f"SecondOrderCone, PSDCone, ...), got {type(cone).__name__}"
            )
    total = sum(cone.dim for cone in cones)
    if total != m:
        dims = " + ".join(str(cone.dim) for cone in cones)
        raise ValueError(
            f"cones: their dimensions add up to {dims} = {total}, but A and b have m = {m} "
            "rows; the cones must cover the rows of A in order"
        )
    return tuple(cones)


def conic_problem(
    P: Tensor | None, q: Tensor, A: Tensor, b: Tensor, cones: object, *, check_psd: bool
) -> ConicProblem:
    """Check the inputs of :func:`dxopt.conic.solve` and lay them out (see the module doc).

    Raises:
        TypeError: non-tensors, sparse layouts, integer dtypes, non-cone entries in ``cones``.
        ValueError: wrong shapes, inconsistent batch sizes, mixed dtypes or devices, NaN or
            infinity, a non-symmetric or indefinite ``P``, cone dimensions that do not add up
            to ``m``.
    """
    q = _tensor("q", q, (1, 2), "(n,) or (B, n)")
    A = _tensor("A", A, (2, 3), "(m, n) or (B, m, n)")
    b = _tensor("b", b, (1, 2), "(m,) or (B, m)")
    named = {"q": q, "A": A, "b": b}
    if P is not None:
        named = {"P": _tensor("P", P, (2, 3), "(n, n) or (B, n, n)"), **named}
    dtypes = {name: t.dtype for name, t in named.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in dtypes.items())
        raise ValueError(
            f"P, q, A, b: expected one dtype, got mixed dtypes ({listed}); cast them all "
            "with .double() (or .float())"
        )
    devices = {name: t.device for name, t in named.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in devices.items())
        raise ValueError(f"P, q, A, b: expected one device, got {listed}; move them with .to()")
    n = q.shape[-1]
    m = b.shape[-1]
    if A.shape[-1] != n:
        raise ValueError(f"A: expected {n} columns (the length of q), got shape {tuple(A.shape)}")
    if A.shape[-2] != m:
        raise ValueError(f"A: expected {m} rows (the length of b), got shape {tuple(A.shape)}")
    if P is not None and tuple(P.shape[-2:]) != (n, n):
        raise ValueError(f"P: expected shape ({n}, {n}) (n = len(q)), got {tuple(P.shape)}")
    batches = {
        name: t.shape[0]
        for name, t in named.items()
        if t.ndim == (1 if name in ("q", "b") else 2) + 1
    }
    if len(set(batches.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in batches.items())
        raise ValueError(
            f"P, q, A, b: the batched inputs disagree on the batch size ({listed}); give every "
            "batched input the same leading dimension B (shared inputs have no batch axis)"
        )
    batched = bool(batches)
    B = next(iter(batches.values())) if batched else 1
    if B == 0:
        raise ValueError("P, q, A, b: the batch is empty (B = 0)")
    for name, t in named.items():
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name}: expected finite values, got NaN or infinity")
    cone_list = check_cones(cones, m)
    f64: dict[str, Any] = {"dtype": torch.float64, "device": "cpu"}
    q64 = q.detach().to(**f64).reshape(-1, n).expand(B, n)
    b64 = b.detach().to(**f64).reshape(-1, m).expand(B, m)
    A64 = A.detach().to(**f64).reshape(-1, m, n)
    if P is None:
        P64 = torch.zeros(1, n, n, **f64)
    else:
        P64 = P.detach().to(**f64).reshape(-1, n, n)
        _check_symmetric_psd(P64, check_psd)
        P64 = 0.5 * (P64 + P64.transpose(-1, -2))
    slices, start = [], 0
    for cone in cone_list:
        slices.append(slice(start, start + cone.dim))
        start += cone.dim
    return ConicProblem(
        P=P64,
        q=q64.contiguous(),
        A=A64,
        b=b64.contiguous(),
        cones=cone_list,
        slices=tuple(slices),
        batched=batched,
        dtype=q.dtype,
        device=q.device,
        P_given=P is not None,
    )


def _check_symmetric_psd(P: Tensor, check_psd: bool) -> None:
    """``P`` symmetric to round-off (relative to its largest entry) and, with ``check_psd``,
    without an eigenvalue below ``-n * 1e-12`` times the largest magnitude."""
    n = P.shape[-1]
    big = P.abs().amax(dim=(-2, -1))
    asym = (P - P.transpose(-1, -2)).abs().amax(dim=(-2, -1))
    bad = asym > 64 * torch.finfo(torch.float64).eps * big
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"P: expected a symmetric matrix, got max |P - P'| = {float(asym[i]):.3g} "
            f"(largest entry {float(big[i]):.3g}) at batch index {i}; pass (P + P.mT) / 2"
        )
    if check_psd:
        lam = torch.linalg.eigvalsh(0.5 * (P + P.transpose(-1, -2)))
        floor = -n * 1e-12 * lam.abs().amax(dim=-1)
        low = lam[..., 0] < floor
        if bool(low.any()):
            i = int(low.nonzero()[0, 0])
            raise ValueError(
                f"P: expected a positive semidefinite matrix, got smallest eigenvalue "
                f"{float(lam[i, 0]):.3g} at batch index {i}; the objective must be convex "
                "(or pass check_psd=False if P is PSD up to round-off you trust)"
            )
