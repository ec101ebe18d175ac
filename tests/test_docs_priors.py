"""docs/priors.md names every family and every hyperparameter with its default; docs/api.md exists and is
linked from the README (issue 10 item 7)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_core import PydanticUndefined

from models import FAMILIES

ROOT = Path(__file__).resolve().parent.parent


def test_priors_doc_lists_every_family_hyperparameter_and_default() -> None:
    text = (ROOT / "docs" / "priors.md").read_text()
    sections = dict(re.findall(r"^## `(\w+)`[^\n]*\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S))
    for name, family in FAMILIES.items():
        assert name in sections, f"docs/priors.md has no section for {name}"
        for field, info in family.Params.model_fields.items():
            assert f"`{field}`" in sections[name], f"docs/priors.md, {name}: {field} missing"
            if info.default is not PydanticUndefined and not isinstance(info.default, list):
                d = info.default
                default = "null" if d is None else f"`{d}`" if isinstance(d, str) else repr(float(d))
                assert default in sections[name], f"docs/priors.md, {name}: default {default} of {field} missing"


def test_readme_links_the_reference_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in ("docs/api.md", "docs/priors.md"):
        assert (ROOT / doc).exists() and f"({doc})" in readme
