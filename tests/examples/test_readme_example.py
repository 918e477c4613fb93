"""Runs exactly the Python snippet of docs/readme/portfolio.md and checks its printed output."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_readme_snippet_runs_and_prints_what_the_readme_says():
    text = (REPO_ROOT / "docs" / "readme" / "portfolio.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(code) == 1
    expected = re.search(r"prints\n\n```\n(.*?)```", text, flags=re.S)
    assert expected is not None
    buffer = io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(code[0], "docs/readme/portfolio.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert buffer.getvalue() == expected.group(1)
