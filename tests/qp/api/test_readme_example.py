"""The example of docs/readme/qp.md runs and prints exactly the documented output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "docs" / "readme" / "qp.md"


def test_readme_example_output_matches() -> None:
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    output = re.search(r"Output:\n\n```text\n(.*?)```", text, re.S)
    assert code is not None and output is not None
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code.group(1), str(README), "exec"), {"__name__": "readme_example"})
    assert buffer.getvalue() == output.group(1)
