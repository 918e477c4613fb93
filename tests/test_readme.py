"""README.md is built from docs/readme/ (whose examples the area tests run) and states the
two set-up commands."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build() -> str:
    spec = importlib.util.spec_from_file_location("build_readme", ROOT / "docs/build_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def test_readme_matches_its_tested_parts():
    assert (ROOT / "README.md").read_text() == _build(), "run: python docs/build_readme.py"


def test_readme_gives_exactly_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile
