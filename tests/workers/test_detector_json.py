"""The detector state's checkpoint text (:func:`workers.worker.detect.state_json`) is ``json.dumps`` of the state,
byte for byte, whatever the window holds and whatever the texts kept from the previous call."""

from __future__ import annotations

import json
import math
import random

from workers import alerts
from workers.worker.detect import WindowText, state_json


def test_state_json_is_json_dumps_along_a_detector_run() -> None:
    rng = random.Random(0)
    settings = alerts.AlertSettings()
    state, last, raised, longest = alerts.initial_state(), WindowText(), 0, 0
    for i in range(400):
        shift = 3.0 if 150 <= i < 250 else 0.0  # a drop (an alert, the window restarted), then back
        row = {
            "first_index": 5 * i,
            "observations": rng.choice([1, 5, 5, 5]),
            "log_predictive": rng.gauss(-6.5 - shift, 1.5),
            "annealing_steps": rng.choice([1, 2, 3, 12]),
        }
        state, found = alerts.detect(state, settings, row)
        raised, longest = raised + len(found), max(longest, len(state["values"]))
        if i % 4 != 1:  # a commit after one block, or after two (a chunk of several blocks)
            assert state_json(state, last) == json.dumps(state)
    assert raised and longest == settings.window


def test_state_json_special_values() -> None:
    last = WindowText()
    nan = math.nan
    windows = [
        [-1.25, 0.1, 2.5e-300],
        [0.1, 2.5e-300, 1e22],
        [2.5e-300, 1e22, 1e22],  # equal values
        [1e22, 1e22, 1e22, -3.5],
        [1e22, -3.5, nan],
        [-3.5, nan, math.inf],  # nan: never equal, always formatted
        [nan, math.inf, -math.inf, 0.0],  # a zero: the window encoded whole
        [0.0, -0.0, 2.0],
        [-0.0, 2.0, 0.1],  # -0.0 must not take 0.0's text
        [2.0, 0.1, 1],  # an int
        [0.1, 1.0, True],  # other types equal to floats
        [1.0, 4.5],
        [],
        [7.25],
    ]
    for values in windows:
        state = {**alerts.initial_state(), "seen": 3, "values": values, "run": [[5, 0.5]], "cusum": 0.25}
        assert state_json(state, last) == json.dumps(state)
    assert state_json({}, last) == "{}"
