"""Make ``import examples`` resolve to the repository's top-level ``examples/`` package.

pytest puts ``tests/`` on ``sys.path`` (rootdir conftest), where this folder would
otherwise shadow the real package as a namespace package.
"""

import sys
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [REPO_ROOT]:
    sys.path.insert(0, REPO_ROOT)
_mod = sys.modules.get("examples")
if _mod is not None and str(Path(REPO_ROOT) / "examples") not in list(
    getattr(_mod, "__path__", [])
):
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        del sys.modules[name]
