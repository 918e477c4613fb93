"""The private torch names dxopt uses all live in :mod:`dxopt._core.torch_compat`, and each one
still exists in the installed torch (a failure names the attribute and the torch version)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from dxopt._core import torch_compat
from dxopt._core.torch_compat import PRIVATE_NAMES, resolve

SRC = Path(__file__).resolve().parents[2] / "src" / "dxopt"
COMPAT = SRC / "_core" / "torch_compat.py"


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split(".")[1:])


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def private_torch_uses(path: Path) -> list[str]:
    """``line: name`` of every private torch module, import or attribute in ``path``."""
    tree = ast.parse(path.read_text())
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "torch"]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:  # whole chains only
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] == "torch":
                names = [dotted]
        found += [f"{node.lineno}: {n}" for n in names if _private(n)]  # type: ignore[attr-defined]
    return sorted(set(found))


def test_every_private_name_exists_in_this_torch():
    missing = [
        f"{name} ({why})"
        for name, (why, _) in PRIVATE_NAMES.items()
        if resolve(name, optional=True) is None
    ]
    assert not missing, (
        f"torch {torch.__version__} lacks private name(s) dxopt uses; adapt "
        f"dxopt/_core/torch_compat.py: {missing}"
    )


def test_compat_exports_are_the_registered_objects():
    assert torch_compat.tree_map is resolve("torch.utils._pytree.tree_map")
    assert torch_compat.BatchNormBase is resolve("torch.nn.modules.batchnorm._BatchNorm")
    assert torch_compat.functorch_transforms_active() is False
    assert torch_compat.SingleLevelFunction is not None
    assert torch_compat.functorch_unwrap_dead_wrappers is not None


def test_a_missing_name_fails_loudly_with_the_name_and_torch_version():
    with pytest.raises(
        ImportError, match=r"torch\._C\._no_such_thing, .*torch " + re.escape(torch.__version__)
    ):
        resolve("torch._C._no_such_thing")
    with pytest.raises(ImportError, match=r"torch\.utils\._no_such_module\.f"):
        resolve("torch.utils._no_such_module.f")
    assert resolve("torch._C._no_such_thing", optional=True) is None


def test_the_compat_module_registers_what_it_uses():
    used = {use.split(": ", 1)[1] for use in private_torch_uses(COMPAT)}
    unregistered = [
        u for u in used if not any(k == u or k.startswith(u + ".") for k in PRIVATE_NAMES)
    ]
    assert not unregistered, f"add these to PRIVATE_NAMES with their why: {unregistered}"


def test_no_private_torch_name_outside_the_compat_module():
    uses = {
        str(path.relative_to(SRC)): found
        for path in sorted(SRC.rglob("*.py"))
        if path != COMPAT and (found := private_torch_uses(path))
    }
    assert not uses, f"import these from dxopt._core.torch_compat instead: {uses}"


def test_the_scan_sees_imports_and_attribute_chains(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import torch\nimport torch.utils._pytree\nfrom torch.utils import _pytree\n"
        "from torch.nn.modules.batchnorm import _BatchNorm\nF = torch._C._functorch\n"
        "ok = torch.linalg.solve\nv = torch.__version__\n"
    )
    assert private_torch_uses(probe) == [
        "2: torch.utils._pytree",
        "3: torch.utils._pytree",
        "4: torch.nn.modules.batchnorm._BatchNorm",
        "5: torch._C._functorch",
    ]
