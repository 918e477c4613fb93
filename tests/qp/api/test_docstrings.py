"""The examples in the public docstrings of dxopt.qp run and print what they show."""

from __future__ import annotations

import doctest

import dxopt.qp.api.solve


def test_api_docstring_examples() -> None:
    result = doctest.testmod(dxopt.qp.api.solve, verbose=False)
    assert result.attempted > 0 and result.failed == 0
