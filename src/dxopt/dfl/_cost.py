"""The one cost bookkeeping of :mod:`dxopt.dfl`: every oracle, loss and layer keeps a
:class:`CostMeter` and shows it through :class:`Metered` (``cost``, ``calls``,
``reset_cost()``), so each reports a :class:`dxopt.Cost` the same way: ``forwards`` = cost
vectors solved (by the oracle, or by the layer's own solver), ``seconds`` = the time spent
solving, and ``calls`` = the batched calls that solved them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from dxopt._core import Cost

__all__ = ["CostMeter", "Metered"]


class CostMeter:
    """A running count of solved cost vectors, seconds and calls (plain numbers: adding to it
    costs no more than the counters it replaces; :attr:`cost` builds the record)."""

    __slots__ = ("calls", "forwards", "seconds")

    def __init__(self) -> None:
        self.forwards, self.seconds, self.calls = 0, 0.0, 0

    def add(self, forwards: int, seconds: float) -> None:
        """Record one call that solved ``forwards`` cost vectors in ``seconds``."""
        self.forwards += forwards
        self.seconds += seconds
        self.calls += 1

    @contextmanager
    def timed(self, forwards: int) -> Iterator[None]:
        """Record the block as one call solving ``forwards`` cost vectors (not when it
        raises: a failed solve is not counted)."""
        start = time.perf_counter()
        yield
        self.add(forwards, time.perf_counter() - start)

    @property
    def cost(self) -> Cost:
        """The :class:`dxopt.Cost` so far (``forwards``, ``seconds``)."""
        return Cost(forwards=self.forwards, seconds=self.seconds)

    def reset(self) -> Cost:
        """Return :attr:`cost` and start again from zero."""
        cost = self.cost
        self.forwards, self.seconds, self.calls = 0, 0.0, 0
        return cost


class Metered:
    """Mixin of the objects of :mod:`dxopt.dfl` that solve: ``cost``, ``calls`` and
    ``reset_cost()`` read the :class:`CostMeter` in ``self._meter``."""

    _meter: CostMeter

    @property
    def cost(self) -> Cost:
        """What solving cost so far: ``forwards`` = cost vectors solved, ``seconds``."""
        return self._meter.cost

    @property
    def calls(self) -> int:
        """The batched calls that solved them."""
        return self._meter.calls

    def reset_cost(self) -> Cost:
        """Return the cost so far and start a new record."""
        return self._meter.reset()
