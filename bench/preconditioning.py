"""Linear regression on high-curvature data with and without the diagonal step cap.

    python bench/preconditioning.py

Prints ``log Ẑ − log Z`` (nats) for seeds 0–3 at n = 3,000 (d = 3) for several noise stds and
covariate scales; "diverged" means the engine raised ``NumericalError``.  Table in
bench/README.md, "Preconditioning".
"""

from __future__ import annotations

import torch

from models.conjugate import LinearRegressionEvidence
from workers.engine import ModelEngine
from workers.sgais import NumericalError


def error(seed: int, noise: float, x_scale: float, sampler: dict, n: int = 3000, d: int = 3) -> float | None:
    g = torch.Generator().manual_seed(100 + seed)
    w = torch.randn(d, generator=g, dtype=torch.float64)
    x = x_scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ w + 0.3 + noise * torch.randn(n, generator=g, dtype=torch.float64)
    engine = ModelEngine("linear_regression", {"features": d, "noise_std": noise}, {"seed": seed, **sampler})
    try:
        for i in range(0, n, 500):
            engine.update(x[i : i + 500], y[i : i + 500], validated=True)
    except NumericalError:
        return None
    exact = LinearRegressionEvidence(d, noise_std=noise).update(x.numpy(), y.numpy()).log_evidence
    return engine.log_evidence - exact


def main() -> None:
    torch.set_num_threads(1)
    for noise, x_scale in [(1, 1), (0.3, 1), (0.1, 1), (0.01, 1), (1, 10), (1, 0.1)]:
        for name, sampler in [("on", {}), ("off", {"preconditioning": False})]:
            errs = [error(k, noise, x_scale, sampler) for k in range(4)]
            cells = " ".join("diverged" if e is None else f"{e:+.2f}" for e in errs)
            print(f"noise {noise:<5} x scale {x_scale:<4} preconditioning {name:3s}: {cells}", flush=True)


if __name__ == "__main__":
    main()
