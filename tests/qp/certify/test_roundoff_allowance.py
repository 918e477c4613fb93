"""The stationarity test allows the round-off of its own evaluation, componentwise, on every
route (:data:`dxopt.qp.certify.tolerances.EVALUATION_ROUNDOFF`; Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., eq. 3.5).

The point: ``P = I``, two opposite active rows ``x_1 <= 1`` and ``-x_1 <= -1`` with equal huge
multipliers ``K`` (their terms cancel exactly in :math:`G^\\top\\nu`, so the norm scale of the
dual tolerance stays ~1) and a stationarity residual ``e`` put in component 1. The
evaluation's terms there are :math:`|P||x| + |q| + |G|^\\top|\\nu| \\approx 2K`: a residual of
half the allowance :math:`t_d + cu(2K + 2)` is ~20 times :math:`t_d` (the old rule rejected
it on every route), one of ten times the allowance is a genuine error and still rejected.
"""

from __future__ import annotations

import numpy as np
import pytest

from dxopt.qp.certify.tolerances import EVALUATION_ROUNDOFF

from .test_routes_agree import _verdicts
from .test_routes_agree import route_tolerances as route_tolerances  # the fixture

K = 1e8


def split_point(e: float) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    x = np.array([1.0, 0.0, 0.5])
    mu, nu = np.zeros(1), np.array([K, K])
    d = {
        "P": np.eye(3),
        "q": np.array([-1.0 + e, 0.0, -0.5]),
        "A": np.array([[0.0, 0.0, 1.0]]),
        "b": np.array([0.5]),
        "G": np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]),
        "h": np.array([1.0, -1.0]),
    }
    return d, x, mu, nu


@pytest.mark.parametrize(("fraction", "accept"), [(0.5, True), (10.0, False)])
def test_residual_within_its_evaluation_roundoff(route_tolerances, fraction, accept):
    tol = route_tolerances
    eps_abs, rel = tol["certify_point"]["eps_abs"], tol["certify_point"]["rel"]
    t_d = eps_abs + rel * 1.0  # max(|Px|, |q|, |A'mu|, |G'nu|) = 1 (G'nu = 0 exactly)
    allowance = t_d + EVALUATION_ROUNDOFF * (2 * K + 2.0)
    e = fraction * allowance
    assert e > 10 * t_d  # the old rule (t_d alone) rejects both points
    d, x, mu, nu = split_point(e)
    residual = x[0] + d["q"][0] + (nu[0] - nu[1])  # the residual the certificates evaluate
    assert abs(residual - e) <= 1e-15
    verdicts = _verdicts(d, x, mu, nu, tol)
    assert len(verdicts) >= 4, verdicts
    assert all(v == accept for v in verdicts.values()), (fraction, verdicts)
