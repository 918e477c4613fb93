"""Runs exactly the code of the examples in docs/readme/natgrad.md and checks their output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "readme" / "natgrad.md"


def test_readme_examples_run_and_print_what_they_claim():
    text = DOC.read_text()
    snippets = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(snippets) == 2
    printed = []
    for snippet in snippets:
        expected = [line[2:] for line in snippet.splitlines() if line.startswith("# ")]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(snippet, str(DOC), "exec"), {})
        assert out.getvalue().splitlines() == expected
        printed += expected
    assert printed == ["cholesky True", "80 SOLVED 0.125 100"]
