"""Golden outputs (``tests/data/golden/``): the engine's block diagnostics and checkpoint hashes for
fixed seeds and every family, and one worker run's stored trace rows and events, bit for bit.

They pin the numerics across refactors: a change that moves any value fails here (bit for bit on the machine
kind they were recorded on, to relative 1e-9 on others: :mod:`tests.golden.compare` says why).  After an
intended change of the numerics, re-record with one command (a real Redis for the worker run)::

    SGAIS_TEST_REDIS_URL=redis://127.0.0.1:6379/<db> python -m tests.golden.make_golden

and commit the JSON files together with the change (say in the commit message why they moved).
"""

from __future__ import annotations

import json

import pytest

from tests.golden import make_golden as golden
from tests.golden.compare import check


def load(name: str) -> dict:
    return json.loads((golden.GOLDEN_DIR / name).read_text())


@pytest.mark.parametrize(
    ("case", "family", "params", "sampler"), golden.ENGINE_CASES, ids=[c[0] for c in golden.ENGINE_CASES]
)
def test_engine_matches_golden(case, family, params, sampler):
    recorded = load("engine.json")
    got = json.loads(json.dumps(golden.engine_record(family, params, sampler)))  # JSON keeps every bit of a float
    check(got, recorded[case], recorded.get("machine"))


def test_worker_matches_golden(redis_url):
    want = load("worker.json")
    got = json.loads(json.dumps(golden.worker_golden(redis_url)))
    machine = want.get("machine")
    check(got["traces"], want["traces"], machine)
    # each model's events and the stream's own events in order; how the models' events interleave depends on
    # how the worker advances its models together (issue 9: one stacked update per chunk round)
    check(by_source(got["events"]), by_source(want["events"]), machine)
    check(got["posterior"], want["posterior"], machine)


def by_source(events: list[dict]) -> dict[str, list[dict]]:
    """Events grouped by model (``type`` for the stream's events without a model), each group in order."""
    out: dict[str, list[dict]] = {}
    for e in events:
        out.setdefault(e.get("model") or e["type"], []).append(e)
    return out
