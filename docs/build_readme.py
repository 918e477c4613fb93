"""Build README.md from its parts in docs/readme/ (each area's section is tested there).

Run ``python docs/build_readme.py`` after editing a part; ``tests/test_readme.py`` fails when
README.md and its parts disagree.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / "docs" / "readme"
ORDER = (
    "_head",
    "qp",
    "cvxpy",
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


def build() -> str:
    chunks = [(PARTS / f"{name}.md").read_text().strip() for name in ORDER]
    return "\n\n".join(chunks) + "\n"


if __name__ == "__main__":
    (ROOT / "README.md").write_text(build())
    print(f"wrote {ROOT / 'README.md'}")
