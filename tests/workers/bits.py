"""Shared assertion of the stacked kernel's determinism tests."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from workers.engine import ModelEngine


def assert_same_bits(alone: Sequence[ModelEngine], stacked: Sequence[ModelEngine]) -> None:
    """Each engine of ``alone`` (advanced by itself) and its twin in ``stacked`` (advanced in one stack) hold the same
    particles and log-evidence bit for bit, and that log-evidence is finite."""
    for e, f in zip(alone, stacked, strict=True):
        assert e.state is not None and f.state is not None
        assert torch.equal(e.state.theta, f.state.theta)
        assert e.log_evidence == f.log_evidence
    assert math.isfinite(alone[0].log_evidence)
