"""Calibration of ``log_evidence_se`` (issue 10, acceptance 2): reported error bar vs spread over seeds.

For each conjugate case, ``--seeds`` models that differ only in their sampler seed absorb one data set
(one stream) in 500-value chunks, split into blocks the way the worker splits them
(:func:`workers.engine.block_bounds`: the stream's first values alone, then ``block_size`` blocks), all
seeds advancing as one stack (:func:`workers.stacking.advance_stack`; each model's bits are those it
gets alone).  At each ``n`` the bench prints, over the seeds:

* ``mean err``: mean of ``log Ẑ_n − log Z_n`` (exact conjugate value, :mod:`models.conjugate`);
* ``std``: sample standard deviation of ``log Ẑ_n`` across seeds (the Monte Carlo error to match);
* ``RMS SE``: root mean square of the reported ``log_evidence_se``;
* ``ratio`` = RMS SE / std — acceptance asks for [0.5, 2] and |mean err| ≤ 1 nat;
* ``in 2 SE``: the share of seeds whose error is within twice their own reported SE (about 95% for an unbiased
  estimate with a calibrated SE; bias lowers it, which the ratio alone does not show);
* ``degraded``: the share of seeds whose status is ``degraded`` (the sampler's own checks, e.g. the score check,
  flagged the value); ``in 2 SE`` counts every seed, flagged or not.

Cases: ``gmm`` (one component), ``linear_regression`` (known noise) and ``linear_regression_nig`` (unknown noise,
normal–inverse-gamma prior; its gradients come from sufficient statistics).

With S seeds the sample std is itself uncertain by about 1/√(2(S−1)) (21 % at S = 12), so the ratio
is too.

    python bench/calibration.py                       # gmm and linear regression, n = 500, 2000; 12 seeds
    python bench/calibration.py --ns 500 2000 10000   # and a longer stream
    python bench/calibration.py --sampler '{"batch_size": 5000}'   # non-default sampler settings
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import torch

from models.conjugate import LinearRegressionEvidence, gmm_one_component_log_evidence
from workers.engine import ModelEngine, block_bounds
from workers.stacking import advance_stack

D64 = torch.float64
CHUNK = 500


def make_case(name: str, n: int, data_seed: int) -> tuple[str, dict[str, Any], torch.Tensor | None, torch.Tensor, Any]:
    """``(family, params, x, y, exact)`` with ``exact(m)`` the log-evidence (nats) of the first m values."""
    g = torch.Generator().manual_seed(data_seed)
    if name == "gmm":  # one-component gmm: normal–inverse-gamma evidence, default priors
        y = torch.randn(n, generator=g, dtype=D64) * 1.5 + 1.0
        return (
            "gmm",
            {"dim": 1, "components": 1},
            None,
            y,
            lambda m: gmm_one_component_log_evidence(y[:m, None].numpy(), 1.0, 1.0, 4.0),
        )
    if name == "linear_regression":  # known noise 1, prior std 1 (thesis §5.2.1)
        x = torch.randn(n, 3, generator=g, dtype=D64)
        y = x @ torch.tensor([1.0, -0.5, 0.3], dtype=D64) + 0.2 + torch.randn(n, generator=g, dtype=D64)
        return (
            "linear_regression",
            {"features": 3},
            x,
            y,
            lambda m: LinearRegressionEvidence(3).update(x[:m].numpy(), y[:m].numpy()).log_evidence,
        )
    if name == "linear_regression_nig":  # unknown noise: σ² ~ IG(1, 1), θ | σ² ~ N(0, σ² I)
        x = torch.randn(n, 3, generator=g, dtype=D64)
        y = x @ torch.tensor([1.0, -0.5, 0.3], dtype=D64) + 0.2 + torch.randn(n, generator=g, dtype=D64)
        return (
            "linear_regression",
            {"features": 3, "noise_std": None},
            x,
            y,
            lambda m: LinearRegressionEvidence(3, noise_std=None).update(x[:m].numpy(), y[:m].numpy()).log_evidence,
        )
    raise ValueError(name)


def run(
    name: str, ns: list[int], seeds: int, data_seed: int = 100, sampler: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per n: ``{"model", "n", "mean_err", "std", "rms_se", "ratio", "within_2se", "degraded", "seconds"}``;
    ``sampler`` overrides default settings."""
    family, params, x, y, exact = make_case(name, max(ns), data_seed)
    engines = [ModelEngine(family, params, {**(sampler or {}), "seed": s}) for s in range(seeds)]
    rows, done, t0 = [], 0, time.perf_counter()
    for n in sorted(ns):
        while done < n:
            stop = min(done + CHUNK, n)
            for a, b in block_bounds(done, stop - done, engines[0].settings.block_size):
                xs = x[done + a : done + b] if x is not None else None
                for res in advance_stack(engines, [(xs, y[done + a : done + b])] * seeds):
                    if isinstance(res, Exception):
                        raise res
            done = stop
        z = exact(n)
        err = [e.log_evidence - z for e in engines]
        sd = statistics.stdev(err)
        rms = math.sqrt(statistics.fmean(e.log_evidence_se**2 for e in engines))
        rows.append(
            {
                "model": name,
                "n": n,
                "mean_err": statistics.fmean(err),
                "std": sd,
                "rms_se": rms,
                "ratio": rms / sd,
                "within_2se": statistics.fmean(
                    abs(e) <= 2 * m.log_evidence_se for e, m in zip(err, engines, strict=True)
                ),
                "degraded": statistics.fmean(bool(m.degraded) for m in engines),
                "seconds": time.perf_counter() - t0,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gmm", "linear_regression"])
    ap.add_argument("--ns", nargs="+", type=int, default=[500, 2000])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--data-seed", type=int, default=100)
    ap.add_argument("--sampler", type=json.loads, default={}, help="sampler overrides, e.g. '{\"batch_size\": 5000}'")
    a = ap.parse_args()
    torch.set_num_threads(1)
    head = (
        f"{'model':<21} {'n':>6} {'mean err':>9} {'std':>7} {'RMS SE':>7} {'ratio':>6} {'in 2 SE':>7} "
        f"{'degraded':>8} {'seconds':>8}"
    )
    print(head, flush=True)
    for name in a.models:
        for r in run(name, a.ns, a.seeds, a.data_seed, a.sampler):
            print(
                f"{r['model']:<21} {r['n']:>6} {r['mean_err']:>+9.3f} {r['std']:>7.3f} {r['rms_se']:>7.3f} "
                f"{r['ratio']:>6.2f} {r['within_2se']:>7.0%} {r['degraded']:>8.0%} {r['seconds']:>8.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
