"""Change-point alerts over a chunk's processed blocks (:mod:`workers.alerts`), and alert records."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from workers import alerts as detector_lib
from workers.engine import SINGLE_OBSERVATION_BLOCKS
from workers.worker.blocks import Block


def detect(
    detector: dict[str, Any], settings: detector_lib.AlertSettings, blocks: list[Block], *, stream: str, model: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the model's detector (state ``detector``, its ``settings``: the model's ``cfg["alerts"]``) over
    ``blocks`` in order: the new detector state and the alert bodies raised (``stream`` and ``model`` filled in)."""
    found: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    for i, b in enumerate(blocks):
        part = {
            "first_index": b.row["first_index"],
            "observations": b.info.observations,
            "log_predictive": b.info.log_predictive,
            "annealing_steps": b.info.annealing_steps,
        }
        if pending is not None:
            part = {
                "first_index": pending["first_index"],
                **{k: pending[k] + part[k] for k in ("observations", "log_predictive", "annealing_steps")},
            }
            pending = None
        # the stream's first values, split into one-observation blocks (workers.engine.block_bounds), reach
        # the detector as the one block of this chunk they were before the split
        if b.row["observations"] < SINGLE_OBSERVATION_BLOCKS and i + 1 < len(blocks):
            pending = part
            continue
        detector, new = detector_lib.detect(detector, settings, part)
        found += [{**a, "stream": stream, "model": model} for a in new]
    return detector, found


def alert_record(a: dict[str, Any]) -> dict[str, Any]:
    """An alert record (API.md "Alerts") from a detector's body: id, default indices, creation time."""
    return {
        "id": secrets.token_hex(8),
        "observation_index": None,
        "detected_at_index": None,
        **a,
        "created_at": datetime.now(UTC).isoformat(),
    }
