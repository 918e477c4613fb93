"""A solution pool (cache) for decision-focused learning (Mulamba et al., IJCAI 2021,
"Contrastive losses and solution caching for predict-and-optimize").

The pool :math:`\\Gamma` is a set of feasible solutions seen so far (seeded with the training
set's optimal solutions). With ``solve_ratio`` :math:`p < 1`, a loss calls the true oracle on
a batch with probability :math:`p` (and adds the answers to the pool) and otherwise answers
:math:`\\arg\\min_{x \\in \\Gamma} c^\\top x`, one matrix product for the whole batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt._core import check_choice, check_int, check_range, check_tensor
from dxopt.dfl._cost import CostMeter, Metered

__all__ = ["PoolSolver", "SolutionPool"]


class SolutionPool:
    """A de-duplicated set of feasible solutions: the rows of :attr:`solutions` (float64, CPU),
    in the order they were first seen.

    Duplicates are found by a hash set of the rows' bytes (float64, with ``-0.0`` read as
    ``0.0``): equality is exact, as for the 0/1 answers of combinatorial oracles (an LP
    solver's ``1 - 1e-12`` is another row). :meth:`add` hashes only the new rows, ``O(B d)``,
    and copies the stored matrix only when one of them is new; the tensors of
    :meth:`as_tensor` are extended with the new rows, never re-converted or sorted.

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
            dim = check_int("dim", dim)
        else:
            check_tensor("solutions", solutions, ndim=2, finite=True)
            dim = int(solutions.shape[1])
        self._solutions = torch.zeros(0, dim, dtype=torch.float64)
        self._keys: set[bytes] = set()
        self._cache: dict[tuple[torch.dtype, torch.device], Tensor] = {}
        self._sum = torch.zeros(dim, dtype=torch.float64)
        self._means: dict[tuple[torch.dtype, torch.device], Tensor] = {}
        if solutions is not None:
            self.add(solutions)

    @property
    def solutions(self) -> Tensor:
        """The ``(K, d)`` float64 CPU solutions (do not modify in place)."""
        return self._solutions

    @property
    def dim(self) -> int:
        return int(self._solutions.shape[1])

    def __len__(self) -> int:
        return int(self._solutions.shape[0])

    def add(self, x: Tensor) -> int:
        """Add solutions ``(d,)`` or ``(B, d)`` (any dtype, any device); returns the number of
        new ones."""
        check_tensor("x", x, finite=True)
        if x.shape[-1:] != (self.dim,) or x.ndim not in (1, 2):
            raise ValueError(
                f"x: expected shape ({self.dim},) or (B, {self.dim}), got {tuple(x.shape)}."
            )
        rows = x.detach().reshape(-1, self.dim).to("cpu", torch.float64) + 0.0  # -0.0 -> 0.0
        flat = rows.numpy()
        fresh = []
        for i in range(flat.shape[0]):
            key = flat[i].tobytes()
            if key not in self._keys:
                self._keys.add(key)
                fresh.append(i)
        if fresh:
            new = rows[fresh]
            self._solutions = torch.cat([self._solutions, new])
            for (dtype, device), cached in self._cache.items():
                self._cache[dtype, device] = torch.cat([cached, new.to(device, dtype)])
            self._sum = self._sum + new.sum(0)
            self._means.clear()
        return len(fresh)

    def as_tensor(self, like: Tensor) -> Tensor:
        """The solutions in ``like``'s dtype and device (kept, and extended by :meth:`add`)."""
        key = (like.dtype, like.device)
        if key not in self._cache:
            self._cache[key] = self._solutions.to(like.device, like.dtype)
        return self._cache[key]

    def mean(self, like: Tensor) -> Tensor:
        """The mean solution :math:`\\bar w = \\frac{1}{|\\Gamma|}\\sum_{w \\in \\Gamma} w`
        ``(d,)`` in ``like``'s dtype and device (from a float64 running sum; kept until an
        :meth:`add` brings a new row)."""
        if len(self) == 0:
            raise ValueError("SolutionPool.mean: the pool is empty; add solutions first.")
        key = (like.dtype, like.device)
        if key not in self._means:
            self._means[key] = (self._sum / len(self)).to(like.device, like.dtype)
        return self._means[key]

    def best(self, c: Tensor) -> Tensor:
        """:math:`\\arg\\min_{x \\in \\Gamma} c^\\top x` (``argmax`` for ``"max"``; ties: the
        earliest solution) for each row of ``c`` ``(B, d)`` or ``(d,)``, in one matrix
        product."""
        if len(self) == 0:
            raise ValueError("SolutionPool.best: the pool is empty; add solutions first.")
        pool = self.as_tensor(c)
        scores = c.detach() @ pool.T
        idx = scores.argmin(-1) if self.sense == "min" else scores.argmax(-1)
        return pool[idx]


class PoolSolver(Metered):
    """Answers a batch with the oracle with probability ``solve_ratio`` (adding its answers to
    ``pool``), else with ``pool.best``; records the oracle's cost (``cost``, ``calls``:
    :class:`~dxopt.dfl._cost.Metered`; the pool's answers cost nothing).

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
        self._meter = CostMeter()
        #: whether the last call was answered by the oracle (False: by the pool)
        self.last_from_oracle = False

    def __call__(self, c: Tensor, *, force: bool = False) -> Tensor:
        if force or self.solve_ratio >= 1.0 or self.rng.uniform() < self.solve_ratio:
            with self._meter.timed(1 if c.ndim == 1 else int(c.shape[0])):
                x = self.oracle(c)
            if self.pool is not None:
                self.pool.add(x)
            self.last_from_oracle = True
            return x
        assert self.pool is not None  # guaranteed by __init__
        self.last_from_oracle = False
        return self.pool.best(c)
