"""Run one (problem, size, method) case in an isolated child process.

:func:`run_case` forks a child that lowers its address-space limit (``resource.setrlimit``),
builds the problem from its seed, runs the method and writes ``result.json`` and
``grads.npz`` into the case folder. The parent waits with a timeout, so a hang, an
out-of-memory kill or a crash becomes a recorded status instead of stopping the run.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import multiprocessing as mp
import os
import resource
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.qp import generators, peers, reference


@dataclass(frozen=True)
class Case:
    """One benchmark cell; ``batch > 1`` means the batched dense family."""

    family: str
    n: int
    method: str
    seed: int = 0
    batch: int = 1
    m: int = 0
    p: int = 0
    timeout_s: float = 300.0
    mem_gb: float = 12.0

    @property
    def key(self) -> str:
        size = f"b{self.batch}n{self.n}" if self.batch > 1 else f"n{self.n}"
        return f"{self.family}-{size}-{self.method}"


def problems(case: Case) -> list[generators.QPProblem]:
    if case.batch > 1:
        return generators.batched_dense(case.batch, case.n, case.m, case.p, seed=case.seed)
    return [generators.make_problem(case.family, case.n, seed=case.seed)]


def cotangent(case: Case) -> np.ndarray:
    """The fixed loss weights ``w`` (``L = sum(w * x*)``), shared by all methods of a cell."""
    shape = (case.batch, case.n) if case.batch > 1 else (case.n,)
    return np.random.default_rng(10_000 + case.seed).standard_normal(shape)


def _matrices(case: Case) -> bool:
    """Differentiate w.r.t. G and A too (dense families only; sparse ones have huge G)."""
    return case.family in ("dense", "batched")


def _reference(probs: list[generators.QPProblem], w: np.ndarray, matrices: bool) -> tuple:
    t0 = time.perf_counter()
    per = [reference.reference_grads(p, wi, matrices=matrices) for p, wi in zip(probs, w)]
    elapsed = time.perf_counter() - t0
    grads = {k: np.stack([g[k] for g, _ in per]) for k in per[0][0]}
    if len(probs) == 1:
        grads = {k: v[0] for k, v in grads.items()}
    exacts = [ex for _, ex in per if ex is not None]
    timings: dict[str, Any] = {"forward_s": elapsed, "backward_s": None, "runs": 1}
    if exacts:
        timings["n_active"] = int(sum(ex.active.size for ex in exacts))
        timings["degenerate"] = any(ex.degenerate for ex in exacts)
        timings["kkt_residual"] = max(ex.kkt_residual for ex in exacts)
    else:
        timings["n_active"] = int(sum((g["x"] == 0).sum() for g, _ in per))
        timings["degenerate"] = False
    return timings, grads


def execute(case: Case) -> tuple[dict, dict[str, np.ndarray]]:
    """Run ``case`` in this process; returns ``(timings, grads)``."""
    probs = problems(case)
    w = cotangent(case)
    w_list = w if case.batch > 1 else w[None]
    matrices = _matrices(case)
    method = case.method
    if method == "reference":
        return _reference(probs, w_list, matrices)
    if method in ("dxopt_penalty", "dxopt_kkt"):
        backward = method.split("_", 1)[1]
        return peers.run_dxopt(probs, w, backward=backward, matrices=matrices, solver="auto")
    if method == "qpth":
        return peers.run_qpth(probs, w, matrices=matrices)
    if method == "cvxpylayers":
        return peers.run_cvxpylayers(probs[0], w, matrices=matrices)
    if method == "cholesky":
        return peers.run_cholesky(probs)
    if method.startswith("raw_"):
        solver = method[4:]
        if case.batch > 1:
            return peers.run_raw_loop(probs, solver=solver)
        return peers.run_raw(probs[0], solver=solver)
    raise ValueError(f"unknown method {method!r}")


def _child(case: Case, folder: str) -> None:
    limit = int(case.mem_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = Path(folder)
    result: dict[str, Any] = {"status": "ok"}
    grads: dict[str, np.ndarray] = {}
    try:
        import torch

        torch.set_num_threads(2)
        timings, grads = execute(case)
        result.update(timings)
    except peers.PeerUnavailable as exc:
        result["status"] = f"not installed ({exc})"
    except MemoryError:
        result["status"] = f"out of memory (limit {case.mem_gb:g} GB)"
    except Exception as exc:  # recorded, never raised: one failing peer must not stop the run
        msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        result["status"] = f"error: {type(exc).__name__}: {msg}"
        result["traceback"] = traceback.format_exc()[-2000:]
        if "memory" in msg.lower() or "alloc" in msg.lower():
            result["status"] = f"out of memory (limit {case.mem_gb:g} GB): {msg}"
    np.savez(out / "grads.npz", **grads)
    (out / "result.json").write_text(json.dumps(result, default=str))
    os._exit(0)


def preimport() -> None:
    """Import every peer once in the parent, so forked children start in milliseconds.

    The parent must not run torch operations itself: a child forked after the parent ran an
    OpenMP region can deadlock in libgomp (so tests run the benchmark as a subprocess).
    """
    for name in ("torch", "qpsolvers", "sklearn.datasets", "sklearn.neighbors", "dxopt.qp",
                 "qpth.qp", "cvxpy", "cvxpylayers.torch", "diffcp"):  # fmt: skip
        with contextlib.suppress(Exception):  # a missing peer is recorded per cell
            importlib.import_module(name)


def run_case(case: Case, folder: Path) -> dict[str, Any]:
    """Run ``case`` in a forked child with its timeout and memory limit."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("result.json", "grads.npz"):
        (folder / stale).unlink(missing_ok=True)
    proc = mp.get_context("fork").Process(target=_child, args=(case, str(folder)))
    t0 = time.perf_counter()
    proc.start()
    proc.join(case.timeout_s)
    wall = time.perf_counter() - t0
    record: dict[str, Any] = {**asdict(case), "key": case.key, "wall_s": wall}
    if proc.is_alive():
        proc.kill()
        proc.join()
        record["status"] = f"timeout (> {case.timeout_s:g} s)"
        return record
    result_file = folder / "result.json"
    if not result_file.exists():
        code = proc.exitcode
        record["status"] = (
            f"killed by signal {-code} (likely out of memory)"
            if code is not None and code < 0
            else f"crashed (exit code {code})"
        )
        return record
    record.update(json.loads(result_file.read_text()))
    return record
