"""The module tables (README head, ``dxopt`` docstring) list exactly the subpackages that exist,
each with the first line of its own docstring (one source: ``python docs/build_readme.py``
regenerates both)."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import dxopt

ROOT = Path(__file__).resolve().parents[1]


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_readme", ROOT / "docs/build_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _public_subpackages() -> dict[str, str]:
    """name -> first docstring line, found by pkgutil (independently of the builder)."""
    out = {}
    for info in pkgutil.iter_modules(dxopt.__path__):
        if info.ispkg and not info.name.startswith("_"):
            init = Path(dxopt.__path__[0]) / info.name / "__init__.py"
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc, f"dxopt.{info.name} has no docstring; its first line is its summary"
            out[info.name] = doc.strip().splitlines()[0]
    return out


def test_readme_table_lists_every_subpackage_with_its_docstring_summary():
    build = _builder()
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `dxopt\.(\w+)` \| (.*) \|$", readme, flags=re.M))
    expected = _public_subpackages()
    assert set(rows) == set(expected), "run: python docs/build_readme.py"
    for name, line in expected.items():
        assert rows[name] == build.rst_to_markdown(line), name
    assert build.module_table() in readme


def test_package_docstring_table_is_current():
    build = _builder()
    source = (ROOT / "src/dxopt/__init__.py").read_text()
    assert build.package_docstring(source) == source, "run: python docs/build_readme.py"
    listed = re.findall(r"^- :mod:`dxopt\.(\w+)`: ", dxopt.__doc__ or "", flags=re.M)
    assert sorted(listed) == sorted(_public_subpackages())
    # and each is reachable as dxopt.<name> (lazy import) and exported
    assert set(dxopt._SUBPACKAGES) == set(listed)
    assert set(listed) <= set(dxopt.__all__)


def test_a_new_subpackage_changes_the_tables(tmp_path, monkeypatch):
    build = _builder()
    pkg = tmp_path / "dxopt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('r"""Top.\n\nSubpackages\n-----------\n- old\n\nEnd."""\n')
    (pkg / "alpha").mkdir()
    (pkg / "alpha" / "__init__.py").write_text('"""The :class:`A` module, ``x``."""\n')
    (pkg / "_private").mkdir()
    (pkg / "_private" / "__init__.py").write_text('"""Not listed."""\n')
    monkeypatch.setattr(build, "PACKAGE", pkg)
    before = build.module_table()
    assert "| `dxopt.alpha` | The `A` module, `x`. |" in before and "_private" not in before
    (pkg / "beta").mkdir()
    (pkg / "beta" / "__init__.py").write_text('r"""Beta: :math:`\\|x\\|`."""\n')
    after = build.module_table()
    assert after != before and "| `dxopt.beta` | Beta: $\\Vert x\\Vert $. |" in after
    source = (pkg / "__init__.py").read_text()
    assert build.package_docstring(source) == (
        'r"""Top.\n\nSubpackages\n-----------\n- :mod:`dxopt.alpha`: The :class:`A` module, '
        '``x``.\n- :mod:`dxopt.beta`: Beta: :math:`\\|x\\|`.\n\nEnd."""\n'
    )
    (pkg / "gamma").mkdir()
    (pkg / "gamma" / "__init__.py").write_text("x = 1\n")
    with pytest.raises(SystemExit, match="needs a docstring"):
        build.module_table()
