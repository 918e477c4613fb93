"""The estimator variants compared, per task, with their learning rates and step budgets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dxopt.estimators import (
    LOZO,
    SPSA,
    ZOSVRG,
    Backprop,
    CheckpointPlan,
    FmADSVRG,
    ForwardGradient,
)


@dataclass(frozen=True)
class Method:
    name: str
    family: str  # "bp", "fmad" or "zo"
    make: Callable[[int, Any], Any]  # (seed, anchor_batch) -> estimator
    lr: float
    steps: int
    optimizer: str = "sgd"  # "sgd" (momentum 0.9) or "adam"


IGNORE = "ignore"  # non-finite estimates are counted (RunResult.nonfinite), not raised

CANDIDATE_PLANS = {
    "none": CheckpointPlan(strategy="none"),
    "selective(mm)": CheckpointPlan(strategy="selective", save_ops=("mm", "addmm", "bmm")),
    "segments(2)": CheckpointPlan(strategy="segments", segments=2),
    "segments(3)": CheckpointPlan(strategy="segments", segments=3),
    "per_block": CheckpointPlan(strategy="per_block"),
}


def digits_methods(plan: CheckpointPlan, scale: float = 1.0) -> list[Method]:
    """All variants on the digits MLP; ``scale`` shrinks the step budgets (quick runs).

    Learning rates: the largest of a coarse grid (seed 0) that did not diverge.
    """

    def n(steps: int) -> int:
        return max(2, int(steps * scale))

    def svrg(cls: type) -> Callable[[int, Any], Any]:
        return lambda s, a: cls(
            refresh_every=50, anchor_directions=64, anchor_batch=a, seed=s, on_failure=IGNORE
        )

    return [
        Method("bp", "bp", lambda s, a: Backprop(), 0.05, n(300)),
        Method("bp-ckpt", "bp", lambda s, a: Backprop(checkpoint=plan), 0.05, n(300)),
        Method(
            "fg-k1", "fmad", lambda s, a: ForwardGradient(seed=s, on_failure=IGNORE), 1e-4, n(1500)
        ),
        Method(
            "fg-k16",
            "fmad",
            lambda s, a: ForwardGradient(k=16, seed=s, on_failure=IGNORE),
            3e-3,
            n(300),
        ),
        Method(
            "fg-k16-proj",
            "fmad",
            lambda s, a: ForwardGradient(k=16, combine="projection", seed=s, on_failure=IGNORE),
            3.0,
            n(200),
        ),
        Method("fmad-svrg", "fmad", svrg(FmADSVRG), 3e-4, n(400)),
        Method(
            "zo-n1", "zo", lambda s, a: SPSA(eps=1e-3, seed=s, on_failure=IGNORE), 1e-4, n(1500)
        ),
        Method(
            "zo-n16",
            "zo",
            lambda s, a: SPSA(eps=1e-3, n_directions=16, seed=s, on_failure=IGNORE),
            3e-3,
            n(300),
        ),
        Method(
            "zo-sparse1%",
            "zo",
            lambda s, a: SPSA(eps=1e-3, keep_fraction=0.01, seed=s, on_failure=IGNORE),
            1e-2,
            n(1000),
        ),
        Method(
            "lozo-r2",
            "zo",
            lambda s, a: LOZO(eps=1e-3, rank=2, seed=s, on_failure=IGNORE),
            1e-4,
            n(1500),
        ),
        Method("zo-svrg", "zo", svrg(ZOSVRG), 3e-4, n(400)),
    ]


def minilm_methods(plan: CheckpointPlan, scale: float = 1.0) -> list[Method]:
    """The MiniLM + LoRA variants (fewer: a forward costs ~0.2 s on one shared core)."""

    def n(steps: int) -> int:
        return max(2, int(steps * scale))

    return [
        Method("bp", "bp", lambda s, a: Backprop(), 3e-3, n(20), "adam"),
        Method("bp-ckpt", "bp", lambda s, a: Backprop(checkpoint=plan), 3e-3, n(20), "adam"),
        Method(
            "fg-k1",
            "fmad",
            lambda s, a: ForwardGradient(seed=s, on_failure=IGNORE),
            1e-3,
            n(60),
            "adam",
        ),
        Method(
            "zo-n1",
            "zo",
            lambda s, a: SPSA(eps=1e-3, seed=s, on_failure=IGNORE),
            1e-3,
            n(120),
            "adam",
        ),
    ]
