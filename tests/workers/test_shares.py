"""Cost-weighted lease shares (workers/worker/leases.py): the decisions of a scan as pure functions, run here over
simulated workers that scan in turn, publishing their loads as the worker does through Redis."""

from __future__ import annotations

import math
import random
import zlib

import pytest

from workers.worker.leases import COST_TIME_CONSTANT, SHARE_MARGIN, EngineLoad, model_costs, surplus, wanted


def _scan(w: str, held: dict[str, set[str]], costs: dict[str, float], loads: dict[str, float]) -> int:
    """One worker's scan, as Leases.discover makes it: releases, then leases; returns the models it moved."""
    mine = held[w]
    load = sum(costs[r] for r in mine)
    others = [loads.get(v, 0.0) for v in held if v != w]
    moved = 0
    for ref in surplus(sorted(mine), costs, load, min(others) if others else None):
        mine.remove(ref)
        load -= costs[ref]
        moved += 1
    if moved:  # a worker that released leases nothing in the same scan
        loads[w] = load
        return moved
    taken = set().union(*held.values())
    free = sorted((r for r in costs if r not in taken), key=lambda r: zlib.crc32(f"{w}/{r}".encode()))
    published = [loads[v] for v in held if v != w and v in loads]
    for ref in wanted(free, costs, load, sum(costs.values()) / len(held), min(published) if published else None):
        mine.add(ref)
        load += costs[ref]
        moved += 1
    loads[w] = load
    return moved


def _settle(costs: dict[str, float], workers: list[str], seed: int, held=None, loads=None, rounds: int = 50):
    rng = random.Random(seed)
    held = held if held is not None else {w: set() for w in workers}
    loads = loads if loads is not None else {}
    for _ in range(rounds):
        order = list(held)
        rng.shuffle(order)
        if sum(_scan(w, held, costs, loads) for w in order) == 0:
            return held, loads
    raise AssertionError(f"the shares did not settle in {rounds} rounds")


def _check_settled(held: dict[str, set[str]], costs: dict[str, float]) -> None:
    """Every model held once; no model of the most loaded worker may move (the fixed point of ``surplus``)."""
    owners = [r for h in held.values() for r in h]
    assert sorted(owners) == sorted(costs)
    load = {w: sum(costs[r] for r in h) for w, h in held.items()}
    top = max(load, key=load.get)
    least = min(v for w, v in load.items() if w != top)
    assert all(costs[r] * (1 + SHARE_MARGIN) >= load[top] - least for r in held[top])


@pytest.mark.parametrize(("n", "workers"), [(1, 2), (3, 2), (4, 3), (10, 2), (128, 2), (7, 3)])
def test_equal_costs_give_the_count_shares(n, workers):
    costs = {f"t/m{i}": 1e-3 for i in range(n)}
    held, _ = _settle(costs, [f"w{j}" for j in range(workers)], seed=n)
    counts = sorted(len(h) for h in held.values())
    assert counts[-1] <= math.ceil(n / workers) and counts[0] >= n // workers - 1
    assert counts[-1] - counts[0] <= 1


@pytest.mark.parametrize("seed", range(8))
def test_skewed_costs_settle_to_balanced_loads_and_stay(seed):
    rng = random.Random(seed)
    costs = {f"t/m{i}": rng.lognormvariate(-3, 1.0) for i in range(30)}
    workers = [f"w{j}" for j in range(rng.choice([2, 3, 4]))]
    held, loads = _settle(costs, workers, seed)
    _check_settled(held, costs)
    before = {w: set(h) for w, h in held.items()}
    for w in workers:  # settled: another round of scans moves nothing
        assert _scan(w, held, costs, loads) == 0
    assert held == before


def test_the_demos_costs_split_better_than_by_count():
    """Seven models at 5x the others' cost (the demo's two-component gmm, bench/README.md session 28) over two
    workers: by count a worker may hold 5 of the 7 (23+9 against 7+5 units of cost); by cost within one model."""
    costs = {f"t/big{i}": 5.0 for i in range(7)} | {f"t/small{i}": 1.0 for i in range(21)}
    held, _ = _settle(costs, ["a", "b"], seed=0)
    _check_settled(held, costs)
    loads = sorted(sum(costs[r] for r in h) for h in held.values())
    assert loads[1] - loads[0] <= 5.0 * (1 + SHARE_MARGIN)


def test_a_joining_worker_takes_its_share_from_a_loaded_one():
    costs = {f"t/m{i}": c for i, c in enumerate([0.5, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05])}
    held, loads = _settle(costs, ["a"], seed=1)
    assert held["a"] == set(costs)
    held["b"] = set()  # b is live and has published no load yet: counted as 0
    held, _ = _settle(costs, ["a", "b"], seed=1, held=held, loads=loads)
    _check_settled(held, costs)
    assert held["b"]


def test_model_costs_fall_back_to_the_median_and_the_floor():
    refs = ["t/a", "t/b", "t/c", "t/d"]
    costs = model_costs(refs, {"t/a": 0.3, "t/b": None, "t/gone": 9.0}, {"t/c": 0.1, "t/b": None})
    assert costs["t/a"] == 0.3 and costs["t/c"] == 0.1
    assert costs["t/b"] == costs["t/d"] == 0.3  # the median of the measured (0.1, 0.3): the upper one
    assert model_costs(refs, {}, {}) == {r: 1e-3 for r in refs}  # nothing measured: equal, the shares by count


def test_engine_load_estimates_a_steady_rate_and_decays():
    """Impulses of 10 ms every Δ = 0.1 s against a rate of 0.1: the weighted sum of the impulses is
    ``0.01 / (1 − exp(−Δ/τ))`` where a continuous rate gives ``0.1·τ``, so the estimate is high by about
    ``Δ / (2τ)`` = 0.25% (τ = 20 s); 0.5% allows for that and for the bias correction's own rounding."""
    load = EngineLoad(0.0)
    assert load.rate(0.0) is None
    for i in range(1, 301):  # 10 ms of engine time every 100 ms: 0.1 engine seconds per second
        load.add(0.01, i * 0.1)
    assert load.rate(30.0) == pytest.approx(0.1, rel=0.005)
    early = EngineLoad(0.0)
    for i in range(1, 11):
        early.add(0.01, i * 0.1)
    assert early.rate(1.0) == pytest.approx(0.1, rel=0.005)  # bias-corrected before τ has passed
    published = EngineLoad(0.0, 0.4)
    assert published.rate(0.0) == pytest.approx(0.4)
    assert published.rate(COST_TIME_CONSTANT) == pytest.approx(0.4 / math.e)
