"""Where the early error of SGAIS comes from: variants on the first blocks of the linear regression.

    python bench/early_error.py

Linear regression d = 5 (bench/accuracy.py data), n = 3,000, 10 seeds: median |log Ẑ − log Z|,
mean and sd (nats) for block schedules and sampler settings.  Used to choose the warm-up
particles (bench/README.md, "Accuracy").
"""

from __future__ import annotations

import statistics

import torch
from accuracy import make_data

from models.conjugate import LinearRegressionEvidence
from workers.engine import ModelEngine

VARIANTS = [
    ("500-blocks, no warm-up", {"warmup_particles": None}, [500] * 6),
    ("50-blocks first, no warm-up", {"warmup_particles": None}, [50] * 10 + [500] * 5),
    ("20, 40, ... schedule, no warm-up", {"warmup_particles": None}, [20, 40, 60, 80, 100, 200] + [500] * 5),
    ("burn_in 50, no warm-up", {"warmup_particles": None, "burn_in": 50}, [500] * 6),
    ("ess_target 0.5 (thesis), no warm-up", {"warmup_particles": None, "ess_target": 0.5}, [500] * 6),
    ("50 particles throughout", {"particles": 50, "warmup_particles": None}, [500] * 6),
    ("warm-up 50 particles (default)", {}, [500] * 6),
    ("warm-up 100 particles", {"warmup_particles": 100}, [500] * 6),
]


def error(seed: int, sampler: dict, sizes: list[int]) -> float:
    x, y = make_data(3000, seed)
    engine = ModelEngine("linear_regression", {"features": 5}, {"seed": seed, **sampler})
    i = 0
    for size in sizes:
        engine.update(x[i : i + size], y[i : i + size], validated=True)
        i += size
    exact = LinearRegressionEvidence(5).update(x[:i].numpy(), y[:i].numpy()).log_evidence
    return engine.log_evidence - exact


def main() -> None:
    torch.set_num_threads(1)
    for name, sampler, sizes in VARIANTS:
        errs = [error(seed, sampler, sizes) for seed in range(10)]
        print(
            f"{name:34s} median |err| {statistics.median(abs(e) for e in errs):6.2f}  "
            f"mean {statistics.mean(errs):+7.2f}  sd {statistics.stdev(errs):5.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
