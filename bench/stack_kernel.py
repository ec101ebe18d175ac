"""Cost of one model-step on a stack of K models, against the arithmetic it does.

For K = 1, 10, 100, 1000 models of one family on one stream (different priors and seeds), each
absorbs the same 5-observation blocks (a live feed) through ``workers.stacking.advance_stack``;
the bench reports the time per model-block, per model-step (one SGHMC step of one model, all the
annealing bookkeeping included) and per likelihood term (``M · (B + 2·|batch|)`` terms per
model-step: block rows at the particles, mini-batch rows at the particles and their anchors).
Baselines in the same run: the same models advanced one at a time (``ModelEngine.update``, a
stack of one each) and, with ``--baseline DIR`` (a checkout of the old single-model engine, e.g.
``git worktree add /tmp/oldengine 24aa4ac``), the old engine on the same workload in a subprocess.
Also: the cost of drawing each model's noise from its own ``torch.Generator`` at K = 1000.

    python bench/stack_kernel.py --baseline /tmp/oldengine          # all families, K up to 1000
    python bench/stack_kernel.py --family gmm --ks 1 10 --blocks 2  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

FAMILIES = {
    "gmm": lambda k: (
        "gmm",
        {"dim": 1, "components": 1, "variance_shape": 1.0 + (k % 7) / 7, "mean_scale": 1.0 + k % 5},
    ),
    "ar1": lambda k: ("autoregressive", {"order": 1, "prior_std": 1.0 + (k % 3) / 3}),
    "lr5": lambda k: ("linear_regression", {"features": 5, "prior_std": 1.0 + (k % 3) / 3}),
}
WARM = 100  # observations absorbed (one block) before timing
BLOCK = 5


def stream(family: str, n: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if family == "lr5":
        x = torch.randn(n, 5, generator=g, dtype=torch.float64)
        return x, x @ torch.linspace(-1, 1, 5, dtype=torch.float64) + torch.randn(n, generator=g, dtype=torch.float64)
    if family == "ar1":
        y = torch.zeros(n, dtype=torch.float64)
        for t in range(1, n):
            y[t] = 0.7 * y[t - 1] + float(torch.randn((), generator=g, dtype=torch.float64))
        return None, y
    return None, 1.5 * torch.randn(n, generator=g, dtype=torch.float64) + 1.0


def workload(family: str, K: int, blocks: int, stacked: bool) -> dict:
    """Seconds per model-block and counts, for K models fed ``blocks`` blocks of 5 after a warm block."""
    from workers.engine import ModelEngine

    x, y = stream(family, WARM + BLOCK * blocks)
    engines = [ModelEngine(*FAMILIES[family](k), {"seed": k}) for k in range(K)]

    def chunk(a: int, b: int):
        return (x[a:b] if x is not None else None), y[a:b]

    def feed(a: int, b: int) -> list:
        if stacked:
            from workers.stacking import advance_stack

            return advance_stack(engines, [chunk(a, b)] * K)
        return [e.update(*chunk(a, b)) for e in engines]

    feed(0, WARM)
    seconds, steps = 0.0, 0
    for i in range(blocks):
        a = WARM + BLOCK * i
        t0 = time.perf_counter()
        results = feed(a, a + BLOCK)
        seconds += time.perf_counter() - t0
        steps += sum(info.annealing_steps for r in results for info in r) * engines[0].settings.burn_in
    s = engines[0].settings
    M = engines[0].state.theta.shape[0]
    return {
        "model_block_ms": 1e3 * seconds / (K * blocks),
        "model_step_us": 1e6 * seconds / max(steps, 1),
        "terms_per_step": M * (BLOCK + 2 * s.batch_size),
        "particles": M,
        "steps_per_block": steps / (K * blocks),
    }


def generator_cost(K: int = 1000, M: int = 50, D: int = 3, repeats: int = 20) -> tuple[float, float]:
    """Seconds for K per-model ``randn`` calls stacked, and for one ``randn`` of the same size."""
    gens = [torch.Generator().manual_seed(k) for k in range(K)]
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.stack([torch.randn((M, D), generator=g, dtype=torch.float64) for g in gens])
    per_model = (time.perf_counter() - t0) / repeats
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.randn((K, M, D), generator=g, dtype=torch.float64)
    return per_model, (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=list(FAMILIES), nargs="*", default=list(FAMILIES))
    ap.add_argument("--ks", type=int, nargs="*", default=[1, 10, 100, 1000])
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--loop-max", type=int, default=10, help="largest K for the one-at-a-time baseline")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--baseline", default=None, help="checkout of the old single-model engine")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args._child:  # run inside the baseline checkout: one model at a time
        fam, K = args._child.split(":")
        print(json.dumps(workload(fam, int(K), args.blocks, stacked=False)))
        return
    print(f"torch {torch.__version__}, threads={args.threads}, blocks of {BLOCK} after {WARM} observations, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for fam in args.family:
        print(f"\n== {fam}: {FAMILIES[fam](0)}")
        print(f"{'K':>6} {'mode':>9} {'ms/model-block':>15} {'µs/model-step':>14} {'ns/term':>8} {'M':>3} "
              f"{'steps/block':>11} {'vs loop K=1':>11}")  # fmt: skip
        rows = []
        if args.baseline:
            env = {**os.environ, "PYTHONPATH": args.baseline}
            cmd = [sys.executable, os.path.abspath(__file__), "--_child", f"{fam}:1", "--blocks", str(args.blocks),
                   "--threads", str(args.threads)]  # fmt: skip
            out = subprocess.run(cmd, env=env, cwd=args.baseline, capture_output=True, text=True, check=True)
            rows.append((1, "old", json.loads(out.stdout.strip().splitlines()[-1])))
        for K in args.ks:
            if K <= args.loop_max:
                rows.append((K, "loop", workload(fam, K, args.blocks, stacked=False)))
            rows.append((K, "stacked", workload(fam, K, args.blocks, stacked=True)))
        base = next(r for k, mode, r in rows if mode == "loop")["model_block_ms"]
        for K, mode, r in rows:
            ns = 1e3 * r["model_step_us"] / r["terms_per_step"]
            speedup = base / r["model_block_ms"]
            print(f"{K:>6} {mode:>9} {r['model_block_ms']:>15.3f} {r['model_step_us']:>14.1f} {ns:>8.1f} "
                  f"{r['particles']:>3} {r['steps_per_block']:>11.1f} {speedup:>10.1f}x")  # fmt: skip
    per_model, one = generator_cost()
    print(f"\nnoise for 1000 models × 50 × 3 from 1000 generators: {per_model * 1e3:.2f} ms; one generator: "
          f"{one * 1e3:.2f} ms (per-model generators cost {per_model / one:.0f}× the draw)")  # fmt: skip


if __name__ == "__main__":
    main()
