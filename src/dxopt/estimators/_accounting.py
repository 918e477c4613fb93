"""FLOP counting and the "does the loss use every parameter?" probe."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from dxopt._core.torch_compat import TorchDispatchMode, tree_flatten
from dxopt.estimators._api import LossFn, check_params, check_scalar_loss, raise_unused


class FlopTally:
    """Holds the FLOPs counted by :func:`flop_scope` (``None`` when counting was off)."""

    def __init__(self) -> None:
        self.flops: int | None = None


@contextlib.contextmanager
def flop_scope(enabled: bool) -> Iterator[FlopTally]:
    """Count FLOPs of everything inside with :class:`FlopCounterMode` when ``enabled``."""
    tally = FlopTally()
    if not enabled:
        yield tally
        return
    mode = FlopCounterMode(display=False)
    with mode:
        yield tally
    tally.flops = int(mode.get_total_flops())


class _StorageReads(TorchDispatchMode):
    """Records the storage pointer of every tensor an operator reads."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat, _ = tree_flatten((args, kwargs or {}))
        for a in flat:
            if isinstance(a, Tensor):
                with contextlib.suppress(RuntimeError, NotImplementedError):
                    self.read.add(a.untyped_storage().data_ptr())
        return func(*args, **(kwargs or {}))


def check_loss_uses_params(loss_fn: LossFn, params: Mapping[str, Tensor], batch: Any) -> float:
    """One forward (no graph) that raises if the loss is not scalar or ignores a parameter.

    Zeroth-order and forward-mode estimators cannot see an unused parameter from their
    estimates (its directional derivative is just zero), so they run this probe once, on their
    first call. The probe passes *fresh copies* of the parameters and records which of them an
    operator reads: a loss that reads the model's own tensors instead of ``params`` (e.g.
    ``model(x)`` with ``params = dict(model.named_parameters())``, which share storage) is
    caught, where probing the originals would see the shared storage being read. It is not
    counted in :class:`~dxopt._core.Cost`.

    Returns:
        The loss value.
    """
    copies = {n: p.detach().clone() for n, p in params.items()}
    probe = _StorageReads()
    with torch.no_grad(), probe:
        loss = check_scalar_loss(loss_fn(copies, batch))
    unused = [n for n, p in copies.items() if p.untyped_storage().data_ptr() not in probe.read]
    raise_unused(unused)
    return float(loss)


class ProbesOnce:
    """Mixin for estimators that cannot see unused parameters in their estimates.

    :meth:`_checked_params` validates ``params`` on every call and, when ``validate`` is set,
    runs :func:`check_loss_uses_params` on the first call only (through ``forward``, the
    estimate's :class:`~dxopt._core.replay.ForwardReplay`, so the probe's forward draws
    the same dropout mask and updates buffers no more than the estimate's own forwards).
    """

    validate: bool
    _validated: bool = False

    def _checked_params(
        self, forward: LossFn, params: Mapping[str, Tensor], batch: Any
    ) -> dict[str, Tensor]:
        checked = check_params(params)
        if self.validate and not self._validated:
            check_loss_uses_params(forward, checked, batch)
            self._validated = True
        return checked
