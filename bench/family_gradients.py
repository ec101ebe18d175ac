"""Closed-form family gradients against autograd, in one process (issue 9, item 2: lean hot path).

For each family with closed-form gradients (``analytic_gradients``), times one call of its
``stacked_grad_log_likelihood`` and ``stacked_grad_log_prior`` on a stack of ``K`` models of ``M``
particles and a block of ``B`` rows, against the generic autograd version every family inherits
(``models.base.Family.stacked_grad_log_likelihood`` / ``stacked_grad_log_prior``: one backward pass
through the log-density), on the same tensors, alternating ``--repeats`` times (the ratio is taken
per repeat, so load that drifts between repeats cancels). Also times the log-likelihood itself
(``StackedFamily.log_likelihood``: the annealing's per-step evaluation) and checks that the two
gradients agree (largest relative difference printed).

    python bench/family_gradients.py [--ks 1 8 64] [--particles 50] [--rows 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models import make_family  # noqa: E402
from models.base import Family  # noqa: E402
from models.stack import StackedFamily  # noqa: E402

CASES = {
    "gmm C=2 (demo)": ("gmm", {"dim": 1, "components": 2}),
    "gmm C=3 d=2": ("gmm", {"dim": 2, "components": 3}),
    "gmm C=1": ("gmm", {"dim": 1, "components": 1}),
    "autoregressive p=2": ("autoregressive", {"order": 2}),
    "linear_regression (unknown noise)": ("linear_regression", {"features": 3, "noise_std": None}),
}


def data(family: Family, K: int, B: int, g: torch.Generator) -> tuple[torch.Tensor | None, torch.Tensor]:
    f64 = torch.float64
    if family.name == "gmm":
        return None, torch.randn(K, B, family.params.dim, generator=g, dtype=f64)
    d = family.params.order if family.name == "autoregressive" else family.params.features
    return torch.randn(K, B, d, generator=g, dtype=f64), torch.randn(K, B, generator=g, dtype=f64)


def per_call(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def gradients(family: Family, theta, x, y, hp, *, generic: bool) -> torch.Tensor:
    """``[∇ log-likelihood, ∇ log-prior]`` stacked along dim 0: the family's own or the autograd ones."""
    owner = Family if generic else type(family)
    return torch.cat([owner.stacked_grad_log_likelihood(family, theta, x, y, hp),
                      owner.stacked_grad_log_prior(family, theta, hp)])  # fmt: skip


def row(label: str, family: Family, K: int, args, g: torch.Generator) -> str:
    sf = StackedFamily([family] * K, torch.float64, "cpu")
    theta = torch.randn(K, args.particles, family.dim, generator=g, dtype=torch.float64)
    x, y = data(family, K, args.rows, g)
    a, b = (gradients(family, theta, x, y, sf.hp, generic=v) for v in (False, True))
    rel = float(((a - b).abs() / b.abs().clamp_min(1e-12)).max())
    ratios, ta, tc = [], [], []
    for _ in range(args.repeats):
        ta.append(per_call(lambda: gradients(family, theta, x, y, sf.hp, generic=True), args.calls))
        tc.append(per_call(lambda: gradients(family, theta, x, y, sf.hp, generic=False), args.calls))
        ratios.append(ta[-1] / tc[-1])
    tl = per_call(lambda: sf.log_likelihood(theta, x, y), args.calls)
    return (f"| {label} | {K} | {min(ta):.3f} | {min(tc):.3f} | {statistics.median(ratios):.1f}× | {tl:.3f} | "
            f"{rel:.1e} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--particles", type=int, default=50)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    print("| family | K | autograd ms (ll + prior) | closed form ms | ratio | log-likelihood ms | max rel. diff |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, (name, params) in CASES.items():
        family = make_family(name, params)
        for K in args.ks:
            print(row(label, family, K, args, g), flush=True)


if __name__ == "__main__":
    main()
