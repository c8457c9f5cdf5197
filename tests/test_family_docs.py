"""docs/trainer.md's table of model families is what the code says of each family."""
from __future__ import annotations

from pathlib import Path

from family_checkpoints import support_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "trainer.md"


def test_the_family_table_is_the_code_s():
    text = DOC.read_text()
    documented = text.split("<!-- family-table -->\n", 1)[1].split("\n<!-- /family-table -->", 1)[0]
    assert documented == support_table(), "regenerate it: python tests/family_checkpoints.py"
