"""Central finite differences that know about kinks (no verdict where a kink or noise shows)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

STEPS = (1e-4, 1e-5, 1e-6)


def central_quotient(
    f: Callable[[np.ndarray], float], x0: np.ndarray, direction: np.ndarray, *, rtol: float = 1e-6
):
    """The central difference quotient of ``f`` along ``direction``, or ``None`` (no verdict)
    when the quotients at ``STEPS`` disagree or a one-sided quotient shows a kink at ``x0``."""
    f0 = f(x0)
    plus = [f(x0 + t * direction) for t in STEPS]
    minus = [f(x0 - t * direction) for t in STEPS]
    central = [(a - b) / (2 * t) for a, b, t in zip(plus, minus, STEPS)]
    scale = 1 + max(abs(c) for c in central)
    if max(central) - min(central) > rtol * scale:
        return None
    sides = ((plus[-1] - f0) / STEPS[-1], (f0 - minus[-1]) / STEPS[-1])
    if max(abs(s - central[-1]) for s in sides) > 1e-4 * scale:  # a kink at x0
        return None
    return central[-1]
