"""Fixtures for the ``dxopt.qp`` tests; the problem builders live in ``qp_zoo`` (import them
with ``from qp_zoo import ...``; pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from qp_zoo import (
    QPData,
    complementary_qp,
    dense_random_qp,
    simplex_projection,
    simplex_qp,
    simplex_vjp,
    sparse_complementary_qp,
    stack,
    weakly_active_qp,
)

__all__ = [
    "QPData",
    "complementary_qp",
    "dense_random_qp",
    "simplex_projection",
    "simplex_qp",
    "simplex_vjp",
    "sparse_complementary_qp",
    "stack",
    "weakly_active_qp",
]


@pytest.fixture
def small_complementary_qp() -> QPData:
    """n = 8, m = 6, p = 2 strictly complementary problem with known solution."""
    return complementary_qp(8, m=6, p=2, seed=0)
