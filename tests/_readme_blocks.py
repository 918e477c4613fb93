"""Run a README source's tested example: the ``python`` block after ``<!-- tested: NAME -->``
and the ``text`` block after it that holds what the example prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path


def readme_block_output(readme: Path, name: str) -> tuple[str, str]:
    """``(printed, documented)``: what block ``name`` of ``readme`` prints when run, and the
    output the README documents for it."""
    text = readme.read_text()
    found = re.search(
        rf"<!-- tested: {name} -->\n```python\n(.*?)```\n\nOutput:\n\n```text\n(.*?)```", text, re.S
    )
    assert found is not None, f"no tested block {name!r} in {readme}"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(found.group(1), str(readme), "exec"), {"__name__": "readme_example"})
    return buffer.getvalue(), found.group(2)
