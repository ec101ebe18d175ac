"""The README's settings tables, generated from the pydantic models so that they cannot drift.

``python -m service.docs_tables README.md`` rewrites every block between
``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` (NAME in :data:`TABLES`);
``tests/test_docs.py`` fails when the README differs from what this would write.
"""

from __future__ import annotations

import json
import re
import sys
from functools import partial
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from workers.config import Settings
from workers.settings import SamplerSettings


def _default(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (bool, int, float, str)):
        return json.dumps(value)
    return str(value)


def markdown_table(model: type[BaseModel], *, env_prefix: str | None = None) -> str:
    """One row per field of ``model``: name (or environment variable), default, description."""
    head = "Variable" if env_prefix else "Setting"
    rows = [f"| {head} | Default | Meaning |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        key = f"{env_prefix}{name.upper()}" if env_prefix else name
        if field.default is PydanticUndefined:
            default = "required"
        elif field.default is None and env_prefix:
            default = "unset"
        else:
            default = _default(field.default)
        text = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{key}` | `{default}` | {text} |")
    return "\n".join(rows)


TABLES = {
    "service": lambda: markdown_table(Settings, env_prefix="SGAIS_"),
    "sampler": lambda: markdown_table(SamplerSettings),
}


def render(text: str) -> str:
    """``text`` with every ``<!-- table:NAME -->`` block replaced by the current table."""
    for name, make in TABLES.items():
        pattern = re.compile(rf"(<!-- table:{name} -->\n)(?:.*?\n)?(<!-- /table:{name} -->)", re.S)
        text = pattern.sub(partial(_fill, make()), text)
    return text


def _fill(table: str, m: re.Match[str]) -> str:
    return m.group(1) + table + "\n" + m.group(2)


def main(argv: list[str]) -> None:
    path = Path(argv[0] if argv else "README.md")
    path.write_text(render(path.read_text()))


if __name__ == "__main__":
    main(sys.argv[1:])
