"""The ``dxopt`` command line.

- ``dxopt bench <area> [options]`` runs the benchmark of one area (qp, natgrad, estimators,
  bilevel) or ``all``; ``dxopt bench <area> --help`` shows its options. Benchmarks live in
  the source checkout (``benchmarks/``), not in the wheel: from a wheel install the command
  says so and exits.
- ``dxopt demo <name> [options]`` runs an example (``examples/<name>/run.py``), which the wheel
  ships as well; ``dxopt demo --help`` lists them.
- ``dxopt --version`` prints the installed version.

Every area's options follow one style: lists are space separated (``--seeds 0 1 2``),
``--quick`` is a smoke run under a minute writing to a temporary folder, ``--out`` overrides
the output folder.
"""

from __future__ import annotations

import argparse
import ast
import re
import runpy
import sys
from pathlib import Path

from dxopt import __version__

__all__ = ["main"]

BENCH_AREAS = (
    "qp",
    "natgrad",
    "estimators",
    "bilevel",
    "multi_attempt",
    "linearize",
    "qp_torch",
    "qp_ray",
    "qp_speed",
    "qp_cvxpy",
    "dfl",
)
_PACKAGE_DIR = Path(__file__).resolve().parent


def _find_source_root() -> Path | None:
    """The dxopt source checkout (a folder with ``benchmarks/`` and ``examples/``), if any:
    next to the imported package (editable install), else the working directory or a parent."""
    cwd = Path.cwd().resolve()
    for root in (_PACKAGE_DIR.parents[1], cwd, *cwd.parents):
        if (root / "benchmarks").is_dir() and (root / "examples").is_dir():
            return root
    return None


def _demo_root() -> Path:
    """The folder that holds the ``examples`` package: the checkout, else the bundled copy."""
    source = _find_source_root()
    return source if source is not None else _PACKAGE_DIR / "_demos"


def _available(root: Path, folder: str) -> list[str]:
    return sorted(p.parent.name for p in (root / folder).glob("*/run.py"))


def _plain(text: str) -> str:
    """Drop reST markup (``code``, :role:`text`) for the terminal."""
    text = re.sub(r":[a-z]+:`([^`]*)`", r"\1", text)
    return text.replace("``", "").replace("\\\\", "\\")


def summary(script: Path) -> str:
    """The first sentence of a script's docstring, read without importing it, markup-free."""
    try:
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError):
        return ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return _plain(first.split(". ")[0].rstrip("."))


def _listing(root: Path | None, folder: str, names: list[str]) -> str:
    lines = []
    for name in names:
        about = summary(root / folder / name / "run.py") if root is not None else ""
        lines.append(f"  {name:<12} {about}".rstrip())
    return "\n".join(lines)


def _run_script(root: Path, folder: str, name: str, args: list[str], command: str) -> None:
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    sys.modules.pop(f"{folder}.{name}.run", None)  # run it fresh, as a script
    saved_argv = sys.argv
    sys.argv = [command, *args]
    try:
        runpy.run_module(f"{folder}.{name}.run", run_name="__main__")
    finally:
        sys.argv = saved_argv


def _bench(area: str, args: list[str]) -> None:
    root = _find_source_root()
    if root is None:
        raise SystemExit(
            "dxopt bench: the benchmarks need a source checkout of dxopt; they are not part of "
            "the installed package. Clone the dxopt repository, install it with "
            "`pip install -e '.[bench]'` (or `make venv`) and run `dxopt bench "
            f"{area}` inside the clone."
        )
    areas = _available(root, "benchmarks")
    if area != "all" and area not in areas:
        raise SystemExit(
            f"dxopt bench: unknown area {area!r}; expected one of: {', '.join(areas)} or all."
        )
    for name in areas if area == "all" else [area]:
        _run_script(root, "benchmarks", name, args, f"dxopt bench {name}")


def _demo(name: str, args: list[str]) -> None:
    root = _demo_root()
    demos = _available(root, "examples")
    if name not in demos:
        raise SystemExit(
            f"dxopt demo: unknown demo {name!r}; expected one of: {', '.join(demos) or 'none'}."
        )
    _run_script(root, "examples", name, args, f"dxopt demo {name}")


def _parser() -> argparse.ArgumentParser:
    source = _find_source_root()
    demo_root = _demo_root()
    demos = _available(demo_root, "examples")
    areas = _available(source, "benchmarks") if source is not None else list(BENCH_AREAS)
    parser = argparse.ArgumentParser(
        prog="dxopt",
        description="dxopt: differentiable optimization and gradient estimation for PyTorch.",
        epilog="Run `dxopt bench --help` or `dxopt demo --help` for the areas and demos, and "
        "`dxopt bench <area> --help` or `dxopt demo <name> --help` for their options.",
    )
    parser.add_argument("--version", action="version", version=f"dxopt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench,demo}")
    bench_epilog = (
        "areas:\n" + _listing(source, "benchmarks", areas) + "\n  all          every area"
    )
    if source is None:
        bench_epilog += "\n\nThe benchmarks need a source checkout of dxopt (not in the wheel)."
    bench = sub.add_parser(
        "bench",
        help="run a benchmark area (needs a source checkout)",
        description="Run the benchmark of one area and write its results and its section of "
        "BENCHMARKS.md (with --quick: a smoke run into a temporary folder).",
        epilog=bench_epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"dxopt bench {{{','.join(areas)},all}} [options]",
    )
    bench.add_argument("area", metavar="area", help="the area to run, or all")
    bench_args = bench.add_argument(
        "args", nargs=argparse.REMAINDER, help="options of the area (see dxopt bench AREA --help)"
    )
    bench_args.required = False  # may be empty: not in "the following arguments are required"
    demo = sub.add_parser(
        "demo",
        help="run an example end to end",
        description="Run an example; the demos ship with the package.",
        epilog="demos:\n" + _listing(demo_root, "examples", demos),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"dxopt demo {{{','.join(demos)}}} [options]",
    )
    demo.add_argument("name", metavar="name", help="the demo to run")
    demo_args = demo.add_argument(
        "args", nargs=argparse.REMAINDER, help="options of the demo (see dxopt demo NAME --help)"
    )
    demo_args.required = False
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dxopt`` command."""
    ns = _parser().parse_args(argv)
    if ns.command == "bench":
        _bench(ns.area, list(ns.args))
    else:
        _demo(ns.name, list(ns.args))


if __name__ == "__main__":
    main()
