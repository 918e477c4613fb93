"""The ``dxopt`` command line.

``dxopt bench <area> [args...]`` runs ``benchmarks/<area>/run.py`` (areas: qp, natgrad,
estimators, bilevel, or ``all``) and ``dxopt demo <name> [args...]`` runs
``examples/<name>/run.py``. Extra arguments are passed to the script; ``--help`` after the
area or name shows its options. Benchmarks and examples live in the source checkout (the
package is installed in editable mode by ``make``), so the command looks for them next to the
installed package and then upwards from the working directory.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

BENCH_AREAS = ("qp", "natgrad", "estimators", "bilevel")


def _find_repo_root() -> Path:
    candidates = [Path(__file__).resolve().parents[2], *Path.cwd().resolve().parents]
    candidates.insert(1, Path.cwd().resolve())
    for root in candidates:
        if (root / "benchmarks").is_dir() and (root / "examples").is_dir():
            return root
    raise SystemExit(
        "dxopt: could not find the 'benchmarks/' and 'examples/' folders. Run the command from "
        "a dxopt source checkout (installed with `pip install -e .` or `make`)."
    )


def _available(root: Path, folder: str) -> list[str]:
    return sorted(p.parent.name for p in (root / folder).glob("*/run.py"))


def _run_module(root: Path, folder: str, name: str, args: list[str]) -> None:
    script = root / folder / name / "run.py"
    if not script.is_file():
        choices = ", ".join(_available(root, folder)) or "none yet"
        raise SystemExit(f"dxopt: unknown {folder[:-1]} {name!r}; expected one of: {choices}.")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    saved_argv = sys.argv
    sys.argv = [f"dxopt {folder[:-1]} {name}", *args]
    try:
        runpy.run_module(f"{folder}.{name}.run", run_name="__main__")
    finally:
        sys.argv = saved_argv


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``dxopt`` command."""
    parser = argparse.ArgumentParser(
        prog="dxopt",
        description="dxopt: differentiable optimization and gradient estimation for PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark: " + ", ".join((*BENCH_AREAS, "all")))
    bench.add_argument("area", help="qp, natgrad, estimators, bilevel or all")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    demo = sub.add_parser("demo", help="run an example (e.g. portfolio)")
    demo.add_argument("name", help="the example's folder under examples/")
    demo.add_argument("args", nargs=argparse.REMAINDER, help="passed to the example")
    ns = parser.parse_args(argv)

    root = _find_repo_root()
    if ns.command == "bench":
        areas = _available(root, "benchmarks") if ns.area == "all" else [ns.area]
        for area in areas:
            _run_module(root, "benchmarks", area, list(ns.args))
    else:
        _run_module(root, "examples", ns.name, list(ns.args))


if __name__ == "__main__":
    main()
