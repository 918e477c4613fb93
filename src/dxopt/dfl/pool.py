"""A solution pool (cache) for decision-focused learning (Mulamba et al., IJCAI 2021,
"Contrastive losses and solution caching for predict-and-optimize").

The pool :math:`\\Gamma` is a set of feasible solutions seen so far (seeded with the training
set's optimal solutions). With ``solve_ratio`` :math:`p < 1`, a loss calls the true oracle on
a batch with probability :math:`p` (and adds the answers to the pool) and otherwise answers
:math:`\\arg\\min_{x \\in \\Gamma} c^\\top x`, one matrix product for the whole batch.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt._core import Cost, check_choice, check_range, check_tensor

__all__ = ["PoolSolver", "SolutionPool"]


class SolutionPool:
    """A de-duplicated set of feasible solutions (rows of :attr:`solutions`, float64, CPU).

    Args:
        solutions: optional ``(K, d)`` initial solutions (e.g. the training set's optima).
        sense: ``"min"`` or ``"max"`` (the oracle's), used by :meth:`best`.
        dim: the dimension, when no ``solutions`` are given.
    """

    def __init__(
        self, solutions: Tensor | None = None, *, sense: str = "min", dim: int | None = None
    ) -> None:
        self.sense = check_choice("sense", sense, ("min", "max"))
        if solutions is None:
            if dim is None:
                raise ValueError("dim: give the dimension when the pool starts empty.")
            self.solutions = torch.zeros(0, dim, dtype=torch.float64)
        else:
            check_tensor("solutions", solutions, ndim=2)
            self.solutions = torch.unique(solutions.detach().to("cpu", torch.float64), dim=0)
        self._cache: dict[tuple[torch.dtype, torch.device], Tensor] = {}

    @property
    def dim(self) -> int:
        return int(self.solutions.shape[1])

    def __len__(self) -> int:
        return int(self.solutions.shape[0])

    def add(self, x: Tensor) -> int:
        """Add solutions ``(d,)`` or ``(B, d)``; returns the number of new ones."""
        check_tensor("x", x)
        x = x.detach().reshape(-1, self.dim).to("cpu", torch.float64)
        before = len(self)
        self.solutions = torch.unique(torch.cat([self.solutions, x]), dim=0)
        self._cache.clear()
        return len(self) - before

    def as_tensor(self, like: Tensor) -> Tensor:
        """The solutions in ``like``'s dtype and device (cached until the next :meth:`add`)."""
        key = (like.dtype, like.device)
        if key not in self._cache:
            self._cache[key] = self.solutions.to(like.device, like.dtype)
        return self._cache[key]

    def best(self, c: Tensor) -> Tensor:
        """:math:`\\arg\\min_{x \\in \\Gamma} c^\\top x` (``argmax`` for ``"max"``) for each row of
        ``c`` ``(B, d)`` or ``(d,)``, in one matrix product."""
        if len(self) == 0:
            raise ValueError("SolutionPool.best: the pool is empty; add solutions first.")
        pool = self.as_tensor(c)
        scores = c.detach() @ pool.T
        idx = scores.argmin(-1) if self.sense == "min" else scores.argmax(-1)
        return pool[idx]


class PoolSolver:
    """Answers a batch with the oracle with probability ``solve_ratio`` (adding its answers to
    ``pool``), else with ``pool.best``; records the oracle's cost.

    One Bernoulli draw per batch from ``numpy.random.default_rng(seed)`` (the papers' scheme).
    """

    def __init__(
        self, oracle: Any, pool: SolutionPool | None, *, solve_ratio: float = 1.0, seed: int = 0
    ) -> None:
        self.oracle = oracle
        self.solve_ratio = check_range("solve_ratio", solve_ratio, 0.0, 1.0, closed=(True, True))
        if pool is None and self.solve_ratio < 1.0:
            raise ValueError(
                f"pool: solve_ratio={solve_ratio} < 1 needs a SolutionPool (seed it with the "
                "training solutions: SolutionPool(x_train, sense=oracle.sense))."
            )
        if pool is not None and pool.sense != oracle.sense:
            raise ValueError(
                f"pool: its sense {pool.sense!r} differs from the oracle's {oracle.sense!r}."
            )
        self.pool = pool
        self.rng = np.random.default_rng(seed)
        self._solved, self._seconds = 0, 0.0

    @property
    def cost(self) -> Cost:
        """Oracle calls made through this solver (``forwards``) and their seconds."""
        return Cost(forwards=self._solved, seconds=self._seconds)

    def __call__(self, c: Tensor, *, force: bool = False) -> Tensor:
        if force or self.solve_ratio >= 1.0 or self.rng.uniform() < self.solve_ratio:
            start = time.perf_counter()
            x = self.oracle(c)
            self._solved += 1 if c.ndim == 1 else int(c.shape[0])
            self._seconds += time.perf_counter() - start
            if self.pool is not None:
                self.pool.add(x)
            return x
        assert self.pool is not None  # guaranteed by __init__
        return self.pool.best(c)
