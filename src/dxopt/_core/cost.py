"""One cost record for every dxopt computation.

Estimators count passes (``forwards``, ``backwards``, ``jvps``), bilevel methods count oracle
calls (``grad_f``, ``grad_g``, ``hvps``, ``jvps``), natgrad counts Jacobian ``rows``, and
everything can report ``seconds`` and ``flops``. Records add up with ``+``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["Cost"]


@dataclass(frozen=True, kw_only=True)
class Cost:
    """What a computation cost; fields a module does not use stay 0 (keyword-only; the repr
    shows only the nonzero fields).

    Attributes:
        forwards: plain forward passes.
        backwards: backward passes (reverse sweeps).
        jvps: forward-mode passes or Jacobian-vector products, each carrying one tangent
            (bilevel: mixed products :math:`\\nabla^2_{xy} g\\, v`).
        hvps: Hessian-vector products.
        grad_f, grad_g: upper- and lower-level gradient oracle calls (bilevel).
        rows: residual rows differentiated (natural gradient Jacobians).
        recomputed_forwards: forward work redone by activation checkpointing, in units of
            one full forward.
        flops: FLOPs counted by :class:`torch.utils.flop_counter.FlopCounterMode`
            (``None`` when not counted).
        seconds: wall-clock seconds (0.0 when not timed; left out of ``==`` and the repr, so
            records of the same work compare and print equal).
    """

    forwards: int = 0
    backwards: int = 0
    grad_f: int = 0
    grad_g: int = 0
    hvps: int = 0
    jvps: int = 0
    rows: int = 0
    recomputed_forwards: float = 0.0
    flops: int | None = None
    seconds: float = field(default=0.0, compare=False)

    @property
    def oracle_calls(self) -> int:
        """Bilevel oracle calls: ``grad_f + grad_g + hvps + jvps``."""
        return self.grad_f + self.grad_g + self.hvps + self.jvps

    @property
    def total(self) -> int:
        """Every counted pass or call once (for bilevel, equal to :attr:`oracle_calls`)."""
        return self.forwards + self.backwards + self.oracle_calls

    # names of dxopt.bilevel.OracleCounts before 0.2
    @property
    def hvp(self) -> int:
        return self.hvps

    @property
    def jvp(self) -> int:
        return self.jvps

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        values: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "flops":
                values[f.name] = None if a is None and b is None else (a or 0) + (b or 0)
            else:
                values[f.name] = a + b
        return Cost(**values)

    def __radd__(self, other: object) -> Cost:
        if other == 0:  # so that sum(costs) works
            return self
        return NotImplemented

    def __repr__(self) -> str:
        shown = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.compare and getattr(self, f.name) not in (0, 0.0, None)
        ]
        return f"Cost({', '.join(shown)})"
