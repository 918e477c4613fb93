"""``row_inf``: the max-norm of every row, dense or scipy sparse, equals the dense reference
(empty rows, every sparse format, duplicate entries summed before the norm)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dxopt.qp.certify.polish import row_inf


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("density", [0.0, 0.02, 0.4])
def test_row_inf_matches_dense(fmt: str, density: float) -> None:
    M = sp.random(60, 30, density=density, format=fmt, random_state=3) * -2.5
    expected = np.abs(M.toarray()).max(axis=1)
    assert np.array_equal(row_inf(M), expected)
    assert np.array_equal(row_inf(M.toarray()), expected)


def test_row_inf_sums_duplicates_first() -> None:
    # row 0 holds 1 and -3 at the same column: the entry is -2, its norm 2 (not 3)
    M = sp.csr_matrix(
        (np.array([1.0, -3.0, 2.0]), np.array([1, 1, 0]), np.array([0, 2, 3, 3])), shape=(3, 2)
    )
    assert not M.has_canonical_format
    assert row_inf(M).tolist() == [2.0, 2.0, 0.0]
    assert M.data.tolist() == [1.0, -3.0, 2.0]  # the caller's matrix is left as it was


def test_row_inf_no_rows() -> None:
    assert row_inf(None).shape == (0,)
    assert row_inf(sp.csr_matrix((0, 4))).shape == (0,)
