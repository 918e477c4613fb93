"""The relax / warm-start / compile / smoothed / sparse-route examples of docs/readme/conic.md
run and print exactly the documented output (each block follows its
``<!-- tested: NAME -->`` marker)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests._readme_blocks import readme_block_output

README = Path(__file__).resolve().parents[2] / "docs" / "readme" / "conic.md"


@pytest.mark.parametrize("name", ["relax", "warm", "compile", "smoothed", "sparse"])
def test_readme_block_output_matches(name: str) -> None:
    printed, documented = readme_block_output(README, name)
    assert printed == documented
