"""The ``dxopt`` command line: one usage style, --version, help everywhere, no raw markup."""

from __future__ import annotations

import argparse
import re

import pytest

import dxopt
from dxopt import cli

AREAS = ("bilevel", "dfl", "estimators", "natgrad", "qp")
DEMOS = ("energy", "portfolio", "shortest_path", "transportation")


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(list(argv))
    assert info.value.code == 0
    return capsys.readouterr().out


def _assert_plain(text: str) -> None:
    assert "``" not in text and not re.search(r":[a-z]+:`", text), text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _help(capsys, "--version").strip() == f"dxopt {dxopt.__version__}"


def test_top_level_and_demo_and_bench_help(capsys: pytest.CaptureFixture[str]) -> None:
    top = _help(capsys, "--help")
    assert "{bench,demo}" in top and "--version" in top
    demo = _help(capsys, "demo", "--help")
    assert demo.startswith(
        "usage: dxopt demo {energy,portfolio,ray_qp,shortest_path,transportation}"
    )
    assert re.search(r"^\s+portfolio\s+Multi-period portfolio", demo, flags=re.M)
    bench = _help(capsys, "bench", "--help")
    assert bench.startswith(
        "usage: dxopt bench "
        "{bilevel,conic,dfl,estimators,linearize,multi_attempt,natgrad,qp,qp_cvxpy,qp_ray,qp_speed,"
        "qp_torch,all}"
    )
    for area in AREAS:
        assert re.search(rf"^\s+{area}\s+\S", bench, flags=re.M), area
    for text in (top, demo, bench):
        _assert_plain(text)


@pytest.mark.parametrize("command", [*(("demo", d) for d in DEMOS), *(("bench", a) for a in AREAS)])
def test_every_script_has_one_usage_style_and_help_on_every_option(
    command: tuple[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dxopt <bench|demo> <name> --help`` names itself that way, every option has a help
    string, and list options take space-separated values (nargs), never comma lists."""
    parsers: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def spy(self, args=None, namespace=None):
        parsers.append(self)
        return original(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    text = _help(capsys, *command, "--help")
    assert text.startswith(f"usage: dxopt {command[0]} {command[1]} ")
    _assert_plain(text)
    script = parsers[-1]
    for action in script._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{command}: option {action.option_strings} has no help"
        if action.default is not None and isinstance(action.default, list):
            assert action.nargs in ("+", "*"), f"{action.option_strings} is not space separated"


def test_unknown_names_are_refused_with_the_choices() -> None:
    with pytest.raises(SystemExit, match="unknown area 'foo'; expected one of: bilevel"):
        cli.main(["bench", "foo"])
    with pytest.raises(SystemExit, match="unknown demo 'foo'; expected one of: energy, portfolio"):
        cli.main(["demo", "foo"])


def test_bench_outside_a_source_checkout_says_it_needs_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "_find_source_root", lambda: None)
    with pytest.raises(SystemExit, match="need a source checkout of dxopt"):
        cli.main(["bench", "qp", "--quick"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--problems", "bogus"], "invalid choice: 'bogus' (choose from 'poisson2d', 'heat1d'"),
        (["--methods", "bogus"], "invalid choice: 'bogus' (choose from 'Adam', 'L-BFGS', 'ENGD'"),
        (["--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
        (["--budget-scale", "-1"], "argument --budget-scale: expected a finite number > 0"),
    ],
)
def test_bad_natgrad_bench_options_are_argparse_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "natgrad", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_without_an_area_names_only_the_area(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["bench"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: area\n" in err and "args" not in err
    assert "usage: dxopt bench {bilevel," in err


def test_smoke_runs_replace_verdicts() -> None:
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.common import SMOKE_VERDICT, smoke_verdicts, verdict

    rows = [{"target": "a", "verdict": "MISSED"}, {"target": "b", "verdict": "-"}]
    assert [r["verdict"] for r in smoke_verdicts(rows)] == [SMOKE_VERDICT, "-"]
    assert verdict(False, quick=False) == "MISSED" and verdict(True, quick=False) == "PASS"
    assert verdict(False, quick=True) == SMOKE_VERDICT
