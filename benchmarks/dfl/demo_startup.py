"""How long ``dxopt demo shortest_path`` takes from an installed wheel (issue 30: under 3 min).

The path of a new user: build the wheel of this checkout, create a fresh virtual environment
(no system site packages), ``pip install torch==<the pinned version> <wheel>[demo]``, then run
the demo twice in an empty folder: *cold* (an empty numba cache, ``NUMBA_CACHE_DIR`` a fresh
folder: every kernel the demo uses is compiled) and *warm* (the same cache again). Wall and CPU
seconds of each run, and the install's wall time, go to
``benchmarks/dfl/results/demo_startup.{json,md,png}`` and the ``dfl_demo`` section of
BENCHMARKS.md. Run ``python -m benchmarks.dfl.demo_startup`` on a quiet machine (the load
average at start and end is recorded); it takes about 3 minutes, most of it the install.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO_ROOT,
    machine_info,
    machine_line,
    markdown_table,
    results_dir,
    update_benchmarks_md,
    write_json,
)

TARGET_S = 180.0
TORCH = "2.13.0"


def _timed(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall and CPU (user + system, the children's) seconds of ``cmd``; raises on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def measure(work: Path, torch_spec: str) -> dict[str, Any]:
    """Build, install and run the demo cold and warm under ``work``."""
    wheels, venv, cache, out = (work / d for d in ("wheels", "venv", "numba", "out"))
    for d in (cache, out):
        d.mkdir(parents=True)
    py = sys.executable
    _timed([py, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), "."], cwd=REPO_ROOT)
    (wheel,) = wheels.glob("dxopt-*.whl")
    subprocess.run([py, "-m", "venv", str(venv)], check=True)
    install = _timed(
        [str(venv / "bin" / "pip"), "install", "-q", torch_spec, f"{wheel}[demo]"], cwd=work
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR")}
    env["NUMBA_CACHE_DIR"] = str(cache)
    demo = [str(venv / "bin" / "dxopt"), "demo", "shortest_path"]
    cold = _timed(demo, cwd=out, env=env)
    warm = _timed(demo, cwd=out, env=env)
    return {"install": install, "cold": cold, "warm": warm, "wheel": wheel.name}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    names = [r["run"] for r in rows]
    ax.bar(names, [r["wall_s"] for r in rows], label="wall")
    ax.bar(names, [r["cpu_s"] for r in rows], width=0.4, label="CPU")
    ax.axhline(TARGET_S, color="tab:red", linestyle="--", label="target (3 min)")
    ax.set_ylabel("seconds")
    ax.set_title("dxopt demo shortest_path from a wheel")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default=f"torch=={TORCH}", help="the torch requirement")
    parser.add_argument("--no-md", action="store_true", help="leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dxopt-demo-") as tmp:
        result = measure(Path(tmp), args.torch)
    load1 = os.getloadavg()
    rows = [
        {"run": run, "wall_s": result[run]["wall_s"], "cpu_s": result[run]["cpu_s"],
         "target_s": TARGET_S if run != "install" else None,
         "met": None if run == "install" else result[run]["wall_s"] < TARGET_S}
        for run in ("install", "cold", "warm")
    ]  # fmt: skip
    info = machine_info()
    out = results_dir("dfl")
    write_json(out / "demo_startup.json", {"machine": info, "load": [load0, load1], "rows": rows,
                                           "wheel": result["wheel"]})  # fmt: skip
    text = (
        "Command: `python -m benchmarks.dfl.demo_startup`. "
        f"{machine_line(info)} Load average (1, 5, 15 min) at start "
        f"{[round(x, 2) for x in load0]}, at end {[round(x, 2) for x in load1]}.\n\n"
        f"A fresh virtual environment: `pip install {args.torch} {result['wheel']}[demo]` "
        "(`install`), then `dxopt demo shortest_path` with an empty numba cache (`cold`: every "
        "kernel it uses is compiled) and again with that cache (`warm`). Target: the demo "
        f"under {TARGET_S:.0f} s.\n\n" + markdown_table(rows, list(rows[0])) + "\n"
    )
    (out / "demo_startup.md").write_text(text)
    plot(rows, out / "demo_startup.png")
    text += "\n![demo start-up](benchmarks/dfl/results/demo_startup.png)\n"
    print(text)
    if not args.no_md:
        update_benchmarks_md(
            "dfl_demo", "## Decision-focused demo from an installed wheel (issue 30)\n\n" + text
        )


if __name__ == "__main__":
    main()
