"""Build README.md from its parts in docs/readme/ (each area's section is tested there), and
the module table of the ``dxopt`` package docstring.

One source for the list of modules: the public subpackages of ``src/dxopt`` (folders with an
``__init__.py`` whose name does not start with ``_``) and the first line of each one's
``__init__`` docstring, read with :mod:`ast` (nothing is imported). From it this script writes

- ``{{modules}}`` in ``docs/readme/_head.md``: the README's module table;
- ``{{layout}}`` in ``docs/readme/_tail.md``: the layout block (library, tests, benchmarks and
  examples folders as they are on disk);
- the ``Subpackages`` list of ``src/dxopt/__init__.py``'s docstring.

Run ``python docs/build_readme.py`` after editing a part or adding a subpackage;
``tests/test_readme.py`` and ``tests/test_module_table.py`` fail when they disagree.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / "docs" / "readme"
PACKAGE = ROOT / "src" / "dxopt"
ORDER = (
    "_head",
    "qp",
    "cvxpy",
    "frontend",
    "conic",
    "portfolio",
    "dfl",
    "distributed",
    "natgrad",
    "estimators",
    "bilevel",
    "rl",
    "linearize",
    "_tail",
)
DOC_HEADING = "Subpackages\n-----------\n"


def _first_docstring_line(init: Path) -> str:
    doc = ast.get_docstring(ast.parse(init.read_text()), clean=True)
    if not doc:
        raise SystemExit(
            f"{init}: the subpackage needs a docstring (its first line is its summary)"
        )
    return doc.strip().splitlines()[0].strip()


def _listed_order() -> tuple[str, ...]:
    """``_SUBPACKAGES`` of ``dxopt/__init__.py`` (the order of the tables)."""
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_SUBPACKAGES" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    return ()


def subpackages() -> list[tuple[str, str]]:
    """``(name, summary)`` of every public subpackage, in ``_SUBPACKAGES`` order, then the ones
    it does not list yet (alphabetically)."""
    found = {
        p.parent.name: _first_docstring_line(p)
        for p in sorted(PACKAGE.glob("*/__init__.py"))
        if not p.parent.name.startswith("_")
    }
    listed = [name for name in _listed_order() if name in found]
    rest = sorted(set(found) - set(listed))
    return [(name, found[name]) for name in [*listed, *rest]]


def rst_to_markdown(text: str) -> str:
    """The inline reST of a docstring line as Markdown (roles, literals, math)."""
    # \| (a norm) would end a Markdown table cell: \Vert says the same
    text = re.sub(r":math:`([^`]+)`", lambda m: "$" + m[1].replace("\\|", "\\Vert ") + "$", text)
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def module_table() -> str:
    """The README's module table."""
    rows = [f"| `dxopt.{name}` | {rst_to_markdown(line)} |" for name, line in subpackages()]
    return "\n".join(["| module | what it is |", "|---|---|", *rows])


def docstring_table() -> str:
    """The ``Subpackages`` list of the ``dxopt`` docstring (reST, wrapped at 96 columns)."""
    return "".join(
        textwrap.fill(f"- :mod:`dxopt.{name}`: {line}", width=96, subsequent_indent="  ") + "\n"
        for name, line in subpackages()
    )


def _folders(path: Path) -> list[str]:
    return sorted(
        p.name
        for p in path.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and any(p.glob("*.py"))
    )


def layout() -> str:
    """The layout block: the folders as they are on disk."""
    modules = [name for name, _ in subpackages()]
    rows = [
        ("src/dxopt/<module>/", "the library, one folder per module above (API in __init__.py)"),
        ("src/dxopt/_core/", "Status, Cost, DxoptError, validators, vocabulary, torch_compat"),
        ("tests/<module>/", "the suite, mirroring the library; also: "),
        ("benchmarks/<area>/", "`dxopt bench <area>`, results/ and BENCHMARKS.md: "),
        ("examples/<name>/", "`dxopt demo <name>` (portfolio: the main job): "),
        ("docs/architecture.md", "the qp layers, one solve() and its backward through the files"),
    ]
    extra_tests = [name for name in _folders(ROOT / "tests") if name not in modules]
    lists = {2: extra_tests, 3: _folders(ROOT / "benchmarks"), 4: _folders(ROOT / "examples")}
    width = max(len(path) for path, _ in rows) + 2
    lines = ["```"]
    for i, (path, what) in enumerate(rows):
        text = what + ", ".join(lists.get(i, []))
        lines.extend(
            textwrap.wrap(
                text,
                width=96,
                initial_indent=path.ljust(width),
                subsequent_indent=" " * width,
                break_on_hyphens=False,
            )
        )
    lines.append("```")
    return "\n".join(lines)


def build() -> str:
    chunks = [(PARTS / f"{name}.md").read_text().strip() for name in ORDER]
    text = "\n\n".join(chunks) + "\n"
    return text.replace("{{modules}}", module_table()).replace("{{layout}}", layout())


def package_docstring(source: str) -> str:
    """``source`` (of ``dxopt/__init__.py``) with its ``Subpackages`` list regenerated: the
    list runs from the heading to the first blank line."""
    if not source.startswith('r"""'):
        raise SystemExit('dxopt/__init__.py: the docstring must be raw (r"""): it holds LaTeX')
    start = source.index(DOC_HEADING) + len(DOC_HEADING)
    end = source.index("\n\n", start) + 1
    return source[:start] + docstring_table() + source[end:]


if __name__ == "__main__":
    (ROOT / "README.md").write_text(build())
    print(f"wrote {ROOT / 'README.md'}")
    init = PACKAGE / "__init__.py"
    init.write_text(package_docstring(init.read_text()))
    print(f"wrote the module table of {init}")
