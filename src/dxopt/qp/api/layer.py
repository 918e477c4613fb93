""":class:`QPLayer`, the ``nn.Module`` face of :func:`dxopt.qp.solve`: it holds one checked
:class:`dxopt.qp.problem.options.QPOptions` and solves with it."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from dxopt._core import positional_refused
from dxopt.qp.api.solve import ORDER_NOTE, solve_with
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPSolution

__all__ = ["QPLayer"]


class QPLayer(nn.Module):
    """A differentiable QP layer: ``layer(P, q, A=A, b=b, G=G, h=h) -> QPSolution``.

    Every argument after ``q`` is keyword-only (as in :func:`dxopt.qp.solve`; positional use
    raises a ``TypeError`` saying to pass ``A=, b=, G=, h=`` by keyword).

    ``QPLayer(**options)`` takes the keyword options of :func:`dxopt.qp.solve` (its signature
    is :class:`~dxopt.qp.problem.options.QPOptions`'s fields, the one place they are written)
    and holds only this configuration, checked once, so it is picklable and safe under
    ``DistributedDataParallel``.

    ``warm_start=`` takes a primal guess or the layer's previous :class:`QPSolution` (as in
    :func:`dxopt.qp.solve`: daqp starts from that solution's active set, a failed warm start
    is retried cold, the certificate is unchanged).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.qp_options = QPOptions.from_keywords(options, where="QPLayer")

    @property
    def options(self) -> dict[str, Any]:
        """The options as the keyword arguments of :func:`dxopt.qp.solve`."""
        return self.qp_options.as_keywords()

    __init__.__signature__ = QPOptions.keyword_signature(self_parameter=True)  # type: ignore[attr-defined]

    @positional_refused("A", "b", "G", "h", leading=3, note=ORDER_NOTE)
    def forward(
        self,
        P: Tensor,
        q: Tensor,
        *,
        A: Tensor | None = None,
        b: Tensor | None = None,
        G: Tensor | None = None,
        h: Tensor | None = None,
        lb: Tensor | None = None,
        ub: Tensor | None = None,
        warm_start: Tensor | QPSolution | None = None,
    ) -> QPSolution:
        return solve_with(P, q, A, b, G, h, lb, ub, warm_start, self.qp_options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v is not None)
