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


def test_openapi_describes_every_family_prior_and_hyperparameter() -> None:
    """The ``params`` description of ``POST /v1/models`` (embedded in the OpenAPI document) names every family's
    prior and every hyperparameter with its default and description."""
    from service.routes.models import _model_openapi

    schema = _model_openapi["requestBody"]["content"]["application/json"]["schema"]
    text = schema["properties"]["params"]["description"]
    for name, family in FAMILIES.items():
        assert f"**{name}** — prior: {family.prior}" in text and family.prior
        for field, info in family.Params.model_fields.items():
            assert f"`{field}` (" in text and info.description and info.description in text, (name, field)
