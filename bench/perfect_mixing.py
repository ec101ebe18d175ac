"""SGAIS with perfect mixing: is the error bar calibrated when the moves are exact?

The linear regression of ``bench/calibration.py`` (3 covariates, known noise 1, prior N(0, I), data seed 100) is run
by ``--seeds`` models as one stack, in 500-value chunks split as the worker splits them.  With ``--moves exact``
every SGHMC move (:func:`workers.sgais._move`) is replaced by independent draws from the model's current tempered
target, which is Gaussian here: precision ``I + A_Hᵀ A_H + λ A_Cᵀ A_C``, ``A = [x, 1]``, ``H`` the history and ``C``
the block.  The particles are then exactly what the error bar's perfect-mixing assumption says they are
(``workers/sgais.py``, "Error bars"), so what is left is the estimator's own error; with ``--moves sghmc`` (the
engine as it is) the difference is the moves' share.  Prints, at each ``n``, the mean error of the reported
log-evidence and of ``log Ẑ`` before its ``σ̂²/2`` correction, the spread over seeds, the RMS reported SE, their
ratio and the share of seeds within ±2 SE.  The exact draws come from one generator of their own, outside the
models' random streams: a diagnostic, not a sampler.

    python bench/perfect_mixing.py [--moves exact|sghmc] [--ns 2000 10000 30000] [--seeds 48] [--sampler JSON]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

from models.conjugate import LinearRegressionEvidence
from workers import sgais
from workers.engine import ModelEngine, block_bounds
from workers.stacking import advance_stack

D64 = torch.float64


def exact_moves(x: torch.Tensor, y: torch.Tensor, seed: int = 12345):
    """A stand-in for :func:`workers.sgais._move` that draws every moved model's particles afresh from its tempered
    target (the data ``x: [N, 3]``, ``y: [N]`` the models absorb in order)."""
    a = torch.cat([x, torch.ones(x.shape[0], 1, dtype=D64)], 1)
    gram = torch.cat([torch.zeros(1, 4, 4, dtype=D64), torch.cumsum(a[:, :, None] * a[:, None, :], 0)])
    cross = torch.cat([torch.zeros(1, 4, dtype=D64), torch.cumsum(a * y[:, None], 0)])
    gen = torch.Generator().manual_seed(seed)

    def move(block, theta, velocity, anchor, anchor_grad, *, lam, step_size, burn, log_w, variance, correlated=None):
        out = theta.clone()
        for k in range(theta.shape[0]):
            if int(burn[k]) == 0:  # the kernel did not move this model at this step
                continue
            n_prev, lam_k = int(block.n_prev[k]), float(lam[k])
            ab = torch.cat([block.x[k], torch.ones(block.x.shape[1], 1, dtype=D64)], 1)
            chol = torch.linalg.cholesky(torch.eye(4, dtype=D64) + gram[n_prev] + lam_k * ab.T @ ab)
            mean = torch.cholesky_solve((cross[n_prev] + lam_k * ab.T @ block.y[k])[:, None], chol)[:, 0]
            z = torch.randn(theta.shape[1], 4, generator=gen, dtype=D64)
            out[k] = mean + torch.linalg.solve_triangular(chol.T, z.T, upper=True).T
        return out, velocity

    return move


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moves", choices=["exact", "sghmc"], default="exact")
    ap.add_argument("--ns", nargs="+", type=int, default=[2000, 10000, 30000])
    ap.add_argument("--seeds", type=int, default=48)
    ap.add_argument("--data-seed", type=int, default=100)
    ap.add_argument("--sampler", type=json.loads, default={}, help="sampler overrides, e.g. '{\"burn_in\": 80}'")
    a = ap.parse_args()
    torch.set_num_threads(1)
    n = max(a.ns)
    g = torch.Generator().manual_seed(a.data_seed)
    x = torch.randn(n, 3, generator=g, dtype=D64)
    y = x @ torch.tensor([1.0, -0.5, 0.3], dtype=D64) + 0.2 + torch.randn(n, generator=g, dtype=D64)
    if a.moves == "exact":
        sgais._move = exact_moves(x, y)
    engines = [ModelEngine("linear_regression", {"features": 3}, {**a.sampler, "seed": s}) for s in range(a.seeds)]
    print(f"{'moves':<6} {'n':>6} {'mean err':>9} {'uncorr.':>8} {'std':>6} {'RMS SE':>7} {'ratio':>6} {'in 2 SE':>7}")
    done = 0
    for m in sorted(a.ns):
        while done < m:
            stop = min(done + 500, m)
            for lo, hi in block_bounds(done, stop - done, engines[0].settings.block_size):
                chunk = (x[done + lo : done + hi], y[done + lo : done + hi])
                for res in advance_stack(engines, [chunk] * a.seeds):
                    if isinstance(res, Exception):
                        raise res
            done = stop
        exact = LinearRegressionEvidence(3).update(x[:m].numpy(), y[:m].numpy()).log_evidence
        err = [e.log_evidence - exact for e in engines]
        raw = [e.state.log_evidence_uncorrected - exact for e in engines]
        se = [e.log_evidence_se for e in engines]
        sd, rms = statistics.stdev(err), math.sqrt(statistics.fmean(s * s for s in se))
        inside = statistics.fmean(abs(e) <= 2 * s for e, s in zip(err, se, strict=True))
        print(
            f"{a.moves:<6} {m:>6} {statistics.fmean(err):>+9.3f} {statistics.fmean(raw):>+8.3f} {sd:>6.3f} "
            f"{rms:>7.3f} {rms / sd:>6.2f} {inside:>7.0%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
