"""How long change-point challengers live on a stationary stream, with and without ``stale_age`` (issue 12,
issue 9's per-model cost).

One-component ``gmm`` models (``bench/many_models.py``'s priors and seeds) as :class:`SegmentedEngine`, fed
``--chunks`` chunks of 5 N(0.3, 1) values split into blocks as the worker splits them
(:func:`workers.engine.block_bounds`: the stream's first two values are blocks of one).  Per seed and setting:
challengers started, alive on average after each chunk, and the log Bayes factors (nats) of the challengers
alive at the end; over the run without the rule, the range of log B of challengers that had absorbed at least
100 observations (what the rule looks at).

    python bench/challenger_lifetime.py [--chunks 200] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from many_models import gmm_chunks, gmm_model  # noqa: E402

from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.engine import block_bounds  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402


def run(seed: int, chunks: int, stale_age: int | None) -> dict:
    m = gmm_model(seed)
    eng = SegmentedEngine.create(m["family"], m["params"], m["sampler"], ChangepointSettings(stale_age=stale_age))
    fed, alive, lo, hi = 0, 0, math.inf, -math.inf
    for c in gmm_chunks(chunks, seed=seed):
        y = c["y"]
        for a, b in block_bounds(fed, len(y), eng.settings.block_size):
            eng.update(None, y[a:b])
        fed += len(y)
        alive += len(eng.challengers)
        lz = eng.main.log_evidence
        for ch in eng.challengers:
            if ch.engine.observations >= 100:
                lb = ch.base + ch.engine.log_evidence - lz
                lo, hi = min(lo, lb), max(hi, lb)
    lz = eng.main.log_evidence
    end = [(ch.start, round(ch.base + ch.engine.log_evidence - lz, 2)) for ch in eng.challengers]
    return {"started": eng.started, "alive": alive / chunks, "end": end, "aged_range": (lo, hi)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    default = ChangepointSettings().stale_age
    for label, stale in (("stale_age null", None), (f"stale_age {default}", default)):
        alive = []
        for seed in range(args.seeds):
            r = run(seed, args.chunks, stale)
            alive.append(r["alive"])
            lo, hi = r["aged_range"]
            aged = f"log B at age >= 100 in [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else "none aged 100"
            print(f"{label}, seed {seed}: started {r['started']}, alive {r['alive']:.2f} on average; "
                  f"{aged}; alive at the end (start, log B): {r['end']}")  # fmt: skip
        print(f"{label}: mean alive {sum(alive) / len(alive):.2f}")


if __name__ == "__main__":
    main()
