"""Build the wheel, install it into a fresh venv and run the command line from there.

Offline: the wheel is built without build isolation and installed with ``--no-index
--no-deps``; the new venv gets its dependencies (torch, ...) from this interpreter's
site-packages through a ``.pth`` line. Folders named by a ``.pth`` line do not have their own
``.pth`` files processed, so an editable install of dxopt in this interpreter does not leak in:
the test checks that ``dxopt`` is imported from the venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

import dxopt

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_wheel_installs_and_runs_version_and_quick_demo(tmp_path: Path) -> None:
    if not (REPO / "src" / "dxopt" / "_demos" / "examples").exists():
        pytest.skip("needs the source tree")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1")

    # 1) a clean copy of what the wheel is built from (no build/ or egg-info in the checkout)
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "out", "build")
    shutil.copytree(REPO / "src", tree / "src", symlinks=True, ignore=ignore)
    shutil.copytree(REPO / "examples", tree / "examples", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    dist = tmp_path / "dist"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(tree)],
        tmp_path, env,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("dxopt-*.whl")
    assert wheel.name.startswith(f"dxopt-{dxopt.__version__}-")

    # 2) a fresh venv that sees this interpreter's packages but not its .pth files
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        tmp_path, env,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "_dxopt_test_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    installed = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        tmp_path, env,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr

    # 3) the installed package, outside any source checkout
    where = _run([str(python), "-c", "import dxopt; print(dxopt.__file__)"], tmp_path, env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout
    cli = str(bindir / "dxopt")
    version = _run([cli, "--version"], tmp_path, env)
    assert version.returncode == 0 and version.stdout.strip() == f"dxopt {dxopt.__version__}"
    bench = _run([cli, "bench", "qp", "--quick"], tmp_path, env)
    assert bench.returncode != 0 and "need a source checkout of dxopt" in bench.stderr
    demo = _run([cli, "demo", "portfolio", "--quick"], tmp_path, env, timeout=300)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "decision-focused" in demo.stdout and "equal weights" in demo.stdout
    assert not list(env_dir.rglob("wealth.png"))  # nothing written into the installation
