"""The relax / warm-start / compile / smoothed examples of docs/readme/conic.md run and print
exactly the documented output (each block follows its ``<!-- tested: NAME -->`` marker)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "docs" / "readme" / "conic.md"


@pytest.mark.parametrize("name", ["relax", "warm", "compile", "smoothed"])
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
