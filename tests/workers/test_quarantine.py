"""Attempt accounting (real Redis) and the block budget (a fake clock, no wall-clock timing)."""

from __future__ import annotations

import itertools

import pytest
import redis
import torch

from tests.conftest import SMALL_MODEL
from tests.integration.helpers import linear_chunks
from workers.engine import ModelEngine
from workers.quarantine import Attempts, BlockBudgetExceeded, Budget, Exhausted, install_budget_check
from workers.store.commit import LeaseLost
from workers.store.keys import Keys


@pytest.fixture
def attempts(redis_url, key_prefix):
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    r.set(keys.lease("t", "m"), "tok")
    return Attempts(r, keys, "w1")


def test_attempts_count_per_cursor_and_quarantine_at_the_limit(attempts):
    assert attempts.begin("t", "m", "tok", b"5-0", "fp", 3, "block")[0] == 1
    assert attempts.begin("t", "m", "tok", b"5-0", "fp", 3, "block")[0] == 2
    n, attempt_id = attempts.begin("t", "m", "tok", b"5-0", "fp", 3, "block")
    assert n == 3
    assert attempts.settle("t", "m", attempt_id, reason="RuntimeError: boom")
    with pytest.raises(Exhausted, match=r"after 3 failed attempts .*; last: RuntimeError: boom"):
        attempts.begin("t", "m", "tok", b"5-0", "fp", 3, "block")
    assert attempts.record("t", "m")["attempts"] == "3"  # a refused attempt writes nothing
    # a commit moved the cursor: the record is stale and counting starts again
    assert attempts.begin("t", "m", "tok", b"6-0", "fp", 3, "block")[0] == 1
    # a model re-created under the same name (another config fingerprint) starts afresh
    assert attempts.begin("t", "m", "tok", b"6-0", "other", 3, "block")[0] == 1


def test_a_crash_leaves_its_attempt_counted_with_the_crash_reason(attempts):
    attempts.begin("t", "m", "tok", b"1-0", "fp", 2, "block")  # then the process dies: no settle
    attempts.begin("t", "m", "tok", b"1-0", "fp", 2, "block")
    with pytest.raises(Exhausted, match="last: the worker process died"):
        attempts.begin("t", "m", "tok", b"1-0", "fp", 2, "block")


def test_attempts_of_several_models_in_one_round_trip_fail_per_model(attempts):
    r, keys = attempts.r, attempts.keys
    r.set(keys.lease("t", "n"), "tok")
    for _ in range(2):  # "n" has used up its attempts at 1-0
        attempts.begin("t", "n", "tok", b"1-0", "fp", 2, "block")
    got = attempts.begin_many(
        [("t", "m", "tok", b"1-0", "fp"), ("t", "n", "tok", b"1-0", "fp"), ("t", "x", "tok", b"1-0", "fp")], 2, "block"
    )
    assert got[0][0] == 1 and attempts.record("t", "m")["id"] == got[0][1]
    assert isinstance(got[1], Exhausted) and attempts.record("t", "n")["attempts"] == "2"
    assert isinstance(got[2], LeaseLost) and attempts.record("t", "x") == {}  # no lease on "x": nothing written


def test_giving_back_and_fencing(attempts):
    n, first = attempts.begin("t", "m", "tok", b"1-0", "fp", 3, "restore")
    assert attempts.settle("t", "m", first)  # a restore that went well
    assert attempts.record("t", "m")["attempts"] == "0"
    _, second = attempts.begin("t", "m", "tok", b"1-0", "fp", 3, "block")
    assert not attempts.settle("t", "m", first)  # an older attempt cannot touch a newer one
    assert attempts.record("t", "m")["attempts"] == "1"
    with pytest.raises(LeaseLost):
        attempts.begin("t", "m", "someone-else", b"1-0", "fp", 3, "block")
    assert attempts.record("t", "m")["attempts"] == "1"
    assert attempts.settle("t", "m", second, parked_until=2e9)
    assert attempts.parked([("t", "m"), ("t", "other")], now=1e9) == {("t", "m")}
    assert attempts.parked([("t", "m")], now=3e9) == set()


def test_budget_checks_only_while_armed():
    t = [0.0]
    b = Budget(2.0, clock=lambda: t[0])
    b.check()  # disarmed
    b.start()
    t[0] = 2.0
    b.check()  # at the budget: fine
    t[0] = 2.5
    with pytest.raises(BlockBudgetExceeded, match="block budget of 2 s"):
        b.check()
    b.stop()
    b.check()
    assert Budget(None).start() is None and Budget(0).started is None


def test_an_overrun_aborts_the_block_inside_the_engine_and_leaves_its_state():
    """Each clock reading advances one second: the check inside the engine's SGHMC moves (not before or after
    them) fires.  The block follows a first row, so it is annealed: a first block that the prior draws do not
    cover is taken from a Laplace start in one increment without moves (workers.conflict), and its first
    checks after the kernel come after the history has grown (the worker discards an aborted engine anyway)."""
    ticks = itertools.count()
    eng = ModelEngine(SMALL_MODEL["family"], SMALL_MODEL["params"], SMALL_MODEL["sampler"])
    (c,) = linear_chunks(1, 21, seed=1)
    eng.update(torch.tensor(c["x"][:1]), torch.tensor(c["y"][:1]))
    budget = Budget(5.0, clock=lambda: float(next(ticks)))
    install_budget_check(eng, budget)
    state, observations = eng.state, eng.observations
    budget.start()
    with pytest.raises(BlockBudgetExceeded):
        eng.update(c["x"][1:], c["y"][1:])
    budget.stop()
    assert eng.state is state and eng.observations == observations and state.history.seen == 1
