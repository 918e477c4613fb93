"""Shared test configuration: a fixed thread count, and top-level packages that win.

``make test`` runs the suite on two pytest-xdist workers (one per core of the CI machine); each
worker then uses one torch thread, so the two never oversubscribe the cores (on tiny problems
two threads per worker would be slower, not faster). A plain ``pytest`` run keeps two threads.

pytest puts ``tests/`` on ``sys.path`` (this rootless conftest), where ``tests/benchmarks`` and
``tests/examples`` would shadow the repository's ``benchmarks`` and ``examples`` packages as
namespace packages; the repository root goes first instead.
"""

import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if sys.path[:1] != [REPO_ROOT]:
    sys.path.insert(0, REPO_ROOT)
for _package in ("benchmarks", "examples"):
    _mod = sys.modules.get(_package)
    if _mod is not None and str(Path(REPO_ROOT) / _package) not in list(
        getattr(_mod, "__path__", [])
    ):
        for _name in [m for m in sys.modules if m == _package or m.startswith(_package + ".")]:
            del sys.modules[_name]
