"""AR(1) on real series against its exact evidence: is the returned log-evidence right within its error bar or flagged?

The model of ``bench/changepoints.py`` (``autoregressive``, order 1, unknown noise, default prior) on each
standardised column of river's seven annotated series and the Nile, fed in blocks of 5 as a live feed would
(plain :class:`workers.engine.ModelEngine`, no challengers, the service's default sampler unless ``--sampler``),
against the exact log-evidence of the same rows (``bench/changepoints_ideal.py: ExactAR1``, the known-noise
closed form integrated over the noise variance on a grid; checked against scipy to 1e-6 nats).

Per column and sampler seed: the signed error, the reported standard error, their ratio and the model's status
(``ok`` or ``degraded``).  A run is **wrong** when it is ``ok`` and more than 3 reported SE from exact.  With
``--seeds`` > 1 each row is one column: the mean and sd of the error over seeds, the mean SE, the runs degraded
and the runs wrong.

    python bench/ar_real_data.py [--seeds 1] [--sampler '{"burn_in": 60}'] [--block 5]
    python bench/ar_real_data.py --first 10 --only RunLog:0 --seeds 20   # the first 10 values only

``--first N`` scores each run on the series' first N values (where a live feed's warm-up blocks make their
error): the mean error over seeds with its standard error, the sd, and the mean reported SE.  ``--only
SERIES:COLUMN`` runs one column.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from changepoints import ALL_SERIES, series  # noqa: E402
from changepoints_ideal import ExactAR1  # noqa: E402

from workers.engine import ModelEngine  # noqa: E402


def run(y: np.ndarray, sampler: dict, block: int) -> ModelEngine:
    e = ModelEngine("autoregressive", {"order": 1}, sampler)
    for a in range(0, len(y), block):
        e.update(None, y[a : a + block].tolist())
    return e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampler", default="{}", help="sampler overrides as JSON")
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first", type=int, default=None, help="score on the first N values only")
    ap.add_argument("--only", default=None, help="one column, SERIES:COLUMN (e.g. RunLog:0)")
    args = ap.parse_args()
    if args.first is not None:
        first_values(args)
        return
    over = json.loads(args.sampler)
    print(f"AR(1), unknown noise, blocks of {args.block}, sampler overrides {args.sampler}, seeds {args.seeds}")
    if args.seeds == 1:
        print("| series | column | n | SGAIS log Z ± SE | exact | error | error/SE | status |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
    else:
        print("| series | column | n | error mean ± sd | mean SE | degraded | wrong |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    wrong, runs, worst, t0 = 0, 0, 0.0, time.perf_counter()
    for name in ALL_SERIES:
        z = series(name).standardised()
        for j in range(z.shape[1]):
            y = z[:, j]
            exact = float(ExactAR1(y).log_z(np.array([1]), np.array([len(y)]))[0])
            rows = []
            for seed in range(args.seeds):
                e = run(y, {"block_size": args.block, "seed": seed, **over}, args.block)
                err, se = e.log_evidence - exact, e.log_evidence_se
                bad = e.degraded is None and abs(err) > 3 * se
                rows.append((e, err, se, bad))
                wrong, runs = wrong + bad, runs + 1
                worst = max(worst, abs(err)) if e.degraded is None else worst
            if args.seeds == 1:
                e, err, se, bad = rows[0]
                status = "**ok: wrong**" if bad else ("ok" if e.degraded is None else "degraded")
                print(f"| {name} | {j} | {len(y)} | {e.log_evidence:.2f} ± {se:.2f} | {exact:.2f} | {err:+.2f} | "
                      f"{err / se:+.1f} | {status} |")  # fmt: skip
            else:
                errs = [r[1] for r in rows]
                print(f"| {name} | {j} | {len(y)} | {np.mean(errs):+.2f} ± {np.std(errs, ddof=1):.2f} | "
                      f"{np.mean([r[2] for r in rows]):.2f} | {sum(r[0].degraded is not None for r in rows)} | "
                      f"{sum(r[3] for r in rows)} |")  # fmt: skip
    print(
        f"\n{wrong} of {runs} runs `ok` and more than 3 SE from exact; largest |error| of an `ok` run "
        f"{worst:.2f} nats; {time.perf_counter() - t0:.0f} s"
    )


def first_values(args: argparse.Namespace) -> None:
    """The ``--first`` mode: per column, the error on its first ``args.first`` values over ``args.seeds`` seeds."""
    over = json.loads(args.sampler)
    print(f"AR(1), first {args.first} values, blocks of {args.block}, sampler overrides {args.sampler}")
    print("| series | column | error mean ± SE | sd | mean reported SE |")
    print("|---|---:|---:|---:|---:|")
    for name in ALL_SERIES:
        z = series(name).standardised()
        for j in range(z.shape[1]):
            if args.only is not None and args.only != f"{name}:{j}":
                continue
            y = z[: args.first, j]
            exact = float(ExactAR1(y).log_z(np.array([1]), np.array([len(y)]))[0])
            runs = [run(y, {"block_size": args.block, "seed": seed, **over}, args.block) for seed in range(args.seeds)]
            errs = np.array([e.log_evidence - exact for e in runs])
            sd = float(np.std(errs, ddof=1)) if len(errs) > 1 else float("nan")
            print(f"| {name} | {j} | {errs.mean():+.3f} ± {sd / np.sqrt(len(errs)):.3f} | {sd:.3f} | "
                  f"{np.mean([e.log_evidence_se for e in runs]):.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
