"""Change-point alerts read off a model's evidence trace (DESIGN.md §5; thesis §5.1.5, §5.4.2).

Pure functions over a JSON-able detector state, so the runner can checkpoint the
state in the same Redis transaction as the particles.

* ``evidence_drop``: a one-sided CUSUM (Page 1954) on the standardised
  per-observation log-predictive of each block.  The running mean/variance of
  the per-observation log-predictive are exponentially weighted; a block whose
  value falls far below them accumulates evidence of a change.
* ``annealing_spike``: a block needing many more annealing steps than the recent
  median.
* ``model_switch``: the stream's most probable model changed (see :func:`model_switch`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AlertSettings(BaseModel):
    """Per-model alert thresholds (the ``alerts`` object of a model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    warmup_blocks: int = Field(5, ge=1, description="blocks before any alert can fire")
    drop_threshold: float = Field(8.0, gt=0, description="CUSUM threshold h, in standard deviations")
    drop_slack: float = Field(1.0, ge=0, description="CUSUM slack k, in standard deviations")
    smoothing: float = Field(0.1, gt=0, le=1, description="EWMA weight of the newest block in the baseline")
    spike_factor: float = Field(4.0, gt=1, description="annealing_spike when steps ≥ factor × recent median")
    spike_min_steps: int = Field(5, ge=2, description="and at least this many annealing steps")
    spike_window: int = Field(20, ge=3, description="blocks in the recent median")


def initial_state() -> dict[str, Any]:
    """Empty detector state (JSON-able)."""
    return {"blocks": 0, "mean": 0.0, "var": 0.0, "cusum": 0.0, "run_start": None, "steps": []}


def detect(state: dict[str, Any], settings: AlertSettings, row: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Feed one trace row; return the new state and the alerts it raises.

    ``row`` needs ``first_index``, ``observations`` (rows in the block),
    ``log_predictive`` (nats) and ``annealing_steps``.  Alerts are dicts with
    ``kind``, ``observation_index`` (where the change is placed),
    ``detected_at_index``, ``score`` and ``message``.
    """
    state = dict(state)
    alerts: list[dict[str, Any]] = []
    n = row["observations"]
    if not settings.enabled or n == 0:
        return state, alerts
    value = row["log_predictive"] / n
    first, last = row["first_index"], row["first_index"] + n - 1
    blocks = state["blocks"]
    steps = list(state["steps"])
    if blocks >= settings.warmup_blocks:
        sd = math.sqrt(max(state["var"], 1e-12))
        z = (state["mean"] - value) / sd
        cusum = max(0.0, state["cusum"] + z - settings.drop_slack)
        run_start = state["run_start"] if cusum > 0 and state["cusum"] > 0 else (first if cusum > 0 else None)
        if cusum > settings.drop_threshold:
            alerts.append({
                "kind": "evidence_drop",
                "observation_index": run_start,
                "detected_at_index": last,
                "score": cusum,
                "message": f"per-observation log-predictive fell to {value:.4g} nats from a typical {state['mean']:.4g}",
            })
            # restart the baseline on the new regime
            state.update(blocks=0, mean=value, var=0.0, cusum=0.0, run_start=None)
        else:
            state.update(cusum=cusum, run_start=run_start)
        med = sorted(steps)[len(steps) // 2] if steps else 1
        k = row["annealing_steps"]
        if k >= settings.spike_min_steps and k >= settings.spike_factor * max(med, 1):
            alerts.append({
                "kind": "annealing_spike",
                "observation_index": first,
                "detected_at_index": last,
                "score": k / max(med, 1),
                "message": f"block needed {k} annealing steps; recent median {med}",
            })
    if state["blocks"] == 0 and not alerts:
        state.update(mean=value, var=0.0)
    elif not any(a["kind"] == "evidence_drop" for a in alerts):
        a = settings.smoothing if state["blocks"] >= 1 else 1.0
        delta = value - state["mean"]
        state["mean"] = state["mean"] + a * delta
        state["var"] = (1 - a) * (state["var"] + a * delta * delta)
    state["blocks"] = state["blocks"] + 1
    steps.append(row["annealing_steps"])
    state["steps"] = steps[-settings.spike_window :]
    return state, alerts


def model_switch(previous_leader: str | None, posterior: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A ``model_switch`` alert body when the most probable model changed, else None.

    ``posterior``: the stream posterior's ``models`` list (``model``, ``probability``).
    """
    if not posterior:
        return None
    leader = max(posterior, key=lambda m: m["probability"])
    if previous_leader is None or leader["model"] == previous_leader:
        return None
    return {
        "kind": "model_switch",
        "model": leader["model"],
        "score": leader["probability"],
        "message": f"most probable model is now {leader['model']} (p={leader['probability']:.3g}), was {previous_leader}",
    }
