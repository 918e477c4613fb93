"""The smoothed-gradient example of docs/readme/qp.md runs and prints exactly the documented
output (the block after its ``<!-- tested: smoothed -->`` marker)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "docs" / "readme" / "qp.md"


def test_readme_smoothed_block_output_matches() -> None:
    text = README.read_text()
    found = re.search(
        r"<!-- tested: smoothed -->\n```python\n(.*?)```\n\nOutput:\n\n```text\n(.*?)```",
        text,
        re.S,
    )
    assert found is not None, f"no tested block 'smoothed' in {README}"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(found.group(1), str(README), "exec"), {"__name__": "readme_example"})
    assert buffer.getvalue() == found.group(2)
