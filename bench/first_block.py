"""A fresh population's first blocks on a stretch of a demo series, against the exact log-evidence (session 27).

A change-point challenger, or a new model, meets its first values as one block of up to ``block_size``: where they
concentrate the posterior far inside the prior's spread (RunLog after its level shift at 317: a nearly constant
series), annealing from the prior asks the SGHMC moves to follow the posterior as it contracts, and they lag it.
This runs a fresh :class:`workers.engine.ModelEngine` (the demo's sampler unless ``--sampler``) on
``series[start:stop]`` (an AR(p) conditioned on the ``p`` values before ``start``) in blocks of ``--block``, for
``--seeds`` seeds, and prints each seed's error against the closed form (:mod:`models.conjugate`), its reported
standard error and status, and the mean error.

    python bench/first_block.py [--series RunLog] [--model ar2] [--start 317] [--stop 376] [--block 50]
                                [--seeds 5] [--sampler '{}']
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo_exact import exact  # noqa: E402

from service.datasets import load_series  # noqa: E402
from service.demo import MODELS, SAMPLER  # noqa: E402
from workers.engine import ModelEngine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", default="RunLog")
    ap.add_argument("--model", default="ar2", choices=["ar1", "ar2", "gmm1"])
    ap.add_argument("--start", type=int, default=317)
    ap.add_argument("--stop", type=int, default=376)
    ap.add_argument("--block", type=int, default=50)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sampler", default="{}", help="overrides of the demo's sampler (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    p = int(args.model[-1]) if args.model.startswith("ar") else 0
    if args.start < p:
        ap.error(f"--start must be at least the AR order ({p}): the values before it are conditioned on")
    z = np.asarray(load_series(args.series).standardised()[:, 0], float)
    values = z[args.start - p : args.stop]
    exact_log_z = exact(values, args.model, [0, len(values)])  # an AR(p) conditioned on the first p values
    errors = []
    for seed in range(args.seeds):
        eng = ModelEngine(*MODELS[args.model], sampler={**SAMPLER, "seed": seed, **json.loads(args.sampler)})
        if p:
            eng.update(None, torch.tensor(values[:p]))  # the conditioning values
        for a in range(p, len(values), args.block):
            eng.update(None, torch.tensor(values[a : a + args.block]))
        err = eng.log_evidence - exact_log_z
        errors.append(err)
        status = "degraded" if eng.degraded else "ok"
        print(f"seed {seed}: error {err:+8.2f} nats, SE {eng.log_evidence_se:.2f}, {status}")
    print(
        f"{args.series}[{args.start}:{args.stop}] {args.model}, blocks of {args.block}: mean error "
        f"{statistics.mean(errors):+.2f} nats over {args.seeds} seeds"
    )


if __name__ == "__main__":
    main()
