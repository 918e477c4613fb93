"""Runs exactly the code of the README section (docs/readme/bilevel.md) and checks its output."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "docs" / "readme" / "bilevel.md"


def _snippet() -> str:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/readme/bilevel.md has no python example"
    return blocks[0]


def test_readme_example_runs_and_prints_what_it_claims(capsys) -> None:
    exec(compile(_snippet(), str(README), "exec"), {"__name__": "readme"})
    lines = capsys.readouterr().out.strip().splitlines()
    assert float(lines[0]) < 1e-10  # AID-CG agrees with the exact hypergradient
    status, calls, bound = lines[1].split()
    assert status == "solved"
    assert int(calls) == 2702 and int(bound) == 36  # exact counts, as printed in the README
    assert lines[2] == "Cost(grad_f=51, grad_g=1275, hvps=1325, jvps=51)"
