"""The repeated forwards of one estimate see one random state and leave module state once.

A zeroth-order or forward-mode estimate evaluates the loss several times at nearby
parameters and combines the results, e.g. :math:`c = (\\ell(\\theta+\\epsilon z) -
\\ell(\\theta-\\epsilon z)) / 2\\epsilon`. That difference is a directional derivative of *one*
function only if every evaluation sees the same randomness (dropout masks) and the same module
state. :class:`ForwardReplay` wraps the loss so that, within one estimate,

- every forward starts from the global RNG state the estimate started with (CPU, and every
  initialised CUDA device), and afterwards the RNG is left where *one* forward leaves it, so
  consecutive estimates still draw fresh masks;
- buffers of the modules the loss calls (e.g. BatchNorm ``running_mean``/``running_var``/
  ``num_batches_tracked``) are restored after the estimate to their values after the
  *first* forward, i.e. they are updated once per estimate, not once per forward. Modules are
  found through a global forward pre-hook while a forward runs, so a loss written with
  :func:`torch.func.functional_call` needs no extra argument.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.module import register_module_forward_pre_hook

LossFn = Callable[[Mapping[str, Tensor], Any], Tensor]


def _rng_state() -> tuple[Tensor, list[Tensor]]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[Tensor, list[Tensor]]) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


class ForwardReplay:
    """Calls ``loss_fn(params, batch)`` with the same RNG state each time (see the module
    docstring); :meth:`finish` leaves the RNG and buffers as after the first call.

    Use it through :func:`replayed_forwards`.
    """

    def __init__(self, loss_fn: LossFn) -> None:
        self.loss_fn = loss_fn
        self.calls = 0
        self._start: tuple[Tensor, list[Tensor]] | None = None
        self._after_first: tuple[Tensor, list[Tensor]] | None = None
        # id(buffer) -> (buffer, value before the estimate, value after the first forward)
        self._buffers: dict[int, tuple[Tensor, Tensor, Tensor | None]] = {}

    def _see_module(self, module: nn.Module, args: Any) -> None:
        for buf in module.buffers(recurse=False):
            if id(buf) not in self._buffers:
                self._buffers[id(buf)] = (buf, buf.detach().clone(), None)

    def __call__(self, params: Mapping[str, Tensor], batch: Any) -> Tensor:
        if self._start is None:
            self._start = _rng_state()
        else:
            _set_rng_state(self._start)
        handle = register_module_forward_pre_hook(self._see_module)
        try:
            out = self.loss_fn(params, batch)
        finally:
            handle.remove()
        if self.calls == 0:
            self._after_first = _rng_state()
            for key, (buf, before, _) in list(self._buffers.items()):
                self._buffers[key] = (buf, before, buf.detach().clone())
        self.calls += 1
        return out

    def finish(self) -> None:
        """Leave the RNG as one forward leaves it and each buffer as after the first forward
        (buffers first met in a later forward get their value from before the estimate)."""
        if self._after_first is not None:
            _set_rng_state(self._after_first)
        with torch.no_grad():
            for buf, before, after in self._buffers.values():
                buf.copy_(before if after is None else after)


@contextlib.contextmanager
def replayed_forwards(loss_fn: LossFn) -> Iterator[ForwardReplay]:
    """``with replayed_forwards(loss_fn) as forward: ... forward(params, batch) ...``."""
    replay = ForwardReplay(loss_fn)
    try:
        yield replay
    finally:
        replay.finish()
