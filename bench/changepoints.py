"""Change-point alerts of SGAIS models on river's seven annotated series, scored like TCPDBench.

Per series, competing models run directly on :class:`workers.engine.ModelEngine` (no service) on
standardised values, in small blocks, with the sampler's and the change points' default settings; the
detector (:mod:`workers.alerts`) reads each model's trace. The SGAIS prediction of a series is the alerts of
its most probable model at the end (largest log-evidence, all models seeing the same data): model choice by
evidence, no labels.
Baselines: no change points at all ("zero"), and river's drift detectors with default settings
fed the same standardised values (one detector per column, detections pooled).

Metrics: bench/tcpd_metrics.py (F1 with a 5-observation margin, segmentation covering).

    python bench/changepoints.py [--block 5] [--refresh] [--changepoint '{"ess_target": 0.5}'] [--sampler '{"seed": 1}']

Traces are cached in bench/out/ (the detector can be re-scored without re-running SGAIS).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tcpd_metrics import covering, f1_score  # noqa: E402

from service.datasets import SERIES, load_series  # noqa: E402
from workers import alerts  # noqa: E402
from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402

NILE = "Nile"


class _Nile:
    """The Nile annual flows 1871-1970 (statsmodels ``nile``); the Aswan dam of 1898 = index 28."""

    def __init__(self):
        from statsmodels.datasets import nile

        self.values = nile.load().data["volume"].to_numpy(float)[:, None]
        self.n = len(self.values)
        self.annotations = {"dam": [28]}

    def standardised(self) -> np.ndarray:
        return (self.values - self.values.mean(0)) / self.values.std(0)


def series(name: str):
    return _Nile() if name == NILE else load_series(name)


ALL_SERIES = [*SERIES, NILE]

OUT = Path(__file__).resolve().parent / "out"


def model_specs(d: int) -> dict[str, list[tuple[str, dict]]]:
    """Competing models for a d-column series: name -> list of (family, params) run per column or jointly.

    Two models per series (AR(1) per column; one joint Gaussian): on this shared 2-core machine a
    block of 5 costs ~0.1 s, so more models would take most of an hour.

    A model with one entry per column is the product of independent per-column models; its
    log-evidence is the sum of theirs, comparable with the joint ``gmm`` models.
    """
    per_col = lambda fam, p: [(fam, p)] * d  # noqa: E731
    return {
        "ar1": per_col("autoregressive", {"order": 1}),
        "gmm1": [("gmm", {"dim": d, "components": 1})],
    }


def run_model(parts: list[tuple[str, dict]], z: np.ndarray, sampler: dict, cps: dict | None = None) -> list[list[dict]]:
    """Run each part on its column (or all columns when there is one part for d > 1): trace rows per part.

    Each part is a :class:`SegmentedEngine` (main engine + challengers, change-point defaults unless
    ``cps``) fed one block at a time as the worker does; a row carries the ``change_point`` alerts
    raised after its block (online: nothing is revised later)."""
    traces = []
    for j, (family, params) in enumerate(parts):
        if family == "gmm":
            y = z.tolist() if z.shape[1] > 1 else z[:, 0].tolist()
        else:
            y = z[:, j].tolist()
        eng = SegmentedEngine.create(family, params, sampler, ChangepointSettings(**(cps or {})))
        rows = []
        b = sampler["block_size"]
        for k in range(0, len(y), b):
            t0 = time.perf_counter()
            (info,) = eng.update(None, y[k : k + b])
            found = eng.take_alerts()
            # blocks cut the stream every block_size values; `observations` counts the rows that
            # entered the likelihood (an AR model conditions on its first `order` values)
            rows.append(
                {
                    "first_index": k,
                    "observations": info.observations,
                    "log_predictive": info.log_predictive,
                    "annealing_steps": info.annealing_steps,
                    "ess": info.ess,
                    "log_evidence": info.log_evidence,
                    "change_probability": eng.last_block.get("change_probability"),
                    "challengers": eng.last_block.get("challengers", 0),
                    "alerts": found,
                    "seconds": time.perf_counter() - t0,
                }
            )
        traces.append(rows)
    return traces


def compute_traces(
    block: int,
    sampler_extra: dict,
    refresh: bool,
    score_only: bool = False,
    names: list[str] | None = None,
    cps: dict | None = None,
    models: list[str] | None = None,
) -> dict:
    """Traces of every series (or ``names``), cached one file per series (so series can run in parallel
    processes: ``--series``); ``score_only`` loads whatever is cached."""
    # the sampler's defaults (a cheaper one, 10 burn-in steps, batches of 100 and learning rate 0.02, ran here until
    # session 20, when the engine had become fast enough: leader F1 0.652 ± 0.015 with it over sampler seeds 0-3,
    # 0.665 ± 0.008 with the defaults)
    sampler = {"block_size": block, "seed": 0, **sampler_extra}
    ident: dict = {**sampler, "challengers": 1}
    if cps:  # change-point settings other than the defaults (ChangepointSettings overrides)
        ident["changepoint"] = cps
    key = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:10]
    out: dict = {"sampler": sampler, "changepoint": cps or {}, "series": {}}
    legacy = OUT / f"changepoint_traces_{key}.partial.json"  # all series in one file (earlier runs)
    if legacy.exists() and not refresh:
        out["series"].update(json.loads(legacy.read_text())["series"])
    torch.set_num_threads(1)
    OUT.mkdir(exist_ok=True)
    for name in names or ALL_SERIES:
        path = OUT / f"changepoint_traces_{key}_{name}.json"
        if path.exists() and not refresh:
            out["series"][name] = json.loads(path.read_text())
            continue
        if score_only or (name in out["series"] and not refresh):
            continue
        s = series(name)
        z = s.standardised()
        res = {}
        for model, parts in model_specs(z.shape[1]).items():
            if models and model not in models:
                continue
            t0 = time.perf_counter()
            traces = run_model(parts, z, sampler, cps)
            res[model] = {
                "traces": traces,
                "seconds": time.perf_counter() - t0,
                "log_evidence": sum(t[-1]["log_evidence"] for t in traces),
            }
            print(f"  {name:18s} {model:5s} log Z={res[model]['log_evidence']:10.2f} ({res[model]['seconds']:.1f} s)")
        path.write_text(json.dumps(res))
        out["series"][name] = res
    return out


def merge(points: list[int], margin: int) -> list[int]:
    """Pool detections: keep the first of any run of points closer than ``margin``."""
    kept: list[int] = []
    for p in sorted(points):
        if not kept or p - kept[-1] > margin:
            kept.append(p)
    return kept


def sgais_points(
    traces: list[list[dict]], settings: alerts.AlertSettings, kinds=("evidence_drop", "annealing_spike")
) -> list[int]:
    """Change locations of the detector run over each part's trace, pooled (``change_point``: the
    alerts raised online by the challengers, stored in the rows)."""
    pts = []
    for rows in traces:
        if kinds == ("change_point",):
            pts += [a["observation_index"] for row in rows for a in row.get("alerts", [])]
            continue
        state = alerts.initial_state()
        for row in rows:
            state, found = alerts.detect(state, settings, row)
            pts += [a["observation_index"] for a in found if a["kind"] in kinds]
    return merge(pts, 5)


def river_points(detector_cls, z: np.ndarray) -> list[int]:
    """Indices where river's detector (default settings, one per column) flags drift, pooled."""
    pts = []
    for j in range(z.shape[1]):
        det = detector_cls() if detector_cls.__name__ != "KSWIN" else detector_cls(seed=0)
        for t, v in enumerate(z[:, j]):
            det.update(float(v))
            if det.drift_detected:
                pts.append(t)
    return merge(pts, 5)


def pelt_points(z: np.ndarray) -> list[int]:
    """ruptures' PELT (offline, sees the whole series): Gaussian mean-and-variance cost, BIC penalty
    (2d + 1 parameters per segment) × log n, minimum segment 2."""
    import ruptures as rpt

    n, d = z.shape
    bkps = rpt.Pelt(model="normal", min_size=2, jump=1).fit(z).predict(pen=(2 * d + 1) * np.log(n))
    return [b for b in bkps if b < n]


def score(data: dict, settings: alerts.AlertSettings, verbose: bool = True) -> dict[str, tuple[float, float]]:
    from river import drift

    methods = {
        "zero": None,
        "PageHinkley": drift.PageHinkley,
        "ADWIN": drift.ADWIN,
        "KSWIN": drift.KSWIN,
        "PELT (offline)": "pelt",
        "sgais": "leader",
        "sgais-ar1": "ar1",
        "sgais-gmm1": "gmm1",
        "drop (diag.)": "drop",
    }
    names = [n for n in ALL_SERIES if n in data["series"]]
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    lines = []
    for name in names:
        s = series(name)
        z = s.standardised()
        models = data["series"][name]
        leader = max(models, key=lambda m: models[m]["log_evidence"])
        row = [name, leader]
        for m, how in methods.items():
            if how is None:
                pts = []
            elif how == "pelt":
                pts = pelt_points(z)
            elif how == "drop":  # the old detectors (evidence_drop, annealing_spike) on the leader's trace
                pts = sgais_points(models[leader]["traces"], settings)
            elif isinstance(how, str) and how not in ("leader", *models):
                row.append("—")  # model not run (--models)
                continue
            elif isinstance(how, str):
                pts = sgais_points(models[leader if how == "leader" else how]["traces"], settings, ("change_point",))
            else:
                pts = river_points(how, z)
            f1, cov = f1_score(s.annotations, pts), covering(s.annotations, pts, s.n)
            results[m].append((f1, cov))
            row.append(f"{f1:.3f}/{cov:.3f}")
        lines.append(row)
    mean = {m: (float(np.mean([r[0] for r in v])), float(np.mean([r[1] for r in v]))) for m, v in results.items()}
    if verbose:
        head = ["series", "leader", *methods]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in lines:
            print("| " + " | ".join(row) + " |")
        print("| **mean** | | " + " | ".join(f"**{f:.3f}**/{c:.3f}" for f, c in mean.values()) + " |")
        print("(cells: F1 / covering)")
    return mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=5, help="SGAIS block size (observations)")
    ap.add_argument("--refresh", action="store_true", help="re-run SGAIS even if traces are cached")
    ap.add_argument("--settings", default="{}", help="AlertSettings overrides as JSON")
    ap.add_argument("--score-only", action="store_true", help="score the cached (possibly partial) traces, run nothing")
    ap.add_argument("--series", default=None, help="comma-separated series to run (default: all, then score)")
    ap.add_argument("--changepoint", default="{}", help="ChangepointSettings overrides as JSON (default: the defaults)")
    ap.add_argument("--models", default=None, help="comma-separated models to run (default: all of model_specs)")
    ap.add_argument("--sampler", default="{}", help="sampler overrides as JSON, e.g. '{\"seed\": 1}' (seed noise)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    names = args.series.split(",") if args.series else None
    cps = json.loads(args.changepoint)
    models = args.models.split(",") if args.models else None
    data = compute_traces(args.block, json.loads(args.sampler), args.refresh, args.score_only, names, cps, models)
    settings = alerts.AlertSettings(**json.loads(args.settings))
    print(f"block={args.block} sampler={data['sampler']} changepoint={cps} alerts={settings.model_dump()}")
    score(data, settings)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
