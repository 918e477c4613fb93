"""Bad inputs get a TypeError/ValueError that names the argument and says what to do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dxopt.conic as dc

from ._problems import F64, ball_rows

A, B = ball_rows(2)
P = torch.eye(2, dtype=F64)
Q = torch.ones(2, dtype=F64)
CONES = [dc.SecondOrderCone(3)]


@pytest.mark.parametrize(
    ("args", "cones", "error", "match"),
    [
        ((P, Q, A, B[:2]), CONES, ValueError, "A: expected 2 rows"),
        ((P, Q[:1], A, B), CONES, ValueError, "A: expected 1 columns"),
        ((P[:1], Q, A, B), CONES, ValueError, r"P: expected shape \(2, 2\)"),
        ((P, Q.float(), A, B), CONES, ValueError, "mixed dtypes.*q: torch.float32"),
        (
            (P, Q, A, B),
            [dc.SecondOrderCone(2)],
            ValueError,
            "add up to 2 = 2, but A and b have m = 3",
        ),
        ((P, Q, A, B), [dc.NonnegCone(1), "soc"], TypeError, r"cones\[1\]"),
        ((P, Q, A, B), [], TypeError, "non-empty sequence"),
        ((P, Q.numpy(), A, B), CONES, TypeError, "q: expected a torch.Tensor"),
        ((P, Q.long(), A, B), CONES, TypeError, "q: expected dtype float32 or float64"),
        (
            (P, Q.expand(3, 2), A.expand(4, -1, -1), B),
            CONES,
            ValueError,
            "disagree on the batch size",
        ),
        ((P, Q * float("nan"), A, B), CONES, ValueError, "q: expected finite"),
        (
            (torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=F64), Q, A, B),
            CONES,
            ValueError,
            "P: expected a symmetric",
        ),
        ((-P, Q, A, B), CONES, ValueError, "P: expected a positive semidefinite"),
        ((P, Q.to_sparse(), A, B), CONES, TypeError, "q: expected a dense"),
        ((P, Q, A.to_sparse_csc(), B), CONES, TypeError, "A: expected a dense, sparse COO or"),
    ],
)
def test_bad_inputs_name_the_argument(args, cones, error, match):
    with pytest.raises(error, match=match):
        dc.solve(*args, cones=cones)


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"atol": 0.0}, "atol"),
        ({"solver": "mosek"}, "solver"),
        ({"on_failure": "explode"}, "on_failure"),
        ({"max_iter": 0}, "max_iter"),
        ({"polish": 1}, "polish"),
    ],
)
def test_bad_options_name_the_option(option, match):
    with pytest.raises((TypeError, ValueError), match=match):
        dc.solve(P, Q, A, B, cones=CONES, **option)


def test_options_are_keyword_only_and_the_layer_uses_them():
    with pytest.raises(TypeError):
        dc.solve(P, Q, A, B, CONES)  # type: ignore[misc]
    layer = dc.ConicLayer(cones=CONES, atol=1e-9)
    sol = layer(P, Q, A, B)
    assert layer.options.atol == 1e-9 and sol.status[0].ok
    assert np.isclose(float(sol.x.norm()), 1.0)  # -q points outside the unit ball
