"""False alarms of ``change_point`` on stationary, well-specified streams of every family (issue 12, item 3).

Per family and seed: ``--n`` observations drawn from one fixed parameter value of the family, fed to a
:class:`SegmentedEngine` (change-point defaults) in blocks of ``--block``; counts the ``change_point``
alerts (every one is false) and the largest change probability, and the time per observation.

    python bench/changepoint_false_alarms.py [--n 10000] [--seeds 5] [--block 100] [--families ...] [--changepoint '{}']
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402

FAMILIES = {
    "linear_regression": {"features": 2},
    "logistic_regression": {"features": 2, "classes": 2},
    "gmm": {"dim": 1, "components": 2},
    "autoregressive": {"order": 1},
    "bnn": {"features": 2, "hidden": [4], "outputs": 1},
}


def stream(family: str, n: int, seed: int) -> tuple[list | None, list]:
    """``n`` observations from a fixed parameter value of ``family`` (x, y as JSON-able lists)."""
    g = torch.Generator().manual_seed(1000 + seed)
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if family == "linear_regression":
        x = randn(n, 2)
        return x.tolist(), (x @ torch.tensor([0.7, -0.4], dtype=torch.float64) + 0.3 + randn(n)).tolist()
    if family == "logistic_regression":
        x = randn(n, 2)
        p = torch.sigmoid(x @ torch.tensor([1.0, -0.5], dtype=torch.float64) + 0.2)
        return x.tolist(), (torch.rand(n, generator=g, dtype=torch.float64) < p).long().tolist()
    if family == "gmm":
        comp = torch.rand(n, generator=g) < 0.4
        return None, torch.where(comp, -1.5 + 0.6 * randn(n), 1.0 + 0.8 * randn(n)).tolist()
    if family == "autoregressive":
        e, y = randn(n), torch.zeros(n, dtype=torch.float64)
        for t in range(1, n):
            y[t] = 0.2 + 0.6 * y[t - 1] + e[t]
        return None, y.tolist()
    if family == "bnn":
        x = randn(n, 2)
        return x.tolist(), (torch.tanh(x @ torch.tensor([0.8, -0.6], dtype=torch.float64)) + randn(n)).tolist()
    raise KeyError(family)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--changepoint", default="{}", help="ChangepointSettings overrides as JSON (default: the defaults)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    total_alarms, total_obs = 0, 0
    for family in args.families.split(","):
        for seed in range(args.seeds):
            x, y = stream(family, args.n, seed)
            sampler = {"block_size": args.block, "seed": seed}
            eng = SegmentedEngine.create(
                family, FAMILIES[family], sampler, ChangepointSettings(**json.loads(args.changepoint))
            )
            alarms, top = [], 0.0
            t0 = time.perf_counter()
            for k in range(0, args.n, args.block):
                eng.update(x[k : k + args.block] if x is not None else None, y[k : k + args.block])
                alarms += eng.take_alerts()
                top = max(top, eng.last_block["change_probability"])
            seconds = time.perf_counter() - t0
            total_alarms += len(alarms)
            total_obs += args.n
            print(
                json.dumps(
                    {
                        "family": family,
                        "seed": seed,
                        "false_alarms": [(a["observation_index"], round(a["log_bayes_factor"], 2)) for a in alarms],
                        "max_change_probability": round(top, 4),
                        "s/obs": round(seconds / args.n, 5),
                        "challengers_started": eng.started,
                    }
                ),
                flush=True,
            )
    print(f"false alarms per 10,000 observations: {1e4 * total_alarms / total_obs:.3f} ({total_alarms} in {total_obs})")


if __name__ == "__main__":
    main()
