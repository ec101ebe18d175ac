"""Two linear regressions on different feature subsets of one stream: SGAIS log Bayes factor vs exact (issue 10,
acceptance 5).

The data imitate scikit-learn's diabetes set (which is not a dependency here): n = 442 rows, ten named,
correlated, standardised covariates, a standardised response.  Both models use unknown noise (the
normal–inverse-gamma prior, default hyperparameters) and ``params.features`` names; the exact log-evidence
is :class:`models.conjugate.LinearRegressionEvidence` (a multivariate Student-t).  The bare engine absorbs the
stream in chunks of 100 (the service's path without Redis); every seed gives each model's error
``log Ẑ − log Z`` and the log Bayes factor's error.

    python bench/feature_subsets.py --seeds 12
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from models.conjugate import LinearRegressionEvidence
from workers.engine import ModelEngine

COLUMNS = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
#: The two competing models: (name, params) on one stream with the ten columns above.
MODELS = {
    "bmi-bp-s5": {"features": ["bmi", "bp", "s5"], "columns": COLUMNS, "noise_std": None},
    "age-sex-bmi-s1": {"features": ["age", "sex", "bmi", "s1"], "columns": COLUMNS, "noise_std": None},
}
N_ROWS, CHUNK = 442, 100


def diabetes_like(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(X: [442, 10], y: [442])``, both standardised with the full sample (an offline data set).

    Covariates: a common factor plus noise (pairwise correlations about 0.3, as in the diabetes set's serum
    measurements); ``y = 0.5 bmi + 0.3 bp + 0.4 s5 + 0.1 age + N(0, 0.8²)`` before standardising.
    """
    rng = np.random.default_rng(seed)
    common = rng.normal(size=(N_ROWS, 1))
    X = 0.6 * common + 0.8 * rng.normal(size=(N_ROWS, len(COLUMNS)))
    X = (X - X.mean(0)) / X.std(0)
    col = {c: X[:, i] for i, c in enumerate(COLUMNS)}
    y = 0.5 * col["bmi"] + 0.3 * col["bp"] + 0.4 * col["s5"] + 0.1 * col["age"] + 0.8 * rng.normal(size=N_ROWS)
    return X, (y - y.mean()) / y.std()


def exact_log_evidence(params: dict, X: np.ndarray, y: np.ndarray) -> float:
    """The model's exact log-evidence (nats) on the stream's rows (its columns selected by ``params``)."""
    return LinearRegressionEvidence.for_params(params).update(X, y).log_evidence


def run(seed: int, X: np.ndarray, y: np.ndarray, sampler: dict | None = None) -> dict[str, float]:
    """Each model's SGAIS log-evidence after the stream, chunk by chunk, with sampler seed ``seed``."""
    out = {}
    for k, (name, params) in enumerate(MODELS.items()):
        eng = ModelEngine("linear_regression", params, {**(sampler or {}), "seed": 100 * seed + k})
        for a in range(0, N_ROWS, CHUNK):
            eng.update(torch.from_numpy(X[a : a + CHUNK]), torch.from_numpy(y[a : a + CHUNK]))
        out[name] = eng.log_evidence
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--data-seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    X, y = diabetes_like(args.data_seed)
    exact = {m: exact_log_evidence(p, X, y) for m, p in MODELS.items()}
    a, b = MODELS
    print(f"exact log Z: {exact}; exact log BF({a} : {b}) = {exact[a] - exact[b]:.3f}")
    errs: dict[str, list[float]] = {m: [] for m in MODELS}
    bf: list[float] = []
    t0 = time.perf_counter()
    for s in range(args.seeds):
        got = run(s, X, y)
        for m in MODELS:
            errs[m].append(got[m] - exact[m])
        bf.append((got[a] - got[b]) - (exact[a] - exact[b]))
        print(f"seed {s}: errors {[round(errs[m][-1], 3) for m in MODELS]}, log BF error {bf[-1]:.3f}", flush=True)
    for m in MODELS:
        e = np.array(errs[m])
        print(f"{m}: error mean {e.mean():.3f} sd {e.std(ddof=1):.3f} max |e| {np.abs(e).max():.3f}")
    e = np.array(bf)
    print(
        f"log BF error over {args.seeds} seeds: mean {e.mean():.3f} sd {e.std(ddof=1):.3f} "
        f"max |e| {np.abs(e).max():.3f} (acceptance: within 2 nats); {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
