"""The warm-start and torch.compile examples of docs/readme/qp.md run and print exactly the
documented output (each block follows its ``<!-- tested: NAME -->`` marker)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[3] / "docs" / "readme" / "qp.md"


@pytest.mark.parametrize("name", ["warm_start", "compile"])
def test_readme_block_output_matches(name: str) -> None:
    text = README.read_text()
    found = re.search(
        rf"<!-- tested: {name} -->\n```python\n(.*?)```\n\nOutput:\n\n```text\n(.*?)```", text, re.S
    )
    assert found is not None, f"no tested block {name!r} in {README}"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(found.group(1), str(README), "exec"), {"__name__": "readme_example"})
    assert buffer.getvalue() == found.group(2)
