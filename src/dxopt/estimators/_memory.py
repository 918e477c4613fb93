"""CPU memory accounting of one estimate: peak bytes of live tensors, bytes saved for backward.

:class:`MemoryTracker` is a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that
sees every tensor an operator creates. It counts each new storage once (keyed by its data
pointer; outputs that alias an input, i.e. views and in-place results, are not new) and
subtracts it when the storage is freed (``weakref.finalize``), so
``peak_bytes`` is the high-water mark of storages allocated *inside* the ``with`` block
(parameters and inputs created before it are not counted). Alongside,
:func:`torch.autograd.graph.saved_tensors_hooks` sums the distinct storages autograd saves
for the backward pass (``saved_bytes``). Tensors saved inside a non-reentrant checkpoint are
handled by the checkpoint's own hooks (they are recomputed, not kept) and therefore not counted
there; the checkpoint's recomputation shows up in ``peak_bytes`` instead. What a selective
checkpoint *keeps* (the outputs of its ``save_ops``, held in the checkpoint's cache until the
backward) is saved for backward too: :func:`dxopt.estimators.run_blocks` reports each such
output through :func:`note_saved`, so ``saved_bytes`` counts it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import TracebackType

from torch import Tensor
from torch.autograd.graph import saved_tensors_hooks

from dxopt._core.torch_compat import TorchDispatchMode, tree_flatten


@dataclass(frozen=True)
class MemoryReport:
    """Memory used inside a :class:`MemoryTracker` block.

    Attributes:
        peak_bytes: high-water mark of bytes of live tensor storages created in the block.
        saved_bytes: bytes of distinct storages saved for backward in the block (parameters
            and inputs included).
        saved_activation_bytes: the part of ``saved_bytes`` whose storages were created in
            the block (activations), i.e. memory held *only* for the backward pass.
        allocated_bytes: total bytes of all storages created in the block (freed or not).
    """

    peak_bytes: int
    saved_bytes: int
    saved_activation_bytes: int
    allocated_bytes: int


class _LiveStorages(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0
        self.allocated = 0

    def _release(self, ptr: int) -> None:
        size = self.live.pop(ptr, 0)
        self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_ptr(a) for a in tree_flatten((args, kwargs or {}))[0]}
        flat, _ = tree_flatten(out)
        for t in flat:
            if not isinstance(t, Tensor):
                continue
            try:
                storage = t.untyped_storage()
                ptr, size = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # tensors without a real storage
                continue
            if ptr in self.live or ptr in inputs or size == 0:
                continue  # already counted, a view/in-place result of an input, or empty
            self.live[ptr] = size
            self.current += size
            self.allocated += size
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._release, ptr)
        return out


_ACTIVE: list[MemoryTracker] = []  # the trackers whose block is running, innermost last


def note_saved(t: Tensor) -> None:
    """Count ``t`` as saved for backward in every running :class:`MemoryTracker` (for tensors
    kept by a mechanism other than autograd's saved-tensor hooks, e.g. a selective
    checkpoint's cache)."""
    for tracker in _ACTIVE:
        tracker._pack(t)


def _storage_ptr(t: object) -> int | None:
    if not isinstance(t, Tensor):
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class MemoryTracker:
    """Context manager measuring the CPU memory of the tensors created inside it.

    Example:
        >>> import torch
        >>> from dxopt.estimators import MemoryTracker
        >>> x = torch.ones(1000, requires_grad=True)
        >>> with MemoryTracker() as tracker:
        ...     y = (x * x).sum()  # saves x twice (one storage), allocates x*x and y
        >>> tracker.report.saved_bytes, tracker.report.peak_bytes
        (4000, 4004)
    """

    def __init__(self) -> None:
        self._mode = _LiveStorages()
        self._saved: dict[int, int] = {}
        self._saved_new: set[int] = set()
        self._hooks = saved_tensors_hooks(self._pack, self._unpack)
        self._report: MemoryReport | None = None

    def _pack(self, t: Tensor) -> Tensor:
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            self._saved.setdefault(ptr, storage.nbytes())
            if ptr in self._mode.live:
                self._saved_new.add(ptr)
        except (RuntimeError, NotImplementedError):
            pass
        return t

    @staticmethod
    def _unpack(t: Tensor) -> Tensor:
        return t

    def __enter__(self) -> MemoryTracker:
        self._hooks.__enter__()
        self._mode.__enter__()
        _ACTIVE.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self._mode.__exit__(exc_type, exc, tb)
        self._hooks.__exit__(exc_type, exc, tb)
        self._report = MemoryReport(
            peak_bytes=self._mode.peak,
            saved_bytes=sum(self._saved.values()),
            saved_activation_bytes=sum(self._saved[p] for p in self._saved_new),
            allocated_bytes=self._mode.allocated,
        )

    @property
    def report(self) -> MemoryReport:
        """The :class:`MemoryReport` (available after the ``with`` block)."""
        if self._report is None:
            raise RuntimeError("report: the MemoryTracker block has not finished yet.")
        return self._report
