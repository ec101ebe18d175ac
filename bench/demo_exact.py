"""Are the demo's values right or flagged?  Each demo model whose evidence has a closed form (AR(1), AR(2) with
unknown noise, one-component gmm) run as the worker runs it (:class:`SegmentedEngine`, the demo's sampler,
chunks of 50 through :func:`workers.engine.block_bounds`) on each of the demo's seven river series, against the
exact log-evidence given the model's own confirmed change points (each segment's closed form, the segments
independent, as :attr:`SegmentedEngine.log_evidence` defines it).

Prints per model: status (``ok`` / ``degraded``), error (nats), reported standard error, change points; then the
``ok`` models beyond 3 standard errors (a wrong value with status ok).

    python bench/demo_exact.py [--sampler '{"learning_rate": 0.05}'] [-v]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.conjugate import autoregressive_unknown_noise_log_evidence, gmm_one_component_log_evidence  # noqa: E402
from service.datasets import SERIES, load_series  # noqa: E402
from service.demo import CHUNK, MODELS, SAMPLER  # noqa: E402
from workers.changepoint import ChangepointSettings  # noqa: E402
from workers.engine import block_bounds  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402


def exact(z: np.ndarray, key: str, bounds: list[int]) -> float:
    """Exact log-evidence of model ``key`` on ``z`` with independent segments between ``bounds`` (nats); an AR(p)
    segment is conditioned on the p values before it (the first on the stream's first p)."""
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    if key == "gmm1":
        return sum(gmm_one_component_log_evidence(z[a:b]) for a, b in pairs)
    p = int(key[-1])
    return sum(autoregressive_unknown_noise_log_evidence(z[max(a - p, 0) : b], p) for a, b in pairs)


def run_model(key: str, values: np.ndarray, sampler: dict) -> tuple[SegmentedEngine, list[int]]:
    """Demo model ``key`` on a standardised series as the worker runs it (chunks of ``CHUNK``, blocks by
    :func:`workers.engine.block_bounds`): the engine at the end and the stream indices of its change points."""
    eng = SegmentedEngine.create(*MODELS[key], sampler, ChangepointSettings())
    found: list[int] = []
    for a in range(0, len(values), CHUNK):
        _, y = eng.family.validate(None, [float(v) for v in values[a : a + CHUNK]])
        for s, e in block_bounds(eng.observations, int(y.shape[0]), eng.settings.block_size):
            eng.update(None, y[s:e], validated=True)
        found += [al["observation_index"] for al in eng.take_alerts()]
    return eng, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampler", default="{}", help="overrides of the demo's sampler (JSON)")
    ap.add_argument("-v", action="store_true", help="print each degraded reason")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sampler = {**SAMPLER, **json.loads(args.sampler)}
    rows = []
    for name in SERIES:
        z = np.asarray(load_series(name).standardised()[:, 0], float)
        for key in ("ar1", "ar2", "gmm1"):
            eng, found = run_model(key, z, sampler)
            err = eng.log_evidence - exact(z, key, [0, *found, len(z)])
            status = "degraded" if eng.degraded else "ok"
            rows.append((name, key, status, err, eng.log_evidence_se))
            print(f"{name:18s} {key:5s} {status:9s} error {err:+9.2f} SE {eng.log_evidence_se:5.2f} changes {found}")
            if eng.degraded and args.v:
                print(f"    {eng.degraded}")
    ok = [r for r in rows if r[2] == "ok"]
    bad = [f"{r[0]} {r[1]} {r[3]:+.2f} (SE {r[4]:.2f})" for r in ok if abs(r[3]) > 3 * r[4]]
    print(f"sampler {sampler}: {len(ok)} of {len(rows)} ok; ok beyond 3 SE: {len(bad)}: {bad}")


if __name__ == "__main__":
    main()
