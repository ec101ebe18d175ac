"""Challenger cost (issue 12, item 6): worker time per observation of a model with and without its challengers.

The live-feed workload of ``bench/live_feed.py`` without the service: a one-component ``gmm`` (default sampler,
seed 0) fed ``--chunks`` chunks of 5 stationary N(0.3, 1) values, once as the bare :class:`ModelEngine` and once
as a :class:`SegmentedEngine` (change-point defaults), in the same process, alternating ``--repeats`` times
(the ratio is taken per repeat, so machine load that drifts between repeats cancels). Prints ms per block
(one 5-value chunk), the ratio, challengers started and alive on average, the share of the segmented
time spent starting challengers (their first block from the prior), and SGHMC move rounds per block
(``workers.sgais._move`` iterations over a stack: deterministic, the main driver of the cost; a stack of
a few models costs about what one does at these sizes).

    python bench/changepoint_cost.py [--chunks 40,400] [--repeats 2] [--cp '{"burn_in": 10}']
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers import segmented as segmented_mod  # noqa: E402
from workers import sgais  # noqa: E402
from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.engine import ModelEngine  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402
from workers.worker.loop import warm_lazy_imports  # noqa: E402

CHUNK = 5
FAMILY, PARAMS, SAMPLER = "gmm", {"dim": 1, "components": 1}, {"seed": 0}


def chunks(n: int, seed: int = 0) -> list[list[float]]:
    g = torch.Generator().manual_seed(seed)
    return [(0.3 + torch.randn(CHUNK, generator=g, dtype=torch.float64)).tolist() for _ in range(n)]


ROUNDS = [0]  # SGHMC move rounds (workers.sgais._move iterations over a stack), counted by _counting_move


def _counting_move(move):
    def wrapped(block, *a, burn, **k):
        ROUNDS[0] += int(burn.max()) if burn.numel() else 0
        return move(block, *a, burn=burn, **k)

    return wrapped


def bare(data: list[list[float]]) -> float:
    eng = ModelEngine(FAMILY, PARAMS, SAMPLER)
    t0 = time.perf_counter()
    for c in data:
        eng.update(None, c)
    return time.perf_counter() - t0


def segmented(data: list[list[float]], settings: ChangepointSettings) -> tuple[float, float, int, float]:
    """(seconds, seconds starting challengers, challengers started, mean alive after a block)."""
    eng = SegmentedEngine.create(FAMILY, PARAMS, SAMPLER, settings)
    spawn_seconds = 0.0
    calls = 0
    stacked = segmented_mod._stacked

    def timed_stacked(jobs, *a, **k):  # advance_blocks: 1st call every population, 2nd the new challenger's
        nonlocal spawn_seconds, calls
        calls += 1
        t = time.perf_counter()
        stacked(jobs, *a, **k)
        if calls % 2 == 0:
            spawn_seconds += time.perf_counter() - t

    segmented_mod._stacked = timed_stacked
    alive = []
    try:
        t0 = time.perf_counter()
        for c in data:
            eng.update(None, c)
            eng.take_alerts()
            alive.append(len(eng.challengers))
        total = time.perf_counter() - t0
    finally:
        segmented_mod._stacked = stacked
    return total, spawn_seconds, eng.started, statistics.fmean(alive)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="40,400")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cp", default="{}", help="change-point settings (JSON) of the segmented engine")
    args = ap.parse_args()
    settings = ChangepointSettings.model_validate(json.loads(args.cp))
    torch.set_num_threads(1)
    # first-use costs outside the timings, as the worker does (warm_lazy_imports): scipy.optimize is imported by
    # the first defensive start's L-BFGS-B (workers.conflict.laplace), in some challenger's first block
    warm_lazy_imports()
    segmented(chunks(20, seed=1), settings)
    sgais._move = _counting_move(sgais._move)
    print(
        "| chunks | bare ms/block | with challengers ms/block | ratio | started | alive (mean) | spawn share "
        "| move rounds/block bare | with challengers |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in (int(v) for v in args.chunks.split(",")):
        data = chunks(n)
        rows = []
        for _ in range(args.repeats):
            ROUNDS[0] = 0
            tb = bare(data)
            rb, ROUNDS[0] = ROUNDS[0], 0
            ts, sp, started, alive = segmented(data, settings)
            rows.append((tb, ts, sp, started, alive, rb, ROUNDS[0]))
        tb = statistics.median(r[0] for r in rows)
        ts = statistics.median(r[1] for r in rows)
        ratio = statistics.median(r[1] / r[0] for r in rows)
        share = statistics.median(r[2] / r[1] for r in rows)
        print(
            f"| {n} | {1000 * tb / n:.1f} | {1000 * ts / n:.1f} | {ratio:.2f} | {rows[0][3]} | {rows[0][4]:.2f} "
            f"| {100 * share:.0f}% | {rows[0][5] / n:.1f} | {rows[0][6] / n:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
