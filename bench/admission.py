"""Throughput behind the admission time estimate (workers/admission.py): element operations per second.

For each family, one SGHMC-like step (gradient + log-likelihood of M particles on a mini-batch of B) is
timed and compared with the estimate's ``6 · D · M · B`` element operations; the printed rate is what
``SGAIS_ADMISSION_FLOPS_PER_SECOND`` assumes (default 1e8).

    nice python bench/admission.py
"""

from __future__ import annotations

import time

import torch

from models import make_family

CASES = [
    ("gmm", {"dim": 2, "components": 3}),
    ("gmm", {"dim": 10, "components": 10}),
    ("gmm", {"dim": 20, "components": 50}),
    ("bnn", {"features": 5, "hidden": [32, 32], "outputs": 1}),
    ("linear_regression", {"features": 50}),
    ("logistic_regression", {"features": 20, "classes": 4}),
    ("autoregressive", {"order": 5}),
]


def main(M: int = 50, B: int = 500, repeats: int = 5) -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    for name, params in CASES:
        f = make_family(name, params)
        theta = f.sample_prior(g, M)
        xdim = f.observation_schema()["x"]
        x = torch.randn(B, xdim, generator=g, dtype=torch.float64) if xdim else None
        if name == "logistic_regression":
            y = torch.randint(0, params["classes"], (B,), generator=g).double()
        elif name == "gmm":
            y = torch.randn(B, params["dim"], generator=g, dtype=torch.float64)
        else:
            y = torch.randn(B, generator=g, dtype=torch.float64)
        if f.context_size:
            x, y, _ = f.prepare(None, y, None)
        f.grad_log_likelihood(theta, x, y)
        t = time.perf_counter()
        for _ in range(repeats):
            f.grad_log_likelihood(theta, x, y)
            f.log_likelihood(theta, x, y)
        dt = (time.perf_counter() - t) / repeats
        ops = 6 * f.dim * M * B
        print(f"{name:20s} D={f.dim:6d}  step {dt * 1e3:8.2f} ms  estimate-ops/s {ops / dt:.3g}")


if __name__ == "__main__":
    main()
