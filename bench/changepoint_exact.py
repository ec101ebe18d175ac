"""Re-annealing against exact evidence on a non-stationary stream (conjugate linear regression).

The evidence of a conjugate model does not depend on the order of the data, so a stream whose
regression weights change can be scored exactly at every n: ``y = x·w + 0.5 + ε`` with d = 5,
``ε ~ N(0, 1)``, ``w`` drawn from N(0, 1) and re-drawn at each change point (10,000 and 40,000 by
default), blocks of 500, n = 100,000. Prints |log Ẑ − log Z| at the changes, a few later points
and the end, with re-annealing (the default) and without (``reanneal_steps: null``), over seeds,
and the engine time of each.

    python bench/changepoint_exact.py [--n 100000] [--changes 10000,40000] [--seeds 3] [--sampler JSON]
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

from models.conjugate import LinearRegressionEvidence  # noqa: E402
from workers.engine import ModelEngine  # noqa: E402

D, CHUNK = 5, 500


def make_data(n: int, changes: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    y = torch.empty(n, dtype=torch.float64)
    bounds = [0, *changes, n]
    for a, b in zip(bounds, bounds[1:], strict=False):
        w = torch.randn(D, generator=g, dtype=torch.float64)
        y[a:b] = x[a:b] @ w + 0.5 + torch.randn(b - a, generator=g, dtype=torch.float64)
    return x, y


def run(x: torch.Tensor, y: torch.Tensor, marks: list[int], seed: int, sampler: dict) -> tuple[dict, float, list]:
    exact = LinearRegressionEvidence(D, noise_std=1.0, prior_std=1.0)
    engine = ModelEngine("linear_regression", {"features": D}, {"seed": seed, **sampler})
    errors, seconds, reannealed = {}, 0.0, []
    for a in range(0, y.shape[0], CHUNK):
        xb, yb = x[a : a + CHUNK], y[a : a + CHUNK]
        t0 = time.perf_counter()
        (info,) = engine.update(xb, yb, validated=True)
        seconds += time.perf_counter() - t0
        exact.update(xb.numpy(), yb.numpy())
        n = a + yb.shape[0]
        if info.reannealed:
            reannealed.append(n)
        if n in marks:
            errors[n] = engine.log_evidence - exact.log_evidence
    return errors, seconds, reannealed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--changes", default="10000,40000")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--sampler", default="{}", help="SGAIS settings for both variants, JSON (e.g. '{\"burn_in\": 50}')")
    args = ap.parse_args()
    extra = json.loads(args.sampler)
    torch.set_num_threads(1)
    changes = [int(c) for c in args.changes.split(",") if c]
    marks = sorted({*(c + CHUNK for c in changes), *(2 * c for c in changes), args.n} - {0})
    marks = [m for m in marks if m <= args.n]
    variants = {"re-annealing (defaults)": extra, "without (reanneal_steps null)": {**extra, "reanneal_steps": None}}
    print(
        f"linear regression d={D}, known noise, blocks of {CHUNK}, n={args.n}, weights re-drawn at {changes}, "
        f"sampler overrides {extra}; "
        f"signed log Ẑ − log Z (nats), median over {args.seeds} seeds [min, max]"
    )
    for label, sampler in variants.items():
        rows = [run(*make_data(args.n, changes, s), marks, s, sampler) for s in range(args.seeds)]
        cells = []
        for m in marks:
            e = [r[0][m] for r in rows]
            cells.append(f"n={m}: {statistics.median(e):+.2f} [{min(e):+.2f}, {max(e):+.2f}]")
        secs = statistics.median(r[1] for r in rows)
        print(
            f"{label}: " + "; ".join(cells) + f"; engine {secs:.1f} s; re-annealed at {rows[0][2]} (seed 0)", flush=True
        )


if __name__ == "__main__":
    main()
