"""The records the lean forwards hand to their backward: :class:`SmallPoint` (one small
problem, :func:`dxopt.qp.lean.small.small_forward`) and :class:`SmallBatch` (a batch,
:func:`dxopt.qp.lean.small_batch.small_batch_forward`). Data only: their gradients are
:func:`dxopt.qp.lean.small.point_gradients` and
:func:`dxopt.qp.lean.small_batch.small_batch_backward`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import BackwardDiagnostics

__all__ = ["SmallBatch", "SmallPoint"]


@dataclass(slots=True)
class SmallPoint:
    """The certified solution of one small QP and what its backward needs: float64 copies of
    the data (the inputs may change in place after the call) in daqp's layout (``C = [G; A]``,
    ``upper = [h; b]``, the first ``m = len(g_inf)`` rows inequalities; ``G, h, A, b`` are
    views of them, ``None`` without rows), the point ``x`` with the multipliers
    ``duals = [nu; mu]`` and the active set ``working`` (no entries: daqp's working set, read
    off the multipliers), and the certificate's residuals; ``given``: whether ``A`` and ``G``
    were given (their gradients, empty without rows, or ``None``); the call's ``options`` and
    ``solver``, with which the backward rebuilds the general path's state where it declines
    (:func:`dxopt.qp.autograd.state.rebuilt_state`)."""

    P: np.ndarray
    q: np.ndarray
    C: np.ndarray
    upper: np.ndarray
    x: np.ndarray
    duals: np.ndarray
    working: np.ndarray
    g_inf: np.ndarray
    dtype: torch.dtype
    options: QPOptions
    solver: str
    given: tuple[bool, bool] = (False, False)  # A, G given (perhaps without rows): gradients
    warm_start: Any = None  # the backend's primal start (float64), for the general path
    polished: bool = False
    diagnostics: BackwardDiagnostics = field(default_factory=BackwardDiagnostics)
    solve_time: float = 0.0
    primal: float = 0.0
    dual: float = 0.0
    outputs: Any = None  # copies of (x, mu, nu) for the caller (theirs to change)
    iterations: int = 0  # the solver's working-set changes (daqp's count)
    warm_used: bool = False  # whether the answer is the warm start's

    @property
    def G(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.C[:m] if m else None

    @property
    def h(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.upper[:m] if m else None

    @property
    def A(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.C[m:] if self.C.shape[0] > m else None

    @property
    def b(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.upper[m:] if self.C.shape[0] > m else None


@dataclass
class SmallBatch:
    """The certified solutions of a batch and what its backward needs: float64 copies of the
    data in daqp's layout (``C = [G; A]``, ``upper = [h; b]``, a leading batch axis), daqp's
    points ``X`` and multipliers ``duals``, which inputs were shared (their gradients are
    summed), and the call's ``eps_abs``, with which the backward builds the general path's
    state for the samples it declines."""

    P: np.ndarray
    q: np.ndarray
    C: np.ndarray
    upper: np.ndarray
    m: int
    X: np.ndarray
    duals: np.ndarray
    g_inf: np.ndarray
    shared: tuple[bool, ...]
    empty: tuple[bool, bool]
    dtype: torch.dtype
    eps_abs: float
    diagnostics: BackwardDiagnostics = field(default_factory=BackwardDiagnostics)
    solve_time: float = 0.0
    primal: tuple[float, ...] = ()
    dual: tuple[float, ...] = ()
    outputs: Any = None  # copies of (X, MU, NU) for the caller
    solvers: tuple[str, ...] = ()  # each sample's solver
    L_given: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    Y_given: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    given: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    order_given: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    LW_given: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    accuracy_given: np.ndarray = field(default_factory=lambda: np.zeros(0))
    iterations: tuple[int, ...] = ()  # each sample's working-set changes (its solver's count)
    warm_used: tuple[bool, ...] = ()  # whether each sample's answer is its warm start's

    def arrays(self, samples: np.ndarray) -> tuple[Any, ...]:
        """``(P, q, A, b, G, h)`` of ``samples`` as the caller gave them (shared ones without
        the batch axis, absent ones ``None``), from the copies."""
        m, p = self.m, self.C.shape[1] - self.m
        full = (self.P, self.q, self.C[:, m:], self.upper[:, m:], self.C[:, :m], self.upper[:, :m])
        present = (True, True, p > 0 or self.empty[0], p > 0 or self.empty[0],
                   m > 0 or self.empty[1], m > 0 or self.empty[1])  # fmt: skip
        every = samples.size == self.q.shape[0]  # the whole batch, in order: views
        return tuple(
            (a[0] if shared else a if every else a[samples]) if given else None
            for a, shared, given in zip(full, self.shared, present)
        )
