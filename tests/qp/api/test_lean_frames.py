"""The tiny lean call's Python frames: a load-independent guard of its fixed cost.

One dense QP with n = 10 (forward plus ``(w * x).sum().backward()`` with gradients for ``q`` and
``h``, the ``qp_speed`` benchmark's tiny case) misses its target of 10x a raw daqp solve by
some 10-20% on the 2-core machine (BENCHMARKS.md, "QP call overhead"), and timings there move
by more than that with the load. The number of dxopt Python frames the call runs does not: each
costs some 0.2-0.5 us (more with the caches cold after the solver), so a layer added on this
path shows up here first. 39 frames before the lean modules were flattened (issue of the tiny
call, December 2026), 29 after.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

import numpy as np
import torch

import dxopt
import dxopt.qp as dqp

FRAME_BUDGET = 29
"""dxopt Python frames of one tiny forward+backward. Raise it only in the commit that adds a
frame to this path, saying why the frame is needed."""

_ROOT = os.path.dirname(dxopt.__file__)


def _tiny_case() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    rng = np.random.default_rng(0)
    M = rng.standard_normal((10, 10))
    data = {
        "P": torch.tensor(M @ M.T + np.eye(10)),
        "q": torch.tensor(rng.standard_normal(10), requires_grad=True),
        "G": torch.tensor(rng.standard_normal((5, 10))),
        "h": torch.tensor(rng.random(5), requires_grad=True),
    }
    return data, torch.tensor(rng.standard_normal(10))


def _dxopt_frames(call: Any) -> list[str]:
    """The dxopt functions entered while ``call()`` runs, in order."""
    names: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(_ROOT):
            names.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(previous)
    return names


def test_tiny_call_stays_within_its_frame_budget() -> None:
    data, w = _tiny_case()

    def forward_backward() -> Any:
        for t in data.values():
            t.grad = None
        sol = dqp.solve(**data, solver="daqp")
        (w * sol.x).sum().backward()
        return sol

    sol = forward_backward()  # first call: imports, numba caches
    assert "SmallQPFunction" in type(sol.x.grad_fn).__name__  # the lean path is measured
    frames = _dxopt_frames(forward_backward)
    assert data["q"].grad is not None and data["h"].grad is not None
    assert len(frames) <= FRAME_BUDGET, (
        f"the tiny lean call runs {len(frames)} dxopt Python frames, budget {FRAME_BUDGET}: "
        f"{frames}"
    )
