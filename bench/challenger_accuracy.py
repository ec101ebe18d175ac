"""A challenger's evidence error and cost per sampler setting (issue 12 item 6, issue 9): what the challengers'
``burn_in`` / ``ess_target`` / ``warmup_particles`` (:class:`workers.changepoint.ChangepointSettings`) trade.

A challenger is a fresh :class:`ModelEngine` from the prior (``SegmentedEngine._sampler``: the model's sampler
with the challenger overrides); its ``log Ẑ'(y_{t..n})`` enters every log Bayes factor
``log B_t = log Ẑ(y_{s..t−1}) + log Ẑ'(y_{t..n}) − log Ẑ(y_{s..n})`` (:mod:`workers.changepoint`), so its error
adds to the decision's.  Here it is measured against the exact normal–inverse-gamma evidence
(:func:`models.conjugate.gmm_one_component_log_evidence`) of a one-component ``gmm`` (default prior) fed
``--n`` values in blocks of 5, over ``--seeds`` sampler seeds (the data fixed per scenario):

* ``stationary``: N(0.3, 1), a standardised series that did not change (the grid's challengers);
* ``shift``: N(2.5, 0.5²), a standardised series after a jump (the challenger that should win).

Per setting: mean error (bias), its sd over seeds, the RMS and the largest (most positive: the false alarms'
side) at 10, 20, 40 and ``--n`` values (nats); SGHMC
move rounds per block (``workers.sgais._move`` iterations, deterministic: the kernel's cost does not depend
on the number of stacked models at these sizes) and wall ms per block (one thread; noisy on a shared machine).

    python bench/challenger_accuracy.py [--seeds 20] [--n 80] [--base service|changepoints]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.conjugate import gmm_one_component_log_evidence  # noqa: E402
from workers import sgais  # noqa: E402
from workers.changepoint import challenger_seed  # noqa: E402
from workers.engine import ModelEngine  # noqa: E402
from workers.worker.loop import warm_lazy_imports  # noqa: E402

BLOCK = 5
BASES = {
    "service": {"block_size": BLOCK},  # SamplerSettings defaults: burn_in 20, batch 500, lr 0.1
    "changepoints": {"block_size": BLOCK, "particles": 10, "burn_in": 10, "batch_size": 100, "learning_rate": 0.02},
    # tests/workers/test_changepoint.py's CHEAP: 10 particles from the start (no warm-up population), burn-in 3
    "cheap": {
        "block_size": BLOCK, "particles": 10, "warmup_particles": None, "burn_in": 3, "batch_size": 50,
        "learning_rate": 0.05,
    },
}  # fmt: skip
SETTINGS = [
    {},
    {"burn_in": 10},
    {"burn_in": 5},
    {"ess_target": 0.7},
    {"ess_target": 0.5},
    {"warmup_particles": 20},
    {"warmup_particles": 10},
    {"burn_in": 10, "ess_target": 0.5},
    {"burn_in": 5, "ess_target": 0.5},
]
SCENARIOS = {"stationary": (0.3, 1.0), "shift": (2.5, 0.5)}

_rounds = 0


def _counting_move(move):
    def wrapped(block, *a, burn, **k):
        global _rounds
        _rounds += int(burn.max()) if burn.numel() else 0
        return move(block, *a, burn=burn, **k)

    return wrapped


def run(base: dict, over: dict, y: np.ndarray, seeds: int, marks: list[int]) -> dict:
    global _rounds
    errs: dict[int, list[float]] = {m: [] for m in marks}
    exact = {m: gmm_one_component_log_evidence(y[:m]) for m in marks}
    _rounds, seconds, blocks = 0, 0.0, 0
    for seed in range(seeds):
        eng = ModelEngine("gmm", {"dim": 1, "components": 1}, {**base, **over, "seed": challenger_seed(seed, 0)})
        for k in range(0, len(y), BLOCK):
            t0 = time.perf_counter()
            eng.update(None, y[k : k + BLOCK].tolist())
            seconds += time.perf_counter() - t0
            blocks += 1
            if k + BLOCK in errs:
                errs[k + BLOCK].append(eng.log_evidence - exact[k + BLOCK])
    out = {"rounds/block": _rounds / blocks, "ms/block": 1000 * seconds / blocks}
    for m, e in errs.items():
        out[m] = (statistics.fmean(e), statistics.stdev(e), math.sqrt(statistics.fmean(v * v for v in e)), max(e))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--n", type=int, default=80)
    ap.add_argument("--base", choices=list(BASES), default="service")
    ap.add_argument("--settings", default=None, help="JSON list of challenger overrides (default: a sweep)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warm_lazy_imports()
    sgais._move = _counting_move(sgais._move)
    settings = json.loads(args.settings) if args.settings else SETTINGS
    marks = [m for m in (10, 20, 40) if m < args.n] + [args.n]
    print(f"base sampler {args.base}: {BASES[args.base]}; {args.seeds} seeds; cells: bias / sd / RMS / max (nats)")
    for name, (mu, sd) in SCENARIOS.items():
        y = mu + sd * np.random.default_rng(7).standard_normal(args.n)
        print(f"\n{name}: N({mu}, {sd}²)\n")
        print("| challenger overrides | move rounds/block | ms/block | " + " | ".join(f"n={m}" for m in marks) + " |")
        print("|---|---:|---:|" + "---:|" * len(marks))
        for over in settings:
            r = run(BASES[args.base], over, y, args.seeds, marks)
            cells = " | ".join("{:+.2f} / {:.2f} / {:.2f} / {:+.2f}".format(*r[m]) for m in marks)
            print(f"| {json.dumps(over)} | {r['rounds/block']:.1f} | {r['ms/block']:.1f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
