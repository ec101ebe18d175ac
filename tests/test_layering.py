"""The direction of imports (docs/architecture.md): ``service`` -> ``workers`` -> ``models``, never back.

Every module of the three packages is parsed (``ast``, so imports inside functions count too) and each
import resolved to its top-level package; an arrow back (``workers`` -> ``service``, ``models`` ->
``workers`` or ``service``) fails the test with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> packages of the project it must not import
FORBIDDEN = {"service": set(), "workers": {"service"}, "models": {"service", "workers"}}


def imported_packages(path: Path, package: str) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every import in the module at ``path`` (relative imports stay
    inside ``package``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, package if node.level else (node.module or "").split(".")[0]))
    return out


def arrows_back(root: Path) -> list[str]:
    """``file:line: package -> package`` for every forbidden import under ``root``."""
    found = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, target in imported_packages(path, package):
                if target in forbidden:
                    found.append(f"{path.relative_to(root)}:{line}: {package} -> {target}")
    return found


def test_no_import_points_back():
    assert arrows_back(ROOT) == []


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("workers", "import service.app\n", ["workers/m.py:1: workers -> service"]),
        ("workers", "def f():\n    from service.errors import http_error\n", ["workers/m.py:2: workers -> service"]),
        ("models", "from workers.engine import ModelEngine\n", ["models/m.py:1: models -> workers"]),
        ("workers", "from models import make_family\nfrom . import sgais\n", []),
        ("service", "from workers.store import reads\n", []),
    ],
)
def test_the_check_finds_arrows_back(tmp_path, package, source, expected):
    for name in FORBIDDEN:
        (tmp_path / name).mkdir()
    (tmp_path / package / "m.py").write_text(source)
    assert arrows_back(tmp_path) == expected
