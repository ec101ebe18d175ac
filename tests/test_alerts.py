"""Change-point detector (workers/alerts.py): false alarms, detection, placement, resumability."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError

from workers import alerts

LOG_2PI = math.log(2 * math.pi)


def gaussian_rows(
    n_blocks: int,
    block: int,
    gen: torch.Generator,
    *,
    shift_at_block: int | None = None,
    shift: float = 0.0,
    start_index: int = 0,
) -> list[dict]:
    """Trace rows of a model whose predictive is N(0, 1) for data that are N(0, 1) (stationary), or
    N(shift, 1) from block ``shift_at_block`` on: the exact per-block log-predictive of a model
    that has converged, and 1–2 annealing steps per block."""
    rows = []
    for b in range(n_blocks):
        y = torch.randn(block, generator=gen, dtype=torch.float64)
        if shift_at_block is not None and b >= shift_at_block:
            y = y + shift
        lp = float((-0.5 * LOG_2PI - 0.5 * y**2).sum())
        steps = 1 + int(torch.rand((), generator=gen) < 0.3)
        rows.append(
            {
                "first_index": start_index + b * block,
                "observations": block,
                "log_predictive": lp,
                "annealing_steps": steps,
                "ess": 7.0,
            }
        )
    return rows


def run(rows, settings=alerts.AlertSettings(), state=None):
    state = state or alerts.initial_state()
    found = []
    for row in rows:
        state, new = alerts.detect(state, settings, row)
        found += new
    return state, found


@pytest.mark.parametrize("block,n_blocks", [pytest.param(5, 20_000, marks=pytest.mark.slow), (50, 4_000), (500, 2_000)])
def test_false_alarms_rare_on_stationary_trace(block, n_blocks):
    # Requirement: under the defaults, fewer than one false alarm per 2,000 blocks of a stationary,
    # well-specified trace. Measured with these generators: 3 evidence_drop alarms in 20,000 blocks
    # of 5 (all from chi-square(5) tails: one block alerts alone only at z > h + k = 9, i.e. a
    # chi-square(5) above ~33, p ~ 3e-6), none in 20,000 blocks of 50 or 500, no annealing spikes
    # (1-2 steps throughout). A Poisson count with mean 3 exceeds the bound of 10 with p < 1e-3.
    gen = torch.Generator().manual_seed(block)
    _, found = run(gaussian_rows(n_blocks, block, gen))
    assert len(found) <= n_blocks // 2000, found
    assert not [a for a in found if a["kind"] == "annealing_spike"]


def test_alert_near_planted_shift_and_nowhere_else():
    gen = torch.Generator().manual_seed(1)
    block = 10
    rows = gaussian_rows(300, block, gen, shift_at_block=150, shift=1.5)
    _, found = run(rows)
    drops = [a for a in found if a["kind"] == "evidence_drop"]
    assert len(drops) >= 1
    first = drops[0]
    # a shift of 1.5 SD costs 1.125 nats per observation on average, z ≈ 1.125·√10/0.707 ≈ 5 per
    # 10-row block: the CUSUM (slack 1) crosses h=8 on the 2nd-3rd shifted block; the GLR start
    # estimate puts the change at the first shifted block
    assert first["observation_index"] == 150 * block
    assert first["detected_at_index"] <= 153 * block - 1
    # nothing before the shift
    assert all(a["observation_index"] >= 150 * block for a in found)
    assert first["score"] > alerts.AlertSettings().drop_threshold


def test_change_placed_at_start_of_the_excursion():
    # a small shift: several blocks accumulate before the alert; it is placed where they began
    gen = torch.Generator().manual_seed(2)
    rows = gaussian_rows(200, 20, gen, shift_at_block=100, shift=1.0)
    _, found = run(rows)
    drops = [a for a in found if a["kind"] == "evidence_drop"]
    assert drops, "a sustained 1 SD shift must be detected"
    assert drops[0]["detected_at_index"] > drops[0]["observation_index"]
    assert abs(drops[0]["observation_index"] - 100 * 20) <= 20


def test_state_json_round_trip_gives_same_alerts():
    gen = torch.Generator().manual_seed(3)
    rows = gaussian_rows(120, 10, gen, shift_at_block=40, shift=2.0) + gaussian_rows(
        80, 10, gen, shift_at_block=40, shift=-1.0, start_index=1200
    )
    _, straight = run(rows)
    state, found = alerts.initial_state(), []
    for row in rows:
        state = json.loads(json.dumps(state))  # a checkpoint after every block
        state, new = alerts.detect(state, alerts.AlertSettings(), row)
        found += new
    assert straight and found == straight
    # the input state is not mutated
    s0 = alerts.initial_state()
    snapshot = json.dumps(s0)
    alerts.detect(s0, alerts.AlertSettings(), rows[0])
    assert json.dumps(s0) == snapshot


def test_annealing_spike():
    gen = torch.Generator().manual_seed(4)
    rows = gaussian_rows(40, 10, gen)
    spike = dict(rows[-1], first_index=400, annealing_steps=12)
    _, found = run(rows + [spike])
    spikes = [a for a in found if a["kind"] == "annealing_spike"]
    assert len(spikes) == 1 and spikes[0]["observation_index"] == 400
    assert spikes[0]["score"] >= 6


def test_disabled_and_empty_blocks():
    gen = torch.Generator().manual_seed(5)
    rows = gaussian_rows(100, 10, gen, shift_at_block=50, shift=3.0)
    _, found = run(rows, alerts.AlertSettings(enabled=False))
    assert found == []
    state, new = alerts.detect(alerts.initial_state(), alerts.AlertSettings(), dict(rows[0], observations=0))
    assert new == [] and state == alerts.initial_state()


def test_settings_reject_unknown_keys():
    with pytest.raises(ValidationError):
        alerts.AlertSettings(threshold=3)


def test_model_switch():
    post = [{"model": "a", "probability": 0.3}, {"model": "b", "probability": 0.7}]
    assert alerts.model_switch(None, post) is None  # first leader: no switch
    assert alerts.model_switch("b", post) is None
    sw = alerts.model_switch("a", post)
    assert sw["kind"] == "model_switch" and sw["model"] == "b" and sw["score"] == pytest.approx(0.7)
    assert alerts.model_switch("a", []) is None
