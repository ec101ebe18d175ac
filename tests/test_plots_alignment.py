"""The demo's probabilities over time use the aligned comparison (issue 10 acceptance 6)."""

from __future__ import annotations

import math

import pytest

from service.plots import aligned_log_evidence, probabilities_over_time


def test_demo_probabilities_condition_on_the_stream_context():
    traces = {
        "ar2": [{"observations": n, "log_evidence": lz} for n, lz in ((1, 0.0), (2, 0.0), (3, -1.5), (4, -3.0))],
        "gmm": [{"observations": n, "log_evidence": lz} for n, lz in ((1, -2.0), (2, -4.0), (3, -5.0), (4, -6.5))],
    }
    counts, aligned = aligned_log_evidence(traces, 2)
    assert counts == [3, 4] and aligned == {"ar2": [-1.5, -3.0], "gmm": [-1.0, -2.5]}
    counts, probs = probabilities_over_time(traces, {}, 2)
    assert probs["gmm"][-1] == pytest.approx(1.0 / (1.0 + math.exp(-0.5)))  # not 1/(1+e^{3.5}) as unaligned
    # without rows at c the first shared count after it is used; c = 0 is the models' own values
    assert aligned_log_evidence({m: [r for r in t if r["observations"] != 2] for m, t in traces.items()}, 2)[0] == [4]
    assert aligned_log_evidence(traces, 0)[1]["gmm"] == [-2.0, -4.0, -5.0, -6.5]
