"""Change-point alerts over a chunk's processed blocks (:mod:`workers.alerts`), alert records, and the detector
state's JSON as the checkpoint stores it."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
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


@dataclass
class WindowText:
    """The baseline window (``state["values"]``) of a model's last :func:`state_json` and its floats' JSON."""

    values: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


def state_json(state: dict[str, Any], last: WindowText) -> str:
    """``json.dumps(state)`` of a detector state (:func:`workers.alerts.initial_state`: numbers, None and lists),
    the same text, formatting only the floats of ``state["values"]`` that are not in ``last`` (updated here).

    The window holds up to ``window`` = 50 per-observation log-predictives; formatting them is 21 of the 27 µs
    ``json.dumps`` takes on a full window (``bench/many_models.py``'s states), and a chunk moves the window by
    a value or two: the window is the previous one less ``d`` first values, plus new ones.  A reused text is
    that of an equal float: equal non-zero floats have one text (zero has two, 0.0 and -0.0, so a window with
    a zero is encoded whole, as is one holding anything but floats)."""
    values = state.get("values")
    if not values or type(values) is not list or set(map(type, values)) != {float} or 0.0 in values:
        return json.dumps(state)
    prev = last.values
    try:
        d = prev.index(values[0])
        kept = len(prev) - d
        if kept > len(values) or values[:kept] != prev[d:]:
            kept = 0
    except ValueError:  # the first value is new: nothing is reused
        d, kept = 0, 0
    texts = last.texts[d : d + kept] + [json.dumps(v) for v in values[kept:]]
    last.values, last.texts = list(values), texts
    # the state holds no strings, so its only '"values": []' is the key's, with the empty list put in its place
    return json.dumps({**state, "values": []}).replace('"values": []', '"values": [' + ", ".join(texts) + "]", 1)
