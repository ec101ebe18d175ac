"""The thesis's non-stationarity experiment (papers/001 §5.1.5, §5.4.2) on ModelEngine directly.

1,000 observations from 3 Gaussian clusters, the next 9,000 from 5 (the 3 and two more), the
last 90,000 from 7 (the 5 and two more), 1-D, some clusters overlapping; ``gmm`` models with 3, 5
and 7 components, blocks of 500, thesis sampler defaults otherwise. Checks:

1. the 3-component model alerts (evidence_drop or annealing_spike) within one block of
   observations 1,000 and 10,000, and nowhere else;
2. the final model probabilities favour 5 or 7 components;
3. order invariance of the plain engine: each model without challengers (``ChangepointSettings``
   ``enabled=False``) ends with a log-evidence on the shuffled stream within 0.1% of the in-order one.
   The runs with challengers report the log-evidence *given the confirmed change points* (segments with
   independent parameters, :mod:`workers.segmented`), which is not the quantity the check is about.

    python bench/thesis_changepoint.py [--scale 1.0] [--seed 0] [--orders in_order,plain,shuffled]

Orders: ``in_order`` = with challengers (checks 1, 2); ``plain`` (in order) and ``shuffled`` = without
challengers (check 3).

``--scale 0.1`` runs a tenth of the data (100/900/9,000) as a quick smoke run (checks adapted).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers import alerts  # noqa: E402
from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402

# cluster means and standard deviations; phase k uses the first 3, 5, 7 (the -1.5/+1.5 and
# 4.5 clusters overlap their neighbours: 1.5 apart at sd 0.5-0.7)
MEANS = [-3.0, 0.0, 3.0, -1.5, 1.5, -4.5, 4.5]
STDS = [0.5, 0.6, 0.5, 0.7, 0.5, 0.5, 0.7]
PHASES = [(1_000, 3), (9_000, 5), (90_000, 7)]
OUT = Path(__file__).resolve().parent / "out"
ORDERS = ("in_order", "plain", "shuffled")  # in order with challengers; in order and shuffled without


def make_data(scale: float, seed: int) -> tuple[torch.Tensor, list[int]]:
    """The in-order stream [N] (float64) and the change indices."""
    g = torch.Generator().manual_seed(seed)
    parts, changes, total = [], [], 0
    for n, k in PHASES:
        n = int(n * scale)
        comp = torch.randint(0, k, (n,), generator=g)
        y = torch.tensor(MEANS)[comp] + torch.tensor(STDS)[comp] * torch.randn(n, generator=g, dtype=torch.float64)
        parts.append(y)
        total += n
        changes.append(total)
    return torch.cat(parts), changes[:-1]


def run(
    y: torch.Tensor, components: int, block: int, seed: int, sampler: dict | None = None, challengers: bool = True
) -> dict:
    """One model over ``y``: with its challengers (change-point defaults; ``change_points`` are its alerts and
    ``log_evidence`` is given the confirmed change points) or, ``challengers=False``, the plain engine."""
    eng = SegmentedEngine.create(
        "gmm",
        {"dim": 1, "components": components, "mean_scale": 16.0},
        {"block_size": block, "seed": seed, **(sampler or {})},
        ChangepointSettings(enabled=challengers),
    )
    state, found, trace = alerts.initial_state(), [], []
    settings = alerts.AlertSettings()
    t0 = time.perf_counter()
    for b, info in enumerate(eng.update(None, y.tolist())):
        row = {
            "first_index": b * block,
            "observations": info.observations,
            "log_predictive": info.log_predictive,
            "annealing_steps": info.annealing_steps,
            "ess": info.ess,
            "reannealed": info.reannealed,
        }
        state, new = alerts.detect(state, settings, row)
        found += new
        trace.append({**row, "log_evidence": info.log_evidence})
    return {
        "log_evidence": eng.log_evidence,
        "alerts": found,
        "change_points": eng.take_alerts(),
        "trace": trace,
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the thesis's data sizes")
    ap.add_argument("--block", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sampler", default="{}", help="SGAIS settings overrides as JSON, e.g. '{\"reanneal_steps\": null}'"
    )
    ap.add_argument("--tag", default="", help="suffix of the saved result file")
    ap.add_argument("--rescore", action="store_true", help="re-run only the detector on the saved traces")
    ap.add_argument("--components", default="3,5,7", help="models to run (comma-separated component counts)")
    ap.add_argument(
        "--orders",
        default=",".join(ORDERS),
        help="runs: in_order (with challengers), plain (in order, no challengers), shuffled (no challengers)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    saved = OUT / f"thesis_changepoint_{args.scale}_{args.seed}{args.tag}.json"
    if args.rescore:
        res = json.loads(saved.read_text())
        res = {"changes": res["changes"], **{o: {int(k): v for k, v in res.get(o, {}).items()} for o in ORDERS}}
        for order in ORDERS:
            for r in res[order].values():
                state, r["alerts"] = alerts.initial_state(), []
                for row in r["trace"]:
                    state, new = alerts.detect(state, alerts.AlertSettings(), row)
                    r["alerts"] += new
        return report(res, args.block)
    y, changes = make_data(args.scale, args.seed)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed + 1))
    print(f"{len(y)} observations, changes at {changes}, block {args.block}", flush=True)
    res: dict = {"changes": changes, **{o: {} for o in ORDERS}}
    ks = [int(v) for v in args.components.split(",")]
    orders = args.orders.split(",")
    for order, data in (("in_order", y), ("plain", y), ("shuffled", y[perm])):
        if order not in orders:
            continue
        for k in ks:
            r = run(data, k, args.block, args.seed, json.loads(args.sampler), challengers=order == "in_order")
            res[order][k] = r
            kinds = [(a["kind"], a["observation_index"]) for a in r["alerts"]]
            print(
                f"{order:9s} gmm-{k}: log Z = {r['log_evidence']:.1f} ({r['seconds']:.0f} s); "
                f"max annealing steps {max(t['annealing_steps'] for t in r['trace'])}; "
                f"re-annealed at {[t['first_index'] + t['observations'] for t in r['trace'] if t.get('reannealed')]}; "
                f"alerts {kinds}",
                flush=True,
            )
    OUT.mkdir(exist_ok=True)
    saved.write_text(json.dumps(res))
    report(res, args.block)


def check_alerts(r3: dict, changes: list[int], block: int) -> bool:
    """Check 1: the 3-component model's alerts (``change_point`` when the run had challengers) in order."""
    pts = sorted({a["observation_index"] for a in r3.get("change_points", r3["alerts"])})
    near = {c: [p for p in pts if abs(p - c) <= block] for c in changes}
    stray = [p for p in pts if all(abs(p - c) > block for c in changes)]
    ok1 = all(near[c] for c in changes) and not stray
    print(f"[{'PASS' if ok1 else 'FAIL'}] gmm-3 alerts within one block of {changes}: {near}; elsewhere: {stray}")
    return ok1


def check_order(res: dict) -> bool:
    """Check 3: the plain engines' final log-evidence, shuffled against in order (the models both ran)."""
    lz = {k: (res["shuffled"][k]["log_evidence"], res["plain"][k]["log_evidence"]) for k in res["plain"]}
    lz = {k: v for k, v in lz.items() if k in res["shuffled"]}
    rel = {k: abs(s - o) / abs(o) for k, (s, o) in lz.items()}
    ok3 = bool(rel) and all(v <= 1e-3 for v in rel.values())
    print(
        f"[{'PASS' if ok3 else 'FAIL'}] plain engines, shuffled within 0.1% of in-order: "
        + ", ".join(f"gmm-{k}: {lz[k][0]:.1f} vs {lz[k][1]:.1f} ({100 * v:.3f}%)" for k, v in rel.items())
    )
    return ok3


def report(res: dict, block: int) -> None:
    changes = res["changes"]
    complete = all(set(res.get(o, {})) == {3, 5, 7} for o in ORDERS)
    if not complete:  # a partial run (--components / --orders): what ran, checks 1 and 3 where they can be made
        for order in ORDERS:
            for k, r in res.get(order, {}).items():
                pts = sorted({a["observation_index"] for a in r.get("change_points", [])})
                print(f"{order} gmm-{k}: change_point alerts at {pts}; log Z {r['log_evidence']:.1f}")
        if 3 in res["in_order"]:
            check_alerts(res["in_order"][3], changes, block)
        if set(res.get("plain", {})) & set(res.get("shuffled", {})):
            check_order(res)
        return
    check_alerts(res["in_order"][3], changes, block)
    for k in (5, 7):
        at = sorted({a["observation_index"] for a in res["in_order"][k]["alerts"]})
        print(f"       (gmm-{k} in order alerts at {at})")
    # 2. final model probabilities
    lz = {k: res["in_order"][k]["log_evidence"] for k in (3, 5, 7)}
    m = max(lz.values())
    p = {k: math.exp(v - m) / sum(math.exp(w - m) for w in lz.values()) for k, v in lz.items()}
    ok2 = max(p, key=p.get) in (5, 7)
    print(
        f"[{'PASS' if ok2 else 'FAIL'}] final probabilities favour 5 or 7: "
        + ", ".join(f"p(gmm-{k})={v:.3g} (log Z {lz[k]:.1f})" for k, v in p.items())
    )
    # 3. shuffled vs in order, plain engines
    check_order(res)


if __name__ == "__main__":
    main()
