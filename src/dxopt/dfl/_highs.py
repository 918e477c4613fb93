"""HiGHS (``highspy``) plumbing shared by the oracles of :mod:`dxopt.dfl`: a model built once
from matrices, created without HiGHS' start-up banner, and the mapping of HiGHS' model status
to :class:`dxopt.Status`."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

__all__ = ["import_highspy", "new_highs", "pass_model"]


def import_highspy(owner: str) -> Any:
    """``highspy``, or an ``ImportError`` saying how to get it."""
    try:
        import highspy
    except ImportError as err:
        raise ImportError(
            f"{owner} needs highspy (HiGHS): pip install 'dxopt[solvers]' (or pip install highspy)."
        ) from err
    return highspy


def new_highs(owner: str) -> Any:
    """A silent ``highspy.Highs()``: HiGHS writes its banner ("Running HiGHS ...") to the
    process' standard output (file descriptor 1, not :data:`sys.stdout`) when the first
    instance is created, before any option can be set, so file descriptor 1 is pointed at
    ``os.devnull`` for the construction and restored right after."""
    highspy = import_highspy(owner)
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no usable file descriptor 1 (embedded interpreters)
        hs = highspy.Highs()
    else:
        try:
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), 1)
                hs = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    hs.setOptionValue("output_flag", False)
    return hs


def pass_model(
    hs: Any,
    *,
    matrix: Any,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    col_lower: np.ndarray,
    col_upper: np.ndarray,
    integer: np.ndarray | None = None,
) -> None:
    """Pass the model ``row_lower <= matrix @ x <= row_upper``, ``col_lower <= x <= col_upper``
    (``integer``: a boolean mask of the integer columns) with a zero cost to ``hs``."""
    import highspy
    import scipy.sparse as sp

    mat = sp.csc_matrix(matrix)
    n = mat.shape[1]
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, mat.shape[0]
    lp.col_cost_ = np.zeros(n)
    lp.col_lower_, lp.col_upper_ = col_lower, col_upper
    lp.row_lower_, lp.row_upper_ = row_lower, row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = mat.indptr.astype(np.int32)
    lp.a_matrix_.index_ = mat.indices.astype(np.int32)
    lp.a_matrix_.value_ = mat.data.astype(np.float64)
    if integer is not None and integer.any():
        kinds = highspy.HighsVarType
        lp.integrality_ = [kinds.kInteger if i else kinds.kContinuous for i in integer]
    hs.passModel(lp)
