"""Runs exactly the code of the example in docs/readme/linearize.md and checks its output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "readme" / "linearize.md"


def test_readme_example_runs_and_prints_what_it_claims():
    text = DOC.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    snippet = code.group(1)
    expected = [line[2:] for line in snippet.splitlines() if line.startswith("# ")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, str(DOC), "exec"), {})
    assert (
        out.getvalue().splitlines()
        == expected
        == [
            "equal at theta0: True",
            "affine in tau: True",
            "distil to itself: 0.0",
        ]
    )
