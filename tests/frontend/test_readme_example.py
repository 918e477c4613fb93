"""The example of docs/readme/frontend.md runs and prints exactly the documented output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("cvxpy")

README = Path(__file__).resolve().parents[2] / "docs" / "readme" / "frontend.md"


def test_readme_example_prints_what_it_says() -> None:
    text = README.read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(code) == 1
    expected = re.search(r"prints\n\n```\n(.*?)```", text, flags=re.S)
    assert expected is not None
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code[0], str(README), "exec"), {})
    assert buffer.getvalue() == expected.group(1)
