"""Runs exactly the code of the README section (docs/readme/bilevel.md) and checks its output."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "docs" / "readme" / "bilevel.md"


def _blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 2, "docs/readme/bilevel.md should have two python examples"
    return blocks


def _printed(after: int) -> list[str]:
    """The lines of the README's ``prints`` block that follows python block ``after``."""
    text = README.read_text()
    tail = text.split("```python\n")[after + 1].split("```\n", 1)[1]
    return re.findall(r"```\n(.*?)```", tail, flags=re.S)[0].strip().splitlines()


def _run(code: str, capsys) -> list[str]:
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    return capsys.readouterr().out.strip().splitlines()


def test_readme_example_runs_and_prints_what_it_claims(capsys) -> None:
    lines = _run(_blocks()[0], capsys)
    capped, certified = lines[0].split(), lines[1].split()
    assert capped[0] == "max_iter" and float(capped[1]) > 1e-7  # not certified, and wrong
    assert certified[0] == "solved" and float(certified[1]) < 1e-10  # certified, and right
    status, calls, bound = lines[2].split()
    assert status == "solved"
    assert int(calls) == 2702 and int(bound) == 36  # exact counts, as printed in the README
    assert lines[3] == "Cost(grad_f=51, grad_g=1275, hvps=1325, jvps=51)"
    printed = _printed(0)  # all but the round-off-level error, which depends on the BLAS
    assert [lines[0], certified[0], *lines[2:]] == [printed[0], "solved", *printed[2:]]


def test_readme_weight_decay_example_lowers_the_validation_loss(capsys) -> None:
    lines = _run(_blocks()[1], capsys)
    pattern = r"step (\d): weight decay ([\d.]+), val MSE ([\d.]+)"
    (s0, wd0, mse0), (s7, wd7, mse7) = (re.fullmatch(pattern, line).groups() for line in lines)
    assert (s0, s7) == ("0", "7") and float(wd0) == 1.0
    assert float(wd7) < 0.5 * float(wd0) and float(mse7) < 0.9 * float(mse0)
    claimed = [re.fullmatch(pattern, line).groups() for line in _printed(1)]
    for (_, wd, mse), (_, wd_c, mse_c) in zip(((s0, wd0, mse0), (s7, wd7, mse7)), claimed):
        assert abs(float(wd) - float(wd_c)) <= 0.01 and abs(float(mse) - float(mse_c)) <= 0.01
