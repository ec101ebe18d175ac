"""The README's settings tables are generated from the pydantic models (service/docs_tables.py)."""

from __future__ import annotations

from pathlib import Path

from service.docs_tables import TABLES, render

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_settings_tables_match_the_settings_models() -> None:
    text = README.read_text()
    for name in TABLES:
        assert f"<!-- table:{name} -->" in text, f"README lacks the {name} table"
    assert render(text) == text, "README settings tables are stale: run `python -m service.docs_tables README.md`"
