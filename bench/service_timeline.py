"""The 1-model run of ``bench/service_overhead.py`` as a timeline: how far the worker got while the chunks
were still being posted, and what it did with its CPU meanwhile.

Starts ``sgais serve`` exactly as ``bench/service_overhead.py`` does, times the bare engine on the same chunks,
then posts them (4 in flight) and polls the stream every 10 ms.  Prints when posting ended, how many
chunks had been absorbed by then and when 25/50/75/100 were, the worker process's seconds running and
runnable-but-waiting for a CPU (``/proc/<pid>/schedstat``) during and after posting, and the engine
wall time of the first blocks (trace ``seconds``) against the median.

    python bench/service_timeline.py [--chunks 100]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

_spec = importlib.util.spec_from_file_location("bench_service", Path(__file__).resolve().parent / "service_overhead.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def schedstat(pid: int) -> tuple[float, float]:
    run_ns, wait_ns, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


async def post_all(base: str, bodies: list[bytes], in_flight: int = 4) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=60) as c:
        queue = list(reversed(bodies))

        async def poster() -> None:
            while queue:
                res = await c.post(
                    "/v1/streams/s/chunks", content=queue.pop(), headers={"content-type": "application/json"}
                )
                res.raise_for_status()

        await asyncio.gather(*(poster() for _ in range(in_flight)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    chunks = bench.make_chunks(args.chunks)
    port = bench.free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="sgais-timeline-") as data_dir:
        server = bench.start_server(port, None, data_dir)
        try:
            t_bare = bench.bare(chunks, 1)
            worker = int(Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()[0])
            with httpx.Client(base_url=base, timeout=60) as client:
                client.post("/v1/models", json={"name": "m0", "stream": "s", **bench.model(0)}).raise_for_status()
                bodies = [json.dumps(c).encode() for c in chunks]
                s0, t0 = schedstat(worker), time.perf_counter()
                asyncio.run(post_all(base, bodies))
                s1, t1 = schedstat(worker), time.perf_counter()
                seen = []
                while True:
                    n = client.get("/v1/streams/s").json()["models"][0]["chunks_processed"]
                    seen.append((time.perf_counter() - t0, n))
                    if n == len(chunks):
                        break
                    time.sleep(0.01)
                s2, t2 = schedstat(worker), time.perf_counter()
                trace = client.get("/v1/models/m0/trace", params={"limit": 10000}).json()["items"]
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(
        f"bare engine {t_bare:.2f} s; service {seen[-1][0]:.2f} s (ratio {seen[-1][0] / t_bare:.2f}); "
        f"posting ended at {t1 - t0:.2f} s with {seen[0][1]} chunks absorbed"
    )
    for q in (25, 50, 75, 100):
        k = len(chunks) * q // 100
        print(f"  {k} absorbed at {next(t for t, n in seen if n >= k):.2f} s")
    print(
        f"worker while posting: running {s1[0] - s0[0]:.2f} s, waiting for a CPU {s1[1] - s0[1]:.2f} s "
        f"of {t1 - t0:.2f} s; after: running {s2[0] - s1[0]:.2f} s, waiting {s2[1] - s1[1]:.2f} s of {t2 - t1:.2f} s"
    )
    ms = [1000 * r["seconds"] for r in trace]
    print(f"engine ms of the first 12 blocks: {[round(m, 1) for m in ms[:12]]}; median {statistics.median(ms):.1f}")


if __name__ == "__main__":
    main()
