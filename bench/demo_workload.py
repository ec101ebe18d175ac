"""The demo's engine work without the service: CPU seconds per model kind (session 27).

``sgais demo``'s wall time on these 2-core machines depends on the machine's load and on how its 28 models are shared
between the two workers. This script runs the same 28 models (``service.demo.MODELS`` on the seven series, the demo's
sampler, chunks of 50: ``bench/demo_exact.py``'s ``run_model``) on :class:`workers.segmented.SegmentedEngine` in one
process, one model after the other, with a worker's thread settings (:func:`workers.runner.limit_threads`), its
imports done first and its collector settings (:func:`workers.runner.quiet_gc`). It prints the process CPU seconds in
all and per model kind. Run two code bases alternately (``python <root>/bench/demo_workload.py``: the script puts its
own checkout first on ``sys.path``, so ``PYTHONPATH`` does not choose the code base; session 29) to compare them on a
noisy machine.

    python bench/demo_workload.py
    python bench/demo_workload.py --models gmm2 --per-series   # CPU seconds and change points per series
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo_exact import run_model  # noqa: E402

from service.datasets import SERIES, load_series  # noqa: E402
from service.demo import MODELS, SAMPLER  # noqa: E402
from workers.runner import limit_threads, quiet_gc  # noqa: E402
from workers.worker.loop import warm_lazy_imports  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="the demo's model kinds")
    ap.add_argument("--per-series", action="store_true", help="CPU seconds and change points of each series")
    args = ap.parse_args()
    limit_threads(1)
    warm_lazy_imports()
    quiet_gc()
    series = {name: np.asarray(load_series(name).standardised()[:, 0], float) for name in SERIES}
    per_kind = {}
    start = time.process_time()
    for key in args.models:
        t = time.process_time()
        for name, values in series.items():
            s = time.process_time()
            _, found = run_model(key, values, SAMPLER)
            if args.per_series:
                print(f"{key} {name:18s} {time.process_time() - s:6.1f} s  change points {found}", flush=True)
        per_kind[key] = time.process_time() - t
    kinds = ", ".join(f"{k} {v:.1f}" for k, v in per_kind.items())
    models = len(args.models) * len(series)
    print(f"the demo's {models} models: {time.process_time() - start:.1f} s of CPU ({kinds})")


if __name__ == "__main__":
    main()
