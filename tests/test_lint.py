"""The code checks of issue 13 as tests, so that the README's one test command (``python -m pytest -q``) is
also CI's: ruff (lint and format) over the repository, mypy over the packages (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["check", "format"])
def test_ruff_is_clean(args):
    done = _run(sys.executable, "-m", "ruff", *args)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_is_clean():
    done = _run(sys.executable, "-m", "mypy")
    assert done.returncode == 0, done.stdout + done.stderr
