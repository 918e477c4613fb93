"""Solve and differentiate QP batches on a Ray cluster: :class:`RayExecutor`.

Ray is imported only when an executor starts, so importing dxopt never imports Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dxopt._core import Cost, check_callable, check_int, check_positive
from dxopt.distributed._chunks import (
    chunk_bounds,
    layout_of,
    merge_diagnostics,
    reemit_warnings,
    slice_chunk,
    to_wire,
)
from dxopt.distributed._errors import (
    DistributedError,
    DistributedTypeError,
    distributed_input_errors,
)
from dxopt.distributed._function import DistributedCall, RayQPFunction
from dxopt.distributed._stitch import (
    assemble_grads,
    check_same_point,
    stitch_outputs,
)
from dxopt.distributed._worker import ChunkGrads, ChunkOutput, QPWorker, solve_and_backward
from dxopt.qp import BackwardDiagnostics, QPInfo, QPSolution, QPSolveError
from dxopt.qp.problem.executor import QPData
from dxopt.qp.problem.options import QPOptions

__all__ = ["ExecutorStats", "RayExecutor"]

_OUTPUT_NAMES = ("x", "eq_duals", "ineq_duals", "lb_duals", "ub_duals")


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "RayExecutor needs Ray: install the extra with `pip install 'dxopt[distributed]'`."
        ) from err
    return ray


@dataclass
class ExecutorStats:
    """Counters of one executor since it was created (or since :meth:`RayExecutor.reset_stats`).

    Attributes:
        calls: distributed forward calls.
        chunks: chunks solved successfully in forward calls (retries included once).
        retried_chunks: chunks whose worker died and that were sent to another worker.
        failed_chunks: chunks whose worker died on the retry too (samples marked ``FAILED``).
        restarted_workers: dead workers replaced by fresh ones.
        resolved_in_backward: chunks whose graph was gone at backward time (worker died,
            graph evicted, or a second backward) and that were re-solved on a live worker.
        resolved_on_driver: chunks whose backward came after :meth:`RayExecutor.shutdown`
            and that were re-solved and differentiated in the driver process.
        backward_chunks: chunks differentiated in backward calls (re-solved ones included).
        seconds: wall-clock seconds of the forward and backward calls.
    """

    calls: int = 0
    chunks: int = 0
    retried_chunks: int = 0
    failed_chunks: int = 0
    restarted_workers: int = 0
    resolved_in_backward: int = 0
    resolved_on_driver: int = 0
    backward_chunks: int = 0
    seconds: float = 0.0

    @property
    def cost(self) -> Cost:
        """The work as the library's cost record: a forward per chunk solved, a backward per
        chunk differentiated, and the calls' wall-clock seconds."""
        return Cost(forwards=self.chunks, backwards=self.backward_chunks, seconds=self.seconds)


def _release(workers: tuple[Any, ...], call_id: str) -> None:
    """Finalizer: ask the workers to drop the graphs of a call that was never backpropagated."""
    for worker in workers:
        with contextlib.suppress(Exception):  # Ray shut down, worker gone: nothing to free
            worker.release.remote(call_id)


class RayExecutor:
    """Spread :func:`dxopt.qp.solve` over long-lived Ray actors, chunk by chunk.

    ``dqp.solve(P, q, ..., executor=RayExecutor(...))`` splits the batch (leading dimension) into
    chunks of ``chunk_size`` samples and sends them to ``num_workers`` actors (at most
    ``max_inflight`` chunks queued per actor; a free actor takes the next chunk). Each actor
    solves its chunk with the local :func:`dxopt.qp.solve` and, when a gradient is needed,
    keeps the chunk's autograd graph (the factorization data of the backward stays where it was
    made). The backward sends each chunk's output cotangents to the actor that owns it, which
    returns the input gradients; batched inputs get them concatenated, broadcast inputs summed
    over chunks. The result is the same :class:`~dxopt.qp.QPSolution` as the local call: same
    ``x``, duals, per-sample ``status``, residuals and gradients (up to the order of the sums
    over chunks).

    Failures:

    - A worker that dies (:class:`ray.exceptions.RayActorError`) is replaced by a fresh actor
      and its chunks are solved again once on another (or the fresh) actor; if that attempt
      dies too, the chunk's samples get ``QPStatus.FAILED`` and follow ``on_failure``
      (``"raise"``: :class:`~dxopt.qp.QPSolveError`; ``"nan"``: NaN outputs, zero gradient).
    - If the actor owning a chunk's graph is gone at backward time (died, or the graph was
      evicted), the chunk is re-solved on a live actor and differentiated there; the re-solve
      must reproduce the forward's status and ``x`` (else ``RuntimeError``), so a gradient is
      never taken at another point. A second backward through the same call takes this path
      too (the first one freed the graphs).
    - Errors raised by :func:`dxopt.qp.solve` itself (bad input, ``QPBackwardError``) are raised
      on the driver as their original type; batch indices in their messages count from the
      chunk's first sample.

    Memory: a graph is freed by its backward; a call that is never backpropagated is freed
    when its outputs are garbage-collected (a weakref finalizer on the call tells the actors),
    and each actor keeps at most ``max_stored_chunks`` graphs (oldest evicted first).

    Lifetime: ``ray.init()`` is the user's call (local or a cluster); alternatively pass
    ``address=`` and the executor calls ``ray.init(address=address)`` when it starts. Actors
    are created on first use, or by :meth:`start`, and killed by :meth:`shutdown` (which the
    ``with`` block calls on exit); no actor outlives it, so ten executors opened and closed in
    a row each find the cluster free. A later forward call restarts the actors (stop them
    again with :meth:`shutdown`). Each actor needs ``dxopt`` importable on its node.

    A backward after :meth:`shutdown` (``loss.backward()`` after the ``with`` block, a natural
    thing to write in training) works and starts nothing: the graphs died with the actors, so
    every chunk is re-solved and differentiated in the driver process with the same local
    :func:`dxopt.qp.solve`, and the re-solve must reproduce the forward's status and ``x``
    (else ``RuntimeError``), as every re-solve here. It costs one local solve of the batch
    (``stats.resolved_on_driver`` counts the chunks); backpropagate inside the block to keep
    that work on the cluster. The alternative, keeping the actors alive until every pending
    graph is freed, was rejected: the outputs of a call that a variable still holds would keep
    the actors' CPUs reserved after the block, and the next executor would wait for them for
    its whole ``start_timeout`` (what an earlier version did, by restarting actors in such a
    backward and never stopping them).

    Args:
        num_workers: number of actors.
        chunk_size: samples per chunk. Each chunk costs a fixed overhead (measured in
            ``benchmarks/qp_ray``); keep chunks much longer to solve than that.
        address: Ray cluster address for ``ray.init`` if Ray is not initialised yet.
        num_cpus_per_worker: CPUs Ray reserves per actor.
        torch_threads: ``torch.set_num_threads`` in each actor.
        max_inflight: chunks queued per actor at once (2 hides the round trip).
        max_stored_chunks: graphs kept per actor.
        spread: place actors with Ray's ``"SPREAD"`` strategy (one per node first).
        runtime_env: passed to the actors (e.g. ``{"py_modules": [...]}`` on a cluster).
        progress: called as ``progress(done, total)`` (samples) after every finished chunk.
        start_timeout: seconds :meth:`start` waits for the actors to come up (a cluster without
            room for them would otherwise leave chunks queued forever).
    """

    def __init__(
        self,
        *,
        num_workers: int = 2,
        chunk_size: int = 256,
        address: str | None = None,
        num_cpus_per_worker: float = 1.0,
        torch_threads: int = 1,
        max_inflight: int = 2,
        max_stored_chunks: int = 128,
        spread: bool = True,
        runtime_env: dict[str, Any] | None = None,
        progress: Callable[[int, int], None] | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        with distributed_input_errors():
            self.num_workers = check_int("num_workers", num_workers)
            self.chunk_size = check_int("chunk_size", chunk_size)
            self.torch_threads = check_int("torch_threads", torch_threads)
            self.max_inflight = check_int("max_inflight", max_inflight)
            self.max_stored_chunks = check_int("max_stored_chunks", max_stored_chunks)
            if address is not None and not isinstance(address, str):
                raise DistributedTypeError(
                    f"address: expected a str or None, got {type(address).__name__}."
                )
            check_positive("num_cpus_per_worker", num_cpus_per_worker)
            check_positive("start_timeout", start_timeout, hint="seconds to wait for the actors")
            if progress is not None:
                check_callable("progress", progress, signature="(done, total) or None")
        self.address = address
        self.num_cpus_per_worker = float(num_cpus_per_worker)
        self.spread = spread
        self.runtime_env = runtime_env
        self.progress = progress
        self.start_timeout = float(start_timeout)
        self.stats = ExecutorStats()
        self._workers: list[Any] = []
        self._crash_chunks: frozenset[int] = frozenset()  # fault injection (tests only)

    def __repr__(self) -> str:
        return (
            f"RayExecutor(num_workers={self.num_workers}, chunk_size={self.chunk_size}, "
            f"address={self.address!r})"
        )

    # --- actors -------------------------------------------------------------------------

    @property
    def workers(self) -> tuple[Any, ...]:
        """The current actor handles (started on first use)."""
        return tuple(self._workers)

    def _new_worker(self) -> Any:
        ray = _import_ray()
        options: dict[str, Any] = {"num_cpus": self.num_cpus_per_worker}
        if self.spread:
            options["scheduling_strategy"] = "SPREAD"
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        actor_class = ray.remote(QPWorker).options(**options)
        return actor_class.remote(self.torch_threads, self.max_stored_chunks)

    def start(self) -> RayExecutor:
        """Connect (``ray.init(address=...)`` if needed) and create the actors."""
        ray = _import_ray()
        if not ray.is_initialized():
            if self.address is None:
                raise DistributedError(
                    "RayExecutor: Ray is not initialised. Call ray.init() first (a local "
                    "cluster, or ray.init(address=...) for a running one), or pass "
                    "RayExecutor(address=...)."
                )
            ray.init(address=self.address)
        new = [self._new_worker() for _ in range(self.num_workers - len(self._workers))]
        if new:
            probes = [w.describe.remote() for w in new]
            ready, _ = ray.wait(probes, num_returns=len(probes), timeout=self.start_timeout)
            if len(ready) < len(probes):
                for worker in new:
                    with contextlib.suppress(Exception):
                        ray.kill(worker)
                cpus = ray.cluster_resources().get("CPU", 0.0)
                raise DistributedError(
                    f"RayExecutor: only {len(ready)} of {len(new)} new actors came up within "
                    f"start_timeout={self.start_timeout:g} s (the cluster has {cpus:g} CPUs; each "
                    f"actor asks for num_cpus_per_worker={self.num_cpus_per_worker:g}). Lower "
                    "num_workers or num_cpus_per_worker, add nodes, or raise start_timeout."
                )
            self._workers.extend(new)
        return self

    def shutdown(self) -> None:
        """Kill the actors (their stored graphs are lost; Ray itself keeps running)."""
        if self._workers:
            ray = _import_ray()
            for worker in self._workers:
                with contextlib.suppress(Exception):  # already dead
                    ray.kill(worker)
        self._workers = []

    def __enter__(self) -> RayExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def reset_stats(self) -> None:
        self.stats = ExecutorStats()

    def _replace(self, slot: int, dead: Any) -> None:
        """Replace the actor in ``slot`` if it is still the dead one."""
        if self._workers[slot] is dead:
            ray = _import_ray()
            with contextlib.suppress(Exception):
                ray.kill(dead)
            self._workers[slot] = self._new_worker()
            self.stats.restarted_workers += 1

    # --- forward ------------------------------------------------------------------------

    def solve(self, data: QPData, *, options: QPOptions) -> QPSolution:
        """Solve the batch ``data`` on the actors; called by ``dqp.solve(..., executor=self)``
        (the :class:`~dxopt.qp.problem.executor.QPExecutor` protocol).

        ``options``: the other keyword options of :func:`dxopt.qp.solve`, checked
        (:class:`~dxopt.qp.problem.options.QPOptions`, ``executor=None``).
        """
        ray = _import_ray()
        self.start()
        inputs = data.tensors()
        layout = layout_of(inputs)
        device = data.q.device if isinstance(data.q, Tensor) else torch.device("cpu")
        cpu = tuple(None if t is None else t.detach().cpu() for t in inputs)
        needs_grad = tuple(t is not None and t.requires_grad for t in inputs[:8])
        keep = torch.is_grad_enabled() and any(needs_grad)
        bounds = chunk_bounds(layout.batch, self.chunk_size)
        on_failure = options.on_failure
        worker_options = dataclasses.replace(options, executor=None, on_failure="nan")
        shared = tuple(
            ray.put(to_wire(t)) if t is not None and not bat else None
            for t, bat in zip(cpu, layout.batched)
        )

        def chunk_inputs(c: int) -> list[Any]:
            s, e = bounds[c]
            return [
                ref if ref is not None else to_wire(slice_chunk(t, bat, layout.batch, s, e))
                for t, bat, ref in zip(cpu, layout.batched, shared)
            ]

        call_id = uuid.uuid4().hex
        t0 = time.perf_counter()
        results, owners, worker_failed = self._run_forward(
            call_id, bounds, chunk_inputs, keep, needs_grad, worker_options, layout.batch
        )
        elapsed = time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.seconds += elapsed
        holders = tuple({id(w): w for w in owners if w is not None}.values())
        try:
            outputs, status, primal, dual, solver = stitch_outputs(
                results, bounds, layout.batch, cpu, str(options.solver)
            )
        except BaseException:
            _release(holders, call_id)
            raise
        for c, r in enumerate(results):
            if r is not None:
                reemit_warnings(r.warnings, *bounds[c])
        failed = tuple(i for i, s in enumerate(status) if not s.ok)
        if failed and on_failure == "raise":
            _release(holders, call_id)
            lost = sorted(i for c in worker_failed for i in range(*bounds[c]))
            kinds = {i: status[i].value for i in failed}
            raise QPSolveError(
                f"{len(failed)} of {len(status)} QPs not solved by {solver!r} (batch index: "
                f"status) {kinds}"
                + (f"; samples {lost} were lost with their Ray workers (twice)" if lost else "")
                + ". Fix the data, or pass on_failure='nan' to get NaN for those samples.",
                failed,
                status,
            )
        diagnostics = BackwardDiagnostics()
        call = DistributedCall(
            call_id=call_id,
            backend=self,
            bounds=bounds,
            owners=owners,
            worker_failed=worker_failed,
            batch=layout.batch,
            batched=layout.batched,
            inputs=cpu,
            needs_grad=needs_grad,
            options=worker_options,
            outputs=outputs,
            status=status,
            diagnostics=diagnostics,
            device=device,
        )
        if holders:
            weakref.finalize(call, _release, holders, call_id)
        outs = RayQPFunction.apply(call, *inputs[:8])
        x, eq, ineq, lbd, ubd = (None if o is None else t for o, t in zip(outputs, outs))
        assert x is not None
        info = QPInfo(
            solver=solver,
            solve_time=elapsed,
            primal_residual=primal,
            dual_residual=dual,
            backward=diagnostics,
            route="executor",
        )
        return QPSolution(
            x=x,
            eq_duals=eq,
            ineq_duals=ineq,
            status=status,
            info=info,
            lb_duals=lbd,
            ub_duals=ubd,
        )

    def _run_forward(
        self,
        call_id: str,
        bounds: list[tuple[int, int]],
        chunk_inputs: Callable[[int], list[Any]],
        keep: bool,
        needs_grad: tuple[bool, ...],
        options: QPOptions,
        batch: int | None,
    ) -> tuple[list[ChunkOutput | None], list[Any], set[int]]:
        """Schedule the chunks over the actors: a free actor takes the next chunk; a chunk
        whose actor died is queued again once (on the replacement or another actor)."""
        ray = _import_ray()
        from ray.exceptions import RayActorError, WorkerCrashedError

        lost_worker = (RayActorError, WorkerCrashedError)
        n = len(bounds)
        total = batch if batch is not None else 1
        results: list[ChunkOutput | None] = [None] * n
        owners: list[Any] = [None] * n
        worker_failed: set[int] = set()
        pending: deque[tuple[int, int]] = deque((c, 0) for c in range(n))
        inflight: dict[Any, tuple[int, int, int, Any]] = {}
        load = [0] * self.num_workers
        done = 0
        try:
            while pending or inflight:
                while pending:
                    slot = min(range(self.num_workers), key=load.__getitem__)
                    if load[slot] >= self.max_inflight:
                        break
                    c, attempt = pending.popleft()
                    worker = self._workers[slot]
                    ref = worker.forward.remote(
                        (call_id, c),
                        keep,
                        needs_grad,
                        options,
                        c in self._crash_chunks,
                        *chunk_inputs(c),
                    )
                    inflight[ref] = (c, attempt, slot, worker)
                    load[slot] += 1
                (ref,), _ = ray.wait(list(inflight), num_returns=1)
                c, attempt, slot, worker = inflight.pop(ref)
                load[slot] -= 1
                try:
                    results[c] = ray.get(ref)
                except lost_worker:
                    self._replace(slot, worker)
                    if attempt == 0:
                        self.stats.retried_chunks += 1
                        pending.append((c, 1))
                    else:
                        self.stats.failed_chunks += 1
                        worker_failed.add(c)
                    continue
                except Exception as err:
                    raise _original(err) from err
                self.stats.chunks += 1
                owners[c] = worker if keep else None
                done += bounds[c][1] - bounds[c][0] if batch is not None else 1
                if self.progress is not None:
                    self.progress(done, total)
        except BaseException:
            _release(tuple(self._workers), call_id)
            raise
        return results, owners, worker_failed

    # --- backward -----------------------------------------------------------------------

    def backward_call(
        self, call: DistributedCall, cotangents: tuple[Tensor | None, ...]
    ) -> tuple[Tensor | None, ...]:
        """Gradients of the eight differentiable inputs for the output cotangents."""
        t0 = time.perf_counter()
        ray = _import_ray()
        from ray.exceptions import RayActorError, WorkerCrashedError

        lost_worker = (RayActorError, WorkerCrashedError)
        closed = not self._workers  # shut down since the forward: its graphs are gone
        cots = tuple(None if g is None else g.detach().cpu() for g in cotangents)

        def chunk_cots(c: int) -> tuple[Tensor | None, ...]:
            s, e = call.bounds[c]
            return tuple(to_wire(slice_chunk(g, True, call.batch, s, e)) for g in cots)

        active = [c for c in range(len(call.bounds)) if c not in call.worker_failed]
        refs = {}
        missing: list[int] = []
        for c in active:
            owner = call.owners[c]
            if owner is None or closed:
                call.owners[c] = None
                missing.append(c)
                continue
            call.owners[c] = None  # the worker frees the graph with this backward
            try:
                refs[c] = owner.backward.remote((call.call_id, c), chunk_cots(c))
            except lost_worker:
                missing.append(c)
        grads: dict[int, ChunkGrads] = {}
        for c, ref in refs.items():
            try:
                got = ray.get(ref)
            except lost_worker:
                got = None
            except Exception as err:
                raise _original(err) from err
            if got is None:
                missing.append(c)
            else:
                grads[c] = got
        if missing:
            grads.update(self._resolve(call, sorted(missing), chunk_cots))
        for c in sorted(grads):
            reemit_warnings(grads[c].warnings, *call.bounds[c])
        merge_diagnostics(call.diagnostics, [grads[c].diagnostics for c in sorted(grads)])
        out = assemble_grads(call, grads)
        self.stats.backward_chunks += len(grads)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def _resolve(
        self,
        call: DistributedCall,
        chunks: list[int],
        chunk_cots: Callable[[int], tuple[Tensor | None, ...]],
    ) -> dict[int, ChunkGrads]:
        """Re-solve ``chunks`` on live actors and differentiate there (graph gone); in this
        process when the executor has no actors (shut down since the forward)."""
        if not self._workers:
            return self._resolve_on_driver(call, chunks, chunk_cots)
        ray = _import_ray()
        from ray.exceptions import RayActorError, WorkerCrashedError

        lost_worker = (RayActorError, WorkerCrashedError)
        out: dict[int, ChunkGrads] = {}
        for _attempt in range(2):
            submitted = {}
            for k, c in enumerate(chunks):
                slot = k % self.num_workers
                worker = self._workers[slot]
                s, e = call.bounds[c]
                inputs = [
                    to_wire(slice_chunk(t, bat, call.batch, s, e))
                    for t, bat in zip(call.inputs, call.batched)
                ]
                ref = worker.solve_and_backward.remote(
                    call.needs_grad, call.options, chunk_cots(c), *inputs
                )
                submitted[c] = (ref, slot, worker)
            retry = []
            for c, (ref, slot, worker) in submitted.items():
                try:
                    solved, grads = ray.get(ref)
                except lost_worker:
                    self._replace(slot, worker)
                    retry.append(c)
                    continue
                except Exception as err:
                    raise _original(err) from err
                check_same_point(call, c, solved)
                self.stats.resolved_in_backward += 1
                out[c] = grads
            if not retry:
                return out
            chunks = retry
        s, e = call.bounds[chunks[0]]
        raise DistributedError(
            f"RayExecutor: the workers holding samples {s}..{e - 1} (and {len(chunks) - 1} other "
            "chunks) died, and re-solving them for the backward failed twice; no gradient is "
            "returned. Check the cluster (ray status) and the workers' logs."
        )

    def _resolve_on_driver(
        self,
        call: DistributedCall,
        chunks: list[int],
        chunk_cots: Callable[[int], tuple[Tensor | None, ...]],
    ) -> dict[int, ChunkGrads]:
        out: dict[int, ChunkGrads] = {}
        for c in chunks:
            s, e = call.bounds[c]
            inputs = [
                to_wire(slice_chunk(t, bat, call.batch, s, e))
                for t, bat in zip(call.inputs, call.batched)
            ]
            solved, grads = solve_and_backward(
                call.needs_grad, call.options, chunk_cots(c), *inputs
            )
            check_same_point(call, c, solved)
            self.stats.resolved_on_driver += 1
            out[c] = grads
        return out


def _original(err: Exception) -> BaseException:
    """The exception a worker raised (Ray wraps it in a ``RayTaskError``)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err
