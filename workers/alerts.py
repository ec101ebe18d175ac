"""Change-point alerts read off a model's evidence trace (DESIGN.md §5; thesis §5.1.5, §5.4.2).

Pure functions over a JSON-able detector state, so the runner can checkpoint the state in
the same Redis transaction as the particles; resuming from a JSON round trip of the state
gives the same alerts.

* ``evidence_drop``: a one-sided CUSUM (Page 1954) on the standardised per-observation
  log-predictive of each block.  The baseline of the current regime is robust: the median
  and the MAD of the last ``window`` blocks' per-observation log-predictive, the spread
  adjusted for the block's size (the mean of ``n`` rows has a spread ∝ 1/√n).  A block
  scoring ``z`` standard deviations below the median adds ``min(z, drop_cap) - drop_slack``
  to the statistic; crossing ``drop_threshold`` raises the alert and restarts the baseline on
  the new regime.  The change is placed at the first observation of the excursion's block
  where a mean shift most likely began (the GLR estimate over the excursion's start points).
  The spread has a floor (``noise_floor``), so a baseline of a few blocks cannot be
  over-confident; the first ``warmup_blocks`` (the prior-to-posterior transient) are left out.
* ``annealing_spike``: a block needing ``spike_factor`` times more annealing steps than
  the recent median, and at least ``spike_min_steps``; placed at the block's first
  observation.  When it fires on the same block as an ``evidence_drop``, only the drop is
  reported (one change, one alert); after either alert the recent-steps window restarts,
  so a model that keeps needing more annealing in the new regime does not alert again.
* ``model_switch``: the stream's most probable model changed (see :func:`model_switch`).
* ``change_point`` (the primary change alert since issue 12) is not raised here but by the
  challengers of :mod:`workers.segmented` (posterior probability of a change from Bayes factors,
  :mod:`workers.changepoint`); ``evidence_drop`` and ``annealing_spike`` stay as diagnostics
  (bench/README.md, "Bayesian change points").

Defaults were chosen on bench/changepoints.py (seven annotated river series) together with
the stationary-trace false-alarm checks of tests/test_alerts.py; see bench/README.md.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workers.changepoint import ChangepointSettings, baseline, median


class AlertSettings(BaseModel):
    """Per-model alert thresholds (the ``alerts`` object of a model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    warmup_blocks: int = Field(
        1, ge=0, description="first blocks of the stream (prior to posterior) left out of the baseline"
    )
    min_baseline_blocks: int = Field(1, ge=1, description="baseline blocks needed before a drop can alert")
    window: int = Field(50, ge=3, le=10_000, description="recent blocks in the robust baseline (median, MAD)")
    drop_threshold: float = Field(8.0, gt=0, description="CUSUM threshold h, in standard deviations")
    drop_slack: float = Field(1.0, ge=0, description="CUSUM slack k, in standard deviations")
    drop_cap: float | None = Field(None, gt=0, description="cap on one block's contribution (None = no cap)")
    noise_floor: float = Field(
        0.7,
        gt=0,
        description="floor on the per-observation spread of the log-predictive (nats); a block mean of n rows "
        "has spread ≥ noise_floor/√n. 0.7 ≈ √(1/2), the spread of a well-specified Gaussian's log density",
    )
    spike_factor: float = Field(4.0, gt=1, description="annealing_spike when steps ≥ factor × recent median")
    spike_min_steps: int = Field(5, ge=2, description="and at least this many annealing steps")
    spike_window: int = Field(20, ge=3, description="blocks in the recent median of annealing steps")
    change_point: ChangepointSettings = Field(
        default_factory=lambda: ChangepointSettings.model_validate({}),
        description="Bayesian change points from challenger evidences (workers/changepoint.py): hazard, threshold, ...",
    )


def initial_state() -> dict[str, Any]:
    """Empty detector state (JSON-able: numbers, None and lists only)."""
    return {"seen": 0, "values": [], "rows": [], "cusum": 0.0, "run": [], "steps": []}


def _change_start(run: list[list[float]]) -> int:
    """Where a mean shift of unknown size most likely began within the excursion: the start ``j``
    maximising ``(Σ_{t≥j} z_t)² / (number of blocks from j)`` (the GLR estimate), over ``j`` with a
    positive sum."""
    best, best_j, total = -1.0, run[0][0], 0.0
    for count, (first, z) in enumerate(reversed(run), start=1):
        total += z
        if total > 0 and total * total / count >= best:
            best, best_j = total * total / count, first
    return int(best_j)


def detect(
    state: dict[str, Any], settings: AlertSettings, row: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Feed one trace row; return the new state and the alerts it raises.

    ``row`` needs ``first_index``, ``observations`` (rows of the block that entered the
    likelihood), ``log_predictive`` (nats) and ``annealing_steps``.  Alerts are dicts with
    ``kind``, ``observation_index`` (where the change is placed), ``detected_at_index``,
    ``score`` (CUSUM statistic in standard deviations, or the annealing-step ratio) and
    ``message``.  The input state is not modified.
    """
    # copy (lists too: the caller's state is never modified); keys missing from an older state get defaults
    state = {k: (list(v) if isinstance(v, list) else v) for k, v in {**initial_state(), **state}.items()}
    alerts: list[dict[str, Any]] = []
    n = int(row["observations"])
    if not settings.enabled or n <= 0:
        return state, alerts
    value = float(row["log_predictive"]) / n
    first = int(row["first_index"])
    last = first + n - 1
    k = int(row["annealing_steps"])
    drop = False
    if len(state["values"]) >= settings.min_baseline_blocks and math.isfinite(value):
        med, sigma = baseline(state["values"], state["rows"], settings.noise_floor)
        z = (med - value) * math.sqrt(n) / sigma
        step = z if settings.drop_cap is None else min(z, settings.drop_cap)
        cusum = max(0.0, state["cusum"] + step - settings.drop_slack)
        # the excursion: [first_index, z] of the blocks since the statistic last left zero
        run = ((state["run"] if state["cusum"] > 0 else []) + [[first, z]])[-settings.window :] if cusum > 0 else []
        if cusum > settings.drop_threshold:
            drop = True
            start = _change_start(run)
            alerts.append(
                {
                    "kind": "evidence_drop",
                    "observation_index": start,
                    "detected_at_index": last,
                    "score": cusum,
                    "message": (
                        f"per-observation log-predictive {value:.4g} nats against a typical {med:.4g} "
                        f"(spread {sigma:.3g}/√{n}); change placed at {start}"
                    ),
                }
            )
        else:
            state.update(cusum=cusum, run=run)
    steps = state["steps"]
    if steps:
        med_steps = max(median(steps), 1)
        if k >= settings.spike_min_steps and k >= settings.spike_factor * med_steps and not drop:
            alerts.append(
                {
                    "kind": "annealing_spike",
                    "observation_index": first,
                    "detected_at_index": last,
                    "score": k / med_steps,
                    "message": f"block needed {k} annealing steps; recent median {med_steps:g}",
                }
            )
    state["seen"] += 1
    if drop:
        # a new regime: its baseline starts after this block
        state.update(values=[], rows=[], cusum=0.0, run=[])
    elif state["seen"] > settings.warmup_blocks and math.isfinite(value):
        state["values"] = (state["values"] + [value])[-settings.window :]
        state["rows"] = (state["rows"] + [n])[-settings.window :]
    if alerts:
        steps = []  # a new regime: its annealing work is judged against itself from here on
    if state["seen"] > settings.warmup_blocks:
        state["steps"] = (steps + [k])[-settings.spike_window :]
    return state, alerts


def model_switch(previous_leader: str | None, posterior: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A ``model_switch`` alert body when the most probable model changed, else None.

    ``posterior``: the stream posterior's ``models`` list (``model``, ``probability``).
    The body has ``kind``, ``model`` (the new leader), ``score`` (its probability) and
    ``message``; the caller adds the stream and the indices.
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
        "message": (
            f"most probable model is now {leader['model']} (p={leader['probability']:.3g}), was {previous_leader}"
        ),
    }
