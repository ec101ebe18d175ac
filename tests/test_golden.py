"""Golden outputs (``tests/data/golden/``): the engine's block diagnostics and checkpoint hashes for
fixed seeds and every family, and one worker run's stored trace rows and events, bit for bit.

They pin the numerics across refactors: a change that moves any value fails here.  After an
intended change of the numerics, re-record with one command (a real Redis for the worker run)::

    SGAIS_TEST_REDIS_URL=redis://127.0.0.1:6379/<db> python -m tests.golden.make_golden

and commit the JSON files together with the change (say in the commit message why they moved).
"""

from __future__ import annotations

import json

import pytest

from tests.golden import make_golden as golden


def load(name: str) -> dict:
    return json.loads((golden.GOLDEN_DIR / name).read_text())


@pytest.mark.parametrize("case", [c[0] for c in golden.ENGINE_CASES])
def test_engine_matches_golden(case):
    want = load("engine.json")[case]
    got = golden.engine_record(want["family"], want["params"], want["sampler"])
    assert json.loads(json.dumps(got)) == want  # floats compared exactly (JSON keeps every bit of a float64)


def test_worker_matches_golden(redis_url):
    want = load("worker.json")
    got = json.loads(json.dumps(golden.worker_golden(redis_url)))
    assert got["traces"] == want["traces"]
    # each model's events and the stream's own events in order; how the models' events interleave depends on
    # how the worker advances its models together (issue 9: one stacked update per chunk round)
    assert by_source(got["events"]) == by_source(want["events"])
    assert got["posterior"] == want["posterior"]


def by_source(events: list[dict]) -> dict[str, list[dict]]:
    """Events grouped by model (``type`` for the stream's events without a model), each group in order."""
    out: dict[str, list[dict]] = {}
    for e in events:
        out.setdefault(e.get("model") or e["type"], []).append(e)
    return out
