"""bench/reference.py's mixture (gmm, K = 5, d = 2, n = 1,000, data seed 2020) through the service.

    python bench/mixture_service.py [--load N] [--seeds 3]

A real ``sgais serve`` (embedded Redis, one worker): per seed, two models on one stream, one with the default
sampler (50 warm-up particles, then 10) and one with 100 particles throughout (``M ≥ 4D``, D = 24: where the
step sizes' correlation factor used to stop a mixture's moves), each with its default change-point challengers.
Two 500-row chunks over HTTP; prints each model's final log-evidence, error bar and status against the
one-mode t importance-sampling reference −5,031.10 ± 0.01 (bench/README, "Reference"), and the wall time.
``--load N`` runs N CPU-bound processes beside it.  The same seeds give the same bits loaded or not.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_methods import mixture_data  # noqa: E402
from service_overhead import free_port, start_server  # noqa: E402

REFERENCE = -5031.10


def _hog() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside the run")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    y, _ = mixture_data(1000, 2, 5, 2020)
    samplers = {"default": {}, "particles100": {"particles": 100, "warmup_particles": 100}}
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        server = start_server(port, None, d)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
                for _ in range(300):
                    try:
                        if c.get("/healthz").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
                names = []
                for seed in range(args.seeds):
                    for label, sampler in samplers.items():
                        names.append(f"gmm5-{label}-{seed}")
                        params = {"dim": 2, "components": 5}
                        body = {"name": names[-1], "stream": "mix", "family": "gmm", "params": params}
                        body["sampler"] = {**sampler, "seed": seed}
                        c.post("/v1/models", json=body).raise_for_status()
                t0 = time.perf_counter()
                for i in range(0, 1000, 500):
                    c.post("/v1/streams/mix/chunks", json={"y": y[i : i + 500].tolist()}).raise_for_status()
                while not all(m["chunks_processed"] == 2 for m in c.get("/v1/streams/mix").json()["models"]):
                    time.sleep(0.5)
                elapsed = time.perf_counter() - t0
                for name in names:
                    ev = c.get(f"/v1/models/{name}/evidence").json()
                    print(f"{name}: log Z {ev['log_evidence']:.2f} ± {ev['log_evidence_se']:.2f} "
                          f"(error {ev['log_evidence'] - REFERENCE:+.2f}) status {ev['status']}")  # fmt: skip
                print(f"load {args.load}: {elapsed:.1f} s for {len(names)} models x 1,000 observations")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
