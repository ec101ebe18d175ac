"""Adaptive moves against moves after every annealing step, on a live feed (issue 9, engine level).

A one-component ``gmm`` (default priors and sampler) absorbs a 100-observation first block, then ``--chunks``
5-observation chunks of N(0.3, 1) data, for ``--seeds`` seeds, with ``moves`` ``every_step`` (the engine
before session 6: ``burn_in`` SGHMC moves after every annealing step) and ``adaptive`` (the default: a block
taken in one annealing step without resampling keeps its particles in place), bare and with the change-point
challengers the worker runs (``workers.segmented.SegmentedEngine``).  Prints milliseconds per 5-observation
block (engine wall time, one thread) and the final log-evidence error against the exact normal–inverse-gamma
value (``models.conjugate``), per seed.

    python bench/adaptive_moves.py [--chunks 200] [--seeds 3]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from models.conjugate import gmm_one_component_log_evidence
from workers.alerts import AlertSettings
from workers.engine import ModelEngine
from workers.segmented import SegmentedEngine

PARAMS = {"dim": 1, "components": 1}


def run(
    moves: str, challengers: bool, seed: int, first: torch.Tensor, chunks: list[torch.Tensor]
) -> tuple[float, float]:
    """(seconds per chunk after the first block, log-evidence error in nats) for one engine."""
    sampler = {"seed": seed, "moves": moves}
    if challengers:
        engine = SegmentedEngine.create("gmm", PARAMS, sampler, settings=AlertSettings().change_point)
    else:
        engine = ModelEngine("gmm", PARAMS, sampler)
    engine.update(None, first)
    t0 = time.perf_counter()
    for c in chunks:
        engine.update(None, c)
    seconds = (time.perf_counter() - t0) / len(chunks)
    exact = gmm_one_component_log_evidence(torch.cat([first, *chunks]).numpy())
    return seconds, engine.log_evidence - exact


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    first = 0.3 + torch.randn(100, generator=g, dtype=torch.float64)
    chunks = [0.3 + torch.randn(5, generator=g, dtype=torch.float64) for _ in range(args.chunks)]
    run("adaptive", False, 0, first, chunks[:3])  # lazy imports and first-call costs out of the timings
    print(f"gmm-1, 100-observation first block then {args.chunks} chunks of 5; load average {os.getloadavg()[0]:.1f}")
    print(f"{'moves':>10} {'challengers':>11} {'ms/block':>9}   log-evidence error by seed (nats)")
    for challengers in (False, True):
        for moves in ("every_step", "adaptive"):
            res = [run(moves, challengers, seed, first, chunks) for seed in range(args.seeds)]
            ms = 1000 * sum(s for s, _ in res) / len(res)
            print(f"{moves:>10} {challengers!s:>11} {ms:>9.2f}   " + " ".join(f"{e:+.2f}" for _, e in res), flush=True)


if __name__ == "__main__":
    main()
