"""CPU the API process spends per request on the two calls of the ingest benchmark: polling
``GET /v1/streams/{s}`` (10 models on the stream) and ``POST`` of a 500 x 5 chunk.

Starts ``sgais serve --workers 0`` (embedded Redis, no worker, so the API is measured alone), sends
the requests one at a time and reads the API process's CPU seconds from ``/proc``.

    python bench/api_cost.py [--gets 1000] [--posts 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

_spec = importlib.util.spec_from_file_location("bench_service", Path(__file__).resolve().parent / "service_overhead.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gets", type=int, default=1000)
    ap.add_argument("--posts", type=int, default=200)
    args = ap.parse_args()
    port = bench.free_port()
    with tempfile.TemporaryDirectory(prefix="sgais-api-") as data_dir:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "SGAIS_API_KEYS": ""}
        api = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from service.cli import app; app()",
                "serve",
                "--port",
                str(port),
                "--workers",
                "0",
                "--data-dir",
                data_dir,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        c.get("/healthz")
                        break
                    except httpx.HTTPError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                for i in range(10):
                    c.post("/v1/models", json={"name": f"m{i}", "stream": "s", **bench.model(i)}).raise_for_status()
                c0 = cpu_seconds(api.pid)
                for _ in range(args.gets):
                    c.get("/v1/streams/s").raise_for_status()
                c1 = cpu_seconds(api.pid)
                bodies = [json.dumps(chunk).encode() for chunk in bench.make_chunks(20)]
                for i in range(args.posts):
                    c.post(
                        "/v1/streams/s/chunks",
                        content=bodies[i % len(bodies)],
                        headers={"content-type": "application/json"},
                    ).raise_for_status()
                c2 = cpu_seconds(api.pid)
        finally:
            api.send_signal(signal.SIGTERM)
            api.wait(timeout=60)
    print(
        f"API CPU per request: GET /v1/streams/s (10 models) {1000 * (c1 - c0) / args.gets:.2f} ms, "
        f"POST a {bench.CHUNK} x {bench.FEATURES} chunk {1000 * (c2 - c1) / args.posts:.2f} ms"
    )


if __name__ == "__main__":
    main()
