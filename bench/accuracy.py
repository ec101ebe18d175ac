"""Accuracy and speed of SGAIS against the exact evidence of the thesis's linear regression.

Thesis §5.2.1: ``y = wᵀx + b + ε``, d = 5, ``ε ~ N(0, 1)`` known, ``w, b ~ N(0, 1)``; here
``x ~ N(0, I)`` and the true ``(w, b)`` are drawn from the prior.  The stream is fed in
500-observation chunks; at each checkpoint n the bench prints ``|log Ẑ − log Z|`` (median
over seeds), the target ``3·10⁻⁴·n + 10`` nats, the throughput, and the seconds per
500-observation block around n = 10⁴ and n = 10⁵ (issue 2, items 4 and 6).

    python bench/accuracy.py                      # default settings, n = 10^5, 5 seeds
    python bench/accuracy.py --n 1000000          # up to 10^6
    python bench/accuracy.py --variants           # also the thesis baseline and each improvement
    python bench/accuracy.py --baseline           # defaults against moves after every annealing step
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from models.conjugate import LinearRegressionEvidence
from workers.engine import ModelEngine
from workers.worker.loop import warm_lazy_imports

D = 5
CHUNK = 500

# The ladder from the thesis's algorithm to the defaults; each row adds one change to the previous one.
_THESIS = {
    "moves": "every_step",
    "control_variates": False,
    "learning_rate_schedule": "block",
    "resample_threshold": 0.0,
    "warmup_particles": None,
    "preconditioning": False,
    "ess_target": 0.5,
}
VARIANTS = {
    # Cameron 2020, Alg. 8 as written: plain mini-batch gradients, η = 0.1/n, no resampling, M = 10, ESS* = M/2.
    "thesis": _THESIS,
    "+annealed η": {**_THESIS, "learning_rate_schedule": "annealed"},
    "+control variates": {**_THESIS, "learning_rate_schedule": "annealed", "control_variates": True},
    "+resampling": {
        **_THESIS,
        "learning_rate_schedule": "annealed",
        "control_variates": True,
        "resample_threshold": 0.5,
    },
    "+warm-up particles": {"moves": "every_step", "preconditioning": False, "ess_target": 0.5},
    "+preconditioning": {"moves": "every_step", "ess_target": 0.5, "fisher_step_growth": 1},
    "+ess_target 0.8": {"moves": "every_step", "ess_target": 0.8, "fisher_step_growth": 1},
    "+ess_target 0.9": {"moves": "every_step", "fisher_step_growth": 1},
    "+Fisher step cap": {"moves": "every_step"},  # + Fisher-scaled step cap after the warm-up
    "default": {},  # + adaptive moves: no SGHMC moves for a block taken in one step without resampling
}


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 + seed)
    w = torch.randn(D, generator=g, dtype=torch.float64)
    b = torch.randn((), generator=g, dtype=torch.float64)
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    y = x @ w + b + torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def run(n: int, seed: int, sampler: dict, checkpoints: list[int]) -> dict:
    x, y = make_data(n, seed)
    exact = LinearRegressionEvidence(D, noise_std=1.0, prior_std=1.0)
    engine = ModelEngine("linear_regression", {"features": D}, {"seed": seed, **sampler})
    errors: dict[int, float] = {}
    block_seconds: dict[int, float] = {}
    engine_seconds = cpu_seconds = 0.0
    for start in range(0, n, CHUNK):
        xb, yb = x[start : start + CHUNK], y[start : start + CHUNK]
        t0, c0 = time.perf_counter(), time.process_time()
        engine.update(xb, yb, validated=True)
        dt = time.perf_counter() - t0
        cpu_seconds += time.process_time() - c0
        engine_seconds += dt
        block_seconds[start + CHUNK] = dt
        exact.update(xb, yb)
        m = start + CHUNK
        if m in checkpoints:
            errors[m] = engine.log_evidence - exact.log_evidence
    return {
        "errors": errors,
        "seconds": engine_seconds,
        "cpu_seconds": cpu_seconds,
        "block_seconds": block_seconds,
        "degraded": engine.degraded,
    }


def block_time_around(block_seconds: dict[int, float], n: int, width: int = 20) -> float:
    """Median seconds per block over the ``width`` blocks ending at observation ``n``."""
    values = [block_seconds[m] for m in range(n - (width - 1) * CHUNK, n + 1, CHUNK) if m in block_seconds]
    return statistics.median(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest for d=5)")
    ap.add_argument("--variants", action="store_true", help="also run the thesis baseline and each step")
    ap.add_argument("--sampler", type=json.loads, default=None, help="JSON sampler overrides to measure instead")
    ap.add_argument(
        "--baseline",
        action="store_true",
        help="also run moves after every annealing step (the engine before adaptive moves)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # what the first block imports (sympy; scipy.optimize for the first L-BFGS-B of a Laplace start),
    # imported up front as every worker does at start, so the first seed's first block does not time an import
    warm_lazy_imports()
    checkpoints = [m for m in (1_000, 10_000, 100_000, 1_000_000) if m <= args.n]
    variants = VARIANTS if args.variants else {"default": {}}
    if args.sampler is not None:
        variants = {"custom": args.sampler}
    if args.baseline:
        variants = {"moves every_step (baseline)": {"moves": "every_step"}, **variants}
    print(
        f"linear regression d={D}, known noise, chunks of {CHUNK}, n={args.n}, seeds={args.seeds}, "
        f"torch threads={args.threads}"
    )
    for name, sampler in variants.items():
        results = [run(args.n, seed, sampler, checkpoints) for seed in range(args.seeds)]
        seconds = sum(r["seconds"] for r in results)
        print(f"\n== {name}: {sampler or 'defaults'}")
        print(f"{'n':>9} {'median |err|':>13} {'max |err|':>10} {'target':>9} {'ok':>4}   signed errors by seed")
        for m in checkpoints:
            errs = [r["errors"][m] for r in results]
            med = statistics.median(abs(e) for e in errs)
            target = 3e-4 * m + 10
            ok = "yes" if med <= target else "NO"
            print(
                f"{m:>9} {med:>13.3f} {max(abs(e) for e in errs):>10.3f} {target:>9.1f} {ok:>4}   "
                + " ".join(f"{e:+.2f}" for e in errs)
            )
        cpu = sum(r["cpu_seconds"] for r in results)
        flagged = [r["degraded"] for r in results if r["degraded"]]
        print(
            f"status degraded at the end: {len(flagged)} of {args.seeds} seeds"
            + (f" ({flagged[0]})" if flagged else "")
        )
        print(
            f"throughput: {args.seeds * args.n / seconds:,.0f} observations/s (engine wall time only, single model); "
            f"{args.seeds * args.n / cpu:,.0f} per engine CPU second; load average {os.getloadavg()[0]:.1f}"
        )
        if args.n >= 100_000:
            small = statistics.median(block_time_around(r["block_seconds"], 10_000) for r in results)
            large = statistics.median(block_time_around(r["block_seconds"], 100_000) for r in results)
            print(
                f"seconds per {CHUNK}-observation block: {small * 1e3:.2f} ms near n=10^4, "
                f"{large * 1e3:.2f} ms near n=10^5, ratio {large / small:.2f} (target ≤ 1.3)"
            )


if __name__ == "__main__":
    main()
