"""Compile (or load from numba's disk cache) every compiled kernel of the QP paths, once.

The lean paths of :mod:`dxopt.qp.lean.small` / :mod:`dxopt.qp.lean.small_batch` and the compiled
dual active-set solver (:mod:`dxopt.qp.solvers.dual_active_set`) run numba kernels
(:mod:`dxopt.qp.solvers.kernels`, :mod:`dxopt.linalg.small`). numba compiles a kernel at its
first call for each argument signature and, with ``cache=True``, writes the machine code to its
cache (``__pycache__`` next to the module, or ``$NUMBA_CACHE_DIR``); a later process loads it
from there instead of compiling. :func:`warmup` makes those first calls up front, on tiny
problems that walk every lean route (one problem and a batch; with and without equality and
inequality rows and bounds; penalty and KKT backward; float64 and float32; one problem with
n > 64 through the compiled solver), so the first call of a user's model does not pay for it.

Measured (``tests/qp/test_warmup.py`` prints it; 1 thread, the shared 2-core machine): see the
README's "First call" paragraph.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["WarmupReport", "compiled_kernels", "warmup"]

_KERNEL_MODULES = (
    "dxopt.linalg.small",
    "dxopt.qp.solvers.kernels.certify",
    "dxopt.qp.solvers.kernels.adjoint",
    "dxopt.qp.solvers.kernels.batch",
    "dxopt.qp.solvers.dual_active_set",
    "dxopt.qp.lean.fused",
)


@dataclass(frozen=True)
class WarmupReport:
    """What :func:`warmup` did.

    Attributes:
        seconds: wall time of the warm-up (compiling, or loading from the disk cache).
        calls: the solves it ran, one line each.
        kernels: the compiled kernels (``module.function``) with their number of signatures.
        cache_dir: where numba keeps the compiled code (``$NUMBA_CACHE_DIR`` if set, else the
            ``__pycache__`` folders next to the modules).
    """

    seconds: float
    calls: tuple[str, ...]
    kernels: dict[str, int]
    cache_dir: str

    @property
    def signatures(self) -> int:
        """Compiled signatures over all kernels."""
        return sum(self.kernels.values())


def compiled_kernels() -> dict[str, int]:
    """``module.function -> number of compiled signatures`` of every numba kernel of the QP
    paths (imports the modules; compiles nothing)."""
    from importlib import import_module

    from numba.core.registry import CPUDispatcher

    out: dict[str, int] = {}
    for name in _KERNEL_MODULES:
        module = import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher):
                out[f"{name}.{attr}"] = len(value.signatures)
    return out


def _problems(dtype: torch.dtype, batch: int | None, n: int) -> dict[str, torch.Tensor]:
    """A tiny strictly convex QP with 3 inequality rows and 1 equality row (batched when
    ``batch``), x = 0 strictly feasible."""
    g = torch.Generator().manual_seed(n)
    shape = () if batch is None else (batch,)
    M = torch.randn(*shape, n, n, generator=g, dtype=torch.float64)
    P = M @ M.transpose(-1, -2) + torch.eye(n, dtype=torch.float64)
    out = {
        "P": P,
        "q": torch.randn(*shape, n, generator=g, dtype=torch.float64),
        "A": torch.randn(1, n, generator=g, dtype=torch.float64),
        "b": torch.zeros(1, dtype=torch.float64),
        "G": torch.randn(3, n, generator=g, dtype=torch.float64),
        "h": torch.ones(3, dtype=torch.float64),
    }
    return {k: v.to(dtype) for k, v in out.items()}


def _run(data: dict[str, Any], **options: Any) -> None:
    from dxopt.qp.api.solve import solve

    leaves = {k: v.clone().requires_grad_() for k, v in data.items()}
    sol = solve(leaves.pop("P"), leaves.pop("q"), **leaves, **options)
    loss = sol.x.sum() + (0.0 if sol.ineq_duals is None else sol.ineq_duals.sum())
    loss.backward()


def _cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for dtype in (torch.float64, torch.float32):
        tag = "float64" if dtype == torch.float64 else "float32"
        for backward in ("penalty", "kkt"):
            one = _problems(dtype, None, 4)
            batch = _problems(dtype, 3, 4)
            cases.append((f"one n=4 {tag} {backward}", one, {"backward": backward}))
            cases.append((f"batch 3 x n=4 {tag} {backward}", batch, {"backward": backward}))
            cases.append(
                (f"batch 3 x n=4 daqp {tag} {backward}", batch, {"backward": backward,
                 "solver": "daqp"})
            )  # fmt: skip
        one = _problems(dtype, None, 4)
        cases.append((f"one n=4 inequalities only {tag}", {k: one[k] for k in "PqGh"}, {}))
        cases.append((f"one n=4 equalities only {tag}", {k: one[k] for k in "PqAb"}, {}))
        box = {k: one[k] for k in "Pq"} | {"lb": -torch.ones(4, dtype=dtype)}
        cases.append((f"one n=4 bounds only {tag}", box | {"ub": torch.ones(4, dtype=dtype)}, {}))
        batch = _problems(dtype, 3, 4)
        cases.append((f"batch 3 x n=4 inequalities only {tag}", {k: batch[k] for k in "PqGh"}, {}))
        cases.append((f"batch 3 x n=4 equalities only {tag}", {k: batch[k] for k in "PqAb"}, {}))
        cases.append((f"one n=65 {tag}", _problems(dtype, None, 65), {}))
    # from n = 256 the backward reuses the compiled solver's factors (dxopt.qp.backward.dense_large)
    cases.append(("one n=256 float64", _problems(torch.float64, None, 256), {}))
    return cases


def warmup(*, verbose: bool = False) -> WarmupReport:
    """Compile, or load from numba's disk cache, the compiled kernels of :mod:`dxopt.qp`.

    Runs tiny forward + backward solves along every lean route (see the module docstring).
    In a fresh install the first process pays the compilation (see the README's "First
    call"); later processes load the cached code. ``make demo`` runs it during its install
    step. ``verbose=True`` prints each solve and its seconds.

    Returns:
        :class:`WarmupReport` with the seconds, the solves and the compiled kernels.
    """
    import warnings

    calls: list[str] = []
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. degenerate rows of the tiny problems
        for label, data, options in _cases():
            t0 = time.perf_counter()
            _run(data, **options)
            line = f"{label}: {time.perf_counter() - t0:.2f} s"
            calls.append(line)
            if verbose:
                print(line, file=sys.stderr)
    seconds = time.perf_counter() - start
    cache_dir = os.environ.get("NUMBA_CACHE_DIR") or "__pycache__ next to the modules"
    report = WarmupReport(seconds, tuple(calls), compiled_kernels(), cache_dir)
    if verbose:
        compiled = sum(1 for v in report.kernels.values() if v)
        print(
            f"dxopt.qp.warmup: {seconds:.1f} s, {compiled} of {len(report.kernels)} kernels "
            f"({report.signatures} signatures) compiled or loaded; cache: {cache_dir}",
            file=sys.stderr,
        )
    return report
