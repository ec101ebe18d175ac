"""Sampler settings on the thesis's logistic regression (§5.2.2) against the Laplace-t IS reference.

Signed error ``log Ẑ − log Z_IS`` (nats), mean ± sd over seeds, for one sampler setting::

    python bench/logistic_sweep.py --n 10000 --seeds 5 --sampler '{"ess_target": 0.8, "fisher_step_growth": 1}'

The reference values are the cached ``is_logistic_<n>.json`` of ``bench/reference.py --part is``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reference import CHUNK, DATA_SEED, RESULTS  # noqa: E402
from reference_methods import logistic_data  # noqa: E402

from workers.engine import ModelEngine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, choices=(1000, 10000), default=10000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sampler", type=json.loads, default={}, help="JSON sampler overrides")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ref = json.loads((RESULTS / f"is_logistic_{args.n}.json").read_text())["log_z"]
    x, y = logistic_data(args.n, 10, 4, DATA_SEED)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y, dtype=torch.float64)
    errors, ses, start = [], [], time.perf_counter()
    for seed in range(args.seeds):
        eng = ModelEngine("logistic_regression", {"features": 10, "classes": 4}, {**args.sampler, "seed": seed})
        for i in range(0, args.n, CHUNK):
            eng.update(xt[i : i + CHUNK], yt[i : i + CHUNK])
        errors.append(eng.log_evidence - ref)
        ses.append(eng.log_evidence_se)
    e, se = np.array(errors), np.array(ses)
    print(
        f"sampler {json.dumps(args.sampler)} n={args.n}: mean {e.mean():+.2f} sd {e.std(ddof=1):.2f} "
        f"per seed {np.round(e, 2).tolist()}; reported log_evidence_se mean {se.mean():.2f}, "
        f"|error| > 2 SE in {(np.abs(e) > 2 * se).sum()}/{len(e)} "
        f"({(time.perf_counter() - start) / args.seeds:.1f} s per run)"
    )


if __name__ == "__main__":
    main()
