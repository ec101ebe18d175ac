"""The Nile (statsmodels ``nile``: annual flows 1871-1970; the Aswan dam of 1898 is index 28), posted one
observation per chunk as the worker would see it (blocks of 1), change-point defaults (issue 12, item 2).

Per model (``gmm`` with one component = i.i.d. Gaussian with unknown mean and variance; AR(1) with
unknown noise variance) on the standardised series: the ``change_point`` alerts raised online, and the
worker time per observation with challengers (:class:`SegmentedEngine`) and without (the plain
:class:`ModelEngine` on the same blocks, same seed): the challenger cost (item 6).

    python bench/nile.py [--models gmm1,ar1] [--changepoint '{"ess_target": 0.5}']

With ``--chunks 1,5,50`` it checks acceptance 4 instead: the series posted in chunks of each size with the
sampler's default ``block_size`` (a chunk is then one block, cut by the stream's start ramp,
:func:`workers.segmented.ramp_bounds`), the alerts per model and chunk size; PASS when every chunking gives the
alerts of chunks of one within ±1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.engine import ModelEngine  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402

# the sampler's defaults, as bench/changepoints.py (a cheaper one, burn-in 10, batches of 100, learning rate 0.02,
# ran here until session 20)
SAMPLER = {"block_size": 1, "seed": 0}
MODELS = {"gmm1": ("gmm", {"dim": 1, "components": 1}), "ar1": ("autoregressive", {"order": 1})}


def nile() -> np.ndarray:
    from statsmodels.datasets import nile as data

    y = data.load().data["volume"].to_numpy(float)
    return (y - y.mean()) / y.std()


def run(name: str, z: np.ndarray, challengers: bool, cps: dict | None = None) -> dict:
    family, params = MODELS[name]
    eng = (
        SegmentedEngine.create(family, params, SAMPLER, ChangepointSettings(**(cps or {})))
        if challengers
        else ModelEngine(family, params, SAMPLER)
    )
    found, probs, sizes = [], [], []
    t0 = time.perf_counter()
    for v in z:
        eng.update(None, [float(v)])  # one observation per chunk
        if challengers:
            found += eng.take_alerts()
            probs.append(eng.last_block["change_probability"])
            sizes.append(eng.last_block["challengers"])
    seconds = time.perf_counter() - t0
    return {
        "alerts": found,
        "seconds_per_observation": seconds / len(z),
        "log_evidence": eng.log_evidence,
        "max_change_probability_outside_alerts": max(probs, default=0.0),
        "mean_challengers": float(np.mean(sizes)) if sizes else 0.0,
    }


def chunked(name: str, z: np.ndarray, chunk: int, cps: dict) -> list[tuple[int, int, float]]:
    """(location, detected at, log BF) of the alerts with the series posted ``chunk`` values at a time, default
    ``block_size``."""
    family, params = MODELS[name]
    eng = SegmentedEngine.create(family, params, {"seed": SAMPLER["seed"]}, ChangepointSettings(**cps))
    found = []
    for k in range(0, len(z), chunk):
        eng.update(None, [float(v) for v in z[k : k + chunk]])
        found += [
            (a["observation_index"], a["detected_at_index"], round(a["log_bayes_factor"], 2)) for a in eng.take_alerts()
        ]
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gmm1,ar1")
    ap.add_argument("--changepoint", default="{}", help="ChangepointSettings overrides as JSON (default: the defaults)")
    ap.add_argument("--chunks", default=None, help="comma-separated chunk sizes: check acceptance 4 (docstring)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    z = nile()
    if args.chunks:
        for name in args.models.split(","):
            per = {c: chunked(name, z, c, json.loads(args.changepoint)) for c in map(int, args.chunks.split(","))}
            one = [a[0] for a in per.get(1) or chunked(name, z, 1, json.loads(args.changepoint))]
            same = all(
                len(v) == len(one) and all(abs(a[0] - b) <= 1 for a, b in zip(v, one, strict=True))
                for v in per.values()
            )
            print(
                json.dumps({"model": name, "alerts by chunk size": {str(c): v for c, v in per.items()}, "PASS": same})
            )
        return
    for name in args.models.split(","):
        plain = run(name, z, challengers=False)
        seg = run(name, z, challengers=True, cps=json.loads(args.changepoint))
        alerts = [
            (a["observation_index"], a["detected_at_index"], round(a["log_bayes_factor"], 2)) for a in seg["alerts"]
        ]
        ok = len(alerts) == 1 and abs(alerts[0][0] - 28) <= 5
        print(
            json.dumps(
                {
                    "model": name,
                    "alerts (location, detected at, log BF)": alerts,
                    "PASS": ok,
                    "s/obs without challengers": round(plain["seconds_per_observation"], 4),
                    "s/obs with challengers": round(seg["seconds_per_observation"], 4),
                    "ratio": round(seg["seconds_per_observation"] / plain["seconds_per_observation"], 2),
                    "mean challengers alive": round(seg["mean_challengers"], 2),
                    "log Z plain": round(plain["log_evidence"], 2),
                    "log Z given change points": round(seg["log_evidence"], 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
