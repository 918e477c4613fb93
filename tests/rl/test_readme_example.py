"""Runs exactly the code block of docs/readme/rl.md and checks its printed output."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "docs" / "readme" / "rl.md"


def test_readme_snippet_runs_and_prints_what_it_claims():
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    claimed = [line.split("# ", 1)[1] for line in code.splitlines() if "print(" in line]
    assert out.getvalue().splitlines() == claimed
