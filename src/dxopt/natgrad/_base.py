"""Shared machinery of the natural-gradient optimizers: a :class:`torch.optim.Optimizer` base
that gets the residual and its Jacobian from a batch or a closure, checks and reports.

A step needs the residual rows :math:`r` and their Jacobian :math:`J`; they come either from

- a *batch*: ``opt.step(batch)`` evaluates the ``residual(params, batch)`` given at
  construction (through :func:`~dxopt.natgrad.residual_and_jacobian`, which uses the fast
  per-row rules of :class:`~dxopt.natgrad.RowwiseResidual` and the PINN zoo); or
- a *closure*: ``opt.step(closure)`` calls ``closure()``, which evaluates the model and returns
  the 1-D residual tensor with its autograd graph (as a torch closure returns the loss), and
  differentiates every row by one batched reverse pass
  (``torch.autograd.grad(..., is_grads_batched=True)``).

One step sees one batch: every evaluation within a step (the Jacobian's, and ENGD's line-search
trial points) goes through one :class:`dxopt._core.replay.ForwardReplay`, the mechanism
the gradient estimators use for their repeated forwards. Each evaluation starts from the global
RNG state the step started with (CPU, and every initialised CUDA device), so a closure that
draws fresh collocation points or dropout masks from the global RNG sees the same draw at every
trial point, and the RNG is left where one evaluation leaves it; module buffers (BatchNorm
running statistics) are left as after the first evaluation, i.e. updated once per step. A
closure drawing from its own :class:`torch.Generator` is not replayed: draw the step's points
before the step then (or pass them as a batch).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

import torch
from torch import nn

from dxopt._core import (
    Cost,
    DxoptError,
    Status,
    check_callable,
    check_int,
    check_on_failure,
    handle_failure,
)
from dxopt._core.replay import ForwardReplay, replayed_forwards
from dxopt.natgrad._directions import DirectionSolve
from dxopt.natgrad._jacobian import ResidualFunction, _HasJacobian, residual_and_jacobian

__all__ = ["CholeskyFallbackError", "NaturalGradientOptimizer", "StepReport"]

FailurePolicy = Literal["raise", "warn", "ignore"]
Closure = Callable[[], torch.Tensor]
_ROWWISE_HINT_ROWS = 64  # below this the jacrev path is cheap enough not to warn
_T = TypeVar("_T")


def _call_thunk(thunk: Callable[[], Any], _batch: Any) -> Any:
    """The ``loss_fn(params, batch)`` :class:`ForwardReplay` calls: here ``params`` is the
    evaluation itself, a function of no arguments."""
    return thunk()


def _running_stat_modules(model: nn.Module) -> list[str]:
    """Names (and types) of the submodules that update running statistics in a forward."""
    return [
        f"{name or '<model>'!r} ({type(m).__name__})"
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats
    ]


class CholeskyFallbackError(DxoptError):
    """Raised when the Cholesky factorization of the kernel fails and ``on_failure="raise"``."""


@dataclass(frozen=True)
class StepReport:
    """What one optimizer step did.

    Attributes:
        loss: :math:`\\tfrac12\\|r\\|^2` on the step's rows *before* the update.
        step_size: the factor :math:`\\eta_k` actually applied to the direction (after the
            norm cap or line search; 0.0 when the step was rejected).
        direction_norm: :math:`\\|d_k\\|_2`.
        solve_method: how the linear system was solved (``"cholesky"``, ``"cholesky+jitter"``,
            ``"eigh-pinv"`` or ``"lstsq"``).
        jitter: diagonal shift added by a fallback beyond the damping.
        status: ``Status.SOLVED``, or ``Status.FALLBACK`` when a fallback solved the system.
        cost: ``rows`` (residual rows differentiated) and ``forwards`` (extra residual
            evaluations of the line search).
    """

    loss: float
    step_size: float
    direction_norm: float
    solve_method: str
    jitter: float
    status: Status = Status.SOLVED
    cost: Cost = field(default_factory=Cost)

    @property
    def rows(self) -> int:
        """Residual rows used (``cost.rows``)."""
        return self.cost.rows

    @property
    def used_fallback(self) -> bool:
        return self.status is Status.FALLBACK


def check_hyper(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """A finite real ``> 0`` (``>= 0`` with ``allow_zero``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}.")
    return float(value)


def _resolve_on_failure(on_failure: str) -> str:
    if on_failure == "report":  # the value of on_fallback before 0.2
        warnings.warn(
            "on_failure: 'report' is renamed 'ignore' (the status is in every StepReport); "
            "the old value will be removed in the next release.",
            DeprecationWarning,
            stacklevel=4,
        )
        return "ignore"
    return check_on_failure(on_failure, ("raise", "warn", "ignore"))


@dataclass
class _Rows:
    """The residual rows of one step and how to re-evaluate the loss along a direction."""

    r: torch.Tensor
    jac: torch.Tensor
    params: list[torch.Tensor]
    names: list[str] | None
    batch: Any = None
    closure: Closure | None = None


def _floating_tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch] if batch.is_floating_point() else []
    if isinstance(batch, (tuple, list)):
        return [t for b in batch for t in _floating_tensors(b)]
    if isinstance(batch, dict):
        return [t for b in batch.values() for t in _floating_tensors(b)]
    return []


class NaturalGradientOptimizer(torch.optim.Optimizer):
    """Base class of :class:`SNG`, :class:`SPRING` and :class:`ENGD`: a
    :class:`torch.optim.Optimizer` over one parameter group.

    Args:
        params: an ``nn.Module`` (its trainable parameters, by name, for a ``residual``
            function; parameters with ``requires_grad=False`` are skipped), or, as for any
            torch optimizer, an iterable of tensors or one parameter-group dict (then steps
            take a closure).
        residual: ``residual(params, batch) -> (N,)`` for batch steps; the loss is
            :math:`\\tfrac12\\|r\\|^2`. ``None`` when every step takes a closure.
        defaults: the hyperparameters of the group (``lr``, ``damping``, ...); they live in
            ``param_groups[0]``, so LR schedulers and ``state_dict`` see them.
        chunk_size: rows differentiated at once when building a batch Jacobian.
        on_failure: what to do when the Cholesky factorization fails and a jitter or
            eigendecomposition fallback is used: ``"ignore"`` (report it in the
            :class:`StepReport` status and the ``fallbacks`` counter), ``"warn"`` (also a
            :class:`~dxopt._core.DxoptWarning`) or ``"raise"`` (:class:`CholeskyFallbackError`).

    The natural-gradient direction couples all parameters in one linear solve, hence one
    parameter group; its counters (``step``, ``fallbacks``) are kept, as for
    :class:`torch.optim.LBFGS`, in the state of the first parameter.
    """

    def __init__(
        self,
        params: nn.Module | Iterable[Any],
        residual: ResidualFunction | None,
        defaults: dict[str, Any],
        *,
        chunk_size: int | None = None,
        on_failure: str = "ignore",
    ) -> None:
        self.model: nn.Module | None = params if isinstance(params, nn.Module) else None
        if self.model is not None:
            named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
            if not named:
                raise ValueError("params: the model has no trainable parameters.")
            self._names = {id(p): n for n, p in named}
            param_list: Any = [p for _, p in named]
        elif isinstance(params, torch.Tensor):
            raise TypeError(
                "params: expected an nn.Module or an iterable of tensors, got a single tensor; "
                "pass [tensor]."
            )
        elif isinstance(params, str) or not isinstance(params, Iterable):
            raise TypeError(
                "params: expected a torch.nn.Module or an iterable of parameters, got "
                f"{type(params).__name__}."
            )
        else:
            self._names = {}
            param_list = list(params)
        if residual is not None:
            check_callable("residual", residual, signature="residual(params, batch) -> 1-D tensor")
            if self.model is None:
                raise TypeError(
                    "residual: a residual function needs the parameters' names; pass the "
                    "nn.Module itself (not model.parameters()), or step with a closure."
                )
        if chunk_size is not None:
            check_int("chunk_size", chunk_size)
        super().__init__(param_list, defaults)
        self.residual = residual
        self.chunk_size = chunk_size
        self.on_failure = _resolve_on_failure(on_failure)
        self._warned_rowwise = False
        self._replay: ForwardReplay | None = None
        trainable = self._trainable()
        if not trainable:
            raise ValueError("params: no parameter with requires_grad=True to optimize.")
        dtypes = {p.dtype for p in trainable}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise TypeError(
                f"params: expected all trainable parameters in one floating dtype, got {dtypes};"
                " convert the model with model.double()."
            )
        self.dtype = next(iter(dtypes))
        self.num_params = sum(p.numel() for p in trainable)

    # -- torch.optim.Optimizer conventions -------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.param_groups:
            raise ValueError(
                "param_group: natural gradient solves one linear system over all parameters, "
                "so it takes exactly one parameter group; put every tensor in it."
            )
        super().add_param_group(param_group)

    def _hyper(self, name: str) -> Any:
        return self.param_groups[0][name]

    @property
    def lr(self) -> float:
        """``param_groups[0]["lr"]`` (what LR schedulers change)."""
        return float(self.param_groups[0]["lr"])

    @lr.setter
    def lr(self, value: float) -> None:
        self.param_groups[0]["lr"] = check_hyper("lr", value)

    def _counters(self) -> dict[str, Any]:
        first = self.param_groups[0]["params"][0]
        state = self.state[first]
        state.setdefault("step", 0)
        state.setdefault("fallbacks", 0)
        return state

    @property
    def steps(self) -> int:
        """Steps taken (kept in ``state_dict``)."""
        return int(self._counters()["step"])

    @property
    def fallbacks(self) -> int:
        """Steps whose kernel solve needed a fallback (kept in ``state_dict``)."""
        return int(self._counters()["fallbacks"])

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self.param_groups[0]["params"] if p.requires_grad]

    # -- precision ---------------------------------------------------------------------------
    def _warn_precision(self, damping: float, *, what: str) -> None:
        eps = torch.finfo(self.dtype).eps
        if self.dtype != torch.float64 and (0 < damping < math.sqrt(eps) or damping == 0):
            warnings.warn(
                f"{what}: damping={damping:g} is below what {self.dtype} resolves "
                f"(sqrt(eps) = {math.sqrt(eps):.1e}); the kernel solve will be dominated by "
                "round-off. Use model.double() (float64, the default for PINNs) or a larger "
                "damping.",
                UserWarning,
                stacklevel=3,
            )

    # -- one batch per step -------------------------------------------------------------------
    @contextlib.contextmanager
    def _one_batch(self) -> Iterator[None]:
        """Within the block every :meth:`_evaluate` replays the step's RNG state and module
        buffers are left as after the first evaluation (see the module docstring)."""
        with replayed_forwards(cast(Any, _call_thunk)) as replay:
            self._replay = replay
            try:
                yield
            finally:
                self._replay = None

    def _evaluate(self, fn: Callable[[], _T]) -> _T:
        """``fn()``, as one of the replayed evaluations of the current step."""
        if self._replay is None:
            return fn()
        return cast(_T, self._replay(cast(Any, fn), None))

    # -- residual rows -------------------------------------------------------------------------
    def params(self) -> dict[str, torch.Tensor]:
        """The current trainable parameters, detached, by name (for ``functional_call``)."""
        return {self._names[id(p)]: p.detach() for p in self._trainable()}

    def residual_and_jacobian(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r, J)`` at the current parameters on ``batch`` (columns: trainable parameters)."""
        if self.residual is None:
            raise TypeError(
                "batch: this optimizer was built without a residual function, so a step needs "
                "a closure returning the residual: opt.step(lambda: model(x).reshape(-1) - y)."
            )
        for t in _floating_tensors(batch):
            if t.dtype != self.dtype:
                raise TypeError(
                    f"batch: holds {t.dtype} tensors but the parameters are {self.dtype}; make "
                    f"them match, e.g. model.to({t.dtype}) (float64 is the default for PINNs) "
                    f"or build the problem and batch with dtype={self.dtype}."
                )
        stats = [] if self.model is None else _running_stat_modules(self.model)
        if stats:
            raise ValueError(
                f"params: the model's module {', '.join(stats)} is in train mode, so each "
                "forward updates its running statistics in place; a residual function is "
                "differentiated with torch.func (vmap, jacrev), which cannot do that. Call "
                "model.eval() before batch steps (running statistics fixed), or step with a "
                "closure, opt.step(lambda: ...), which updates them once per step."
            )
        residual, params = self.residual, self.params()
        r, jac = self._evaluate(
            lambda: residual_and_jacobian(residual, params, batch, chunk_size=self.chunk_size)
        )
        r, jac = r.detach(), jac.detach()
        if r.dtype != self.dtype:
            raise TypeError(
                f"residual: returned dtype {r.dtype} but the parameters are {self.dtype}; make "
                "the batch and the residual use the parameters' dtype."
            )
        self._maybe_warn_rowwise(batch, r.shape[0])
        return r, jac

    def _maybe_warn_rowwise(self, batch: Any, rows: int) -> None:
        if (
            self._warned_rowwise
            or isinstance(self.residual, _HasJacobian)
            or rows < _ROWWISE_HINT_ROWS
        ):
            return
        points = _floating_tensors(batch)
        if points and all(t.ndim >= 1 for t in points) and sum(t.shape[0] for t in points) == rows:
            self._warned_rowwise = True
            warnings.warn(
                f"residual: a plain function gets its Jacobian from jacrev over all {rows} rows "
                "(each reverse pass runs through the whole batch); its rows match the batch's "
                "points one to one. If row i depends only on point i, wrap the per-block row "
                "functions in dxopt.natgrad.RowwiseResidual (vmap over single points), which "
                "is much faster for the same Jacobian.",
                UserWarning,
                stacklevel=4,
            )

    def _rows(self, closure_or_batch: Any) -> _Rows:
        params = self._trainable()
        if callable(closure_or_batch):
            r, jac = self._closure_rows(closure_or_batch, params)
            return _Rows(r, jac, params, None, closure=closure_or_batch)
        r, jac = self.residual_and_jacobian(closure_or_batch)
        names = [self._names[id(p)] for p in params]
        return _Rows(r, jac, params, names, batch=closure_or_batch)

    def _closure_rows(
        self, closure: Closure, params: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            r = self._evaluate(closure)
        if not isinstance(r, torch.Tensor) or r.ndim != 1:
            raise ValueError(
                "closure: expected it to return the residual as a 1-D tensor (N,), got "
                f"{tuple(r.shape) if isinstance(r, torch.Tensor) else type(r).__name__}; "
                "return e.g. (model(x) - y).reshape(-1)."
            )
        if r.dtype != self.dtype:
            raise TypeError(
                f"closure: returned a {r.dtype} residual but the parameters are {self.dtype}; "
                "make the data and the model use one dtype."
            )
        if not r.requires_grad:
            raise ValueError(
                "closure: the residual carries no autograd graph; evaluate the model inside "
                "the closure with gradients enabled (not under torch.no_grad())."
            )
        n = r.shape[0]
        eye = torch.eye(n, dtype=r.dtype, device=r.device)
        try:
            grads: Sequence[torch.Tensor | None] = torch.autograd.grad(
                r, params, eye, is_grads_batched=True, allow_unused=True, retain_graph=True
            )
        except RuntimeError:  # an operator without a batching rule: one row at a time
            per_row = [
                torch.autograd.grad(r, params, eye[i], retain_graph=True, allow_unused=True)
                for i in range(n)
            ]
            grads = [
                None if per_row[0][j] is None else torch.stack([g[j] for g in per_row])
                for j in range(len(params))
            ]
        if all(g is None for g in grads):
            raise ValueError(
                "closure: the residual does not depend on the optimizer's parameters; "
                "evaluate the model whose parameters were passed to the optimizer."
            )
        jac = torch.cat(
            [
                (
                    torch.zeros(n, p.numel(), dtype=r.dtype, device=r.device)
                    if g is None
                    else g.reshape(n, -1)
                )
                for g, p in zip(grads, params)
            ],
            dim=1,
        )
        return r.detach(), jac

    def _loss_at(self, rows: _Rows, direction: torch.Tensor, etas: list[float]) -> list[float]:
        """:math:`\\tfrac12\\|r(\\theta - \\eta d)\\|^2` for each ``eta``, one evaluation each;
        the parameters are left unchanged."""
        pieces = _split(direction, rows.params)
        losses = []
        if rows.closure is not None:
            saved = [p.detach().clone() for p in rows.params]
            try:
                for eta in etas:
                    with torch.no_grad():
                        for p, p0, d in zip(rows.params, saved, pieces):
                            p.copy_(p0 - eta * d)
                    r = self._evaluate(rows.closure).detach()
                    losses.append(0.5 * float(r @ r))
            finally:
                with torch.no_grad():
                    for p, p0 in zip(rows.params, saved):
                        p.copy_(p0)
            return losses
        assert self.residual is not None and rows.names is not None
        residual, base = self.residual, self.params()
        with torch.no_grad():
            for eta in etas:
                trial = {n: base[n] - eta * d for n, d in zip(rows.names, pieces)}
                r = self._evaluate(lambda: residual(trial, rows.batch)).detach()  # noqa: B023
                losses.append(0.5 * float(r @ r))
        return losses

    # -- updates -----------------------------------------------------------------------------
    def _handle_solve(self, solve: DirectionSolve) -> Status:
        if solve.method in ("cholesky", "lstsq"):
            return Status.SOLVED
        self._counters()["fallbacks"] += 1
        msg = (
            f"Cholesky of the kernel failed at step {self.steps}; solved by {solve.method} "
            f"(extra jitter {solve.jitter:.2e}, relative residual {solve.residual:.2e}). "
            "Increase damping to keep the kernel positive definite."
        )
        handle_failure(
            self.on_failure, msg, error=CholeskyFallbackError, status=Status.FALLBACK, stacklevel=4
        )
        return Status.FALLBACK

    @torch.no_grad()
    def _apply(self, params: list[torch.Tensor], direction: torch.Tensor, eta: float) -> None:
        for p, d in zip(params, _split(direction, params)):
            p.add_(d, alpha=-eta)

    def _finish(self) -> None:
        self._counters()["step"] += 1


def _split(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like each of ``params``, in order."""
    out, offset = [], 0
    for p in params:
        n = p.numel()
        out.append(flat[offset : offset + n].view_as(p))
        offset += n
    return out
