"""What the Gibbs sweeps cost (sampler ``gibbs_sweeps``, workers.sgais.gibbs_sweep): ``--models`` AR(1)
models with change-point challengers (default settings, different priors and seeds) absorb a stationary AR(1)
stream's first ``--chunks`` 5-value chunks through :func:`workers.segmented.advance_blocks` (the worker's call),
with the sweeps on and off alternately in one process, ``--repeats`` times each.  Prints CPU ms per model-block
(``time.process_time``, one thread, the worker's collector settings) and the ratio on/off per repeat.

    python bench/gibbs_sweeps.py [--models 1] [--chunks 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.runner import quiet_gc  # noqa: E402
from workers.segmented import SegmentedEngine, advance_blocks  # noqa: E402
from workers.worker.loop import warm_lazy_imports  # noqa: E402


def stream(n: int, seed: int = 1) -> torch.Tensor:
    """A stationary AR(1): ``z_t = 0.7 z_{t−1} + 0.5 ε_t``, ``n`` values."""
    g = torch.Generator().manual_seed(seed)
    eps = 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    z = torch.zeros(n, dtype=torch.float64)
    for t in range(1, n):
        z[t] = 0.7 * z[t - 1] + eps[t]
    return z


def run(models: int, chunks: int, sweeps: bool) -> float:
    """CPU ms per model-block."""
    z = stream(5 * chunks)
    engines = [
        SegmentedEngine.create(
            "autoregressive",
            {"order": 1, "prior_std": 1.0 + (i % 3) / 3},
            {"seed": i, "gibbs_sweeps": 2 if sweeps else 0},
            ChangepointSettings(),
        )
        for i in range(models)
    ]
    t0 = time.process_time()
    for c in range(chunks):
        out = advance_blocks(engines, [(None, z[5 * c : 5 * c + 5])] * models)
        bad = [o for o in out if isinstance(o, Exception)]
        if bad:
            raise bad[0]
    return 1000 * (time.process_time() - t0) / (models * chunks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the worker (workers.config: torch_threads)
    warm_lazy_imports()
    quiet_gc()
    run(args.models, 4, True)  # first calls' one-time costs
    ratios = []
    for r in range(args.repeats):
        on, off = run(args.models, args.chunks, True), run(args.models, args.chunks, False)
        ratios.append(on / off)
        print(f"repeat {r}: sweeps on {on:.3f}, off {off:.3f} CPU ms per model-block, ratio {on / off:.3f}")
    print(f"{args.models} AR(1) models, {args.chunks} chunks of 5: median ratio on/off {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
