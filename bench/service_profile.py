"""Where the service's time goes per chunk: the ingest run of ``bench/service_overhead.py``, profiled.

Runs the same data, models and posting as ``bench/service_overhead.py`` (1 model, then 10 models on one
stream), but starts the API (``sgais serve --workers 0``, embedded Redis) and ONE worker
(``python -m workers.runner``) as separate processes so that each can be measured:

- CPU seconds of every process (API, worker, Redis server, this client) from ``/proc``;
- the worker under ``cProfile`` (``--no-cprofile`` to skip it: cProfile slows Python-heavy code,
  so the CPU numbers are the ones to quote without it): wall seconds per model-chunk in the
  engine update, checkpoint serialisation, posterior summary, the commit's Redis round trips,
  waiting for data, lease scans; and the number of round trips (``send_packed_command`` calls);
- Redis ``INFO commandstats``: calls and server microseconds per command;
- the bare engine's CPU seconds on the same chunks (``bench/service_overhead.py``'s ``bare``), for a
  CPU-cost ratio that depends less on what else runs on the machine than the wall-time ratio.

    python bench/service_profile.py [--chunks 100] [--no-cprofile] [--top 25]

Not a throughput benchmark (``bench/service_overhead.py`` is): the worker runs under a profiler.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import torch

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_service", HERE / "service_overhead.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# (label, file suffix, function name): the worker's functions whose cumulative wall time is reported
WORKER_FUNCS = [
    ("loop (Worker.run)", "workers/worker/loop.py", "run"),
    ("  waiting for data (xread block)", "workers/worker/loop.py", "wait_for_data"),
    ("  lease scan", "workers/worker/loop.py", "scan"),
    ("  heartbeat", "workers/worker/loop.py", "heartbeat"),
    ("  read entries (advance - absorb)", "workers/worker/loop.py", "advance"),
    ("  absorb (one chunk)", "workers/worker/loop.py", "absorb"),
    ("    decode + validate", "models/base.py", "validate"),
    ("    engine update (ModelEngine.update)", "workers/engine.py", "update"),
    ("    alert detector", "workers/alerts.py", "detect"),
    ("    commit", "workers/worker/loop.py", "commit"),
    ("      checkpoint to_bytes", "workers/engine.py", "to_bytes"),
    ("      posterior_summary", "workers/engine.py", "posterior_summary"),
    ("      stream posterior", "workers/worker/posterior.py", "compute"),
    ("      Redis: send", "redis/connection.py", "send_packed_command"),
    ("      Redis: read replies", "redis/connection.py", "read_response"),
    ("      json.dumps", "json/__init__.py", "dumps"),
]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of a process's main thread."""
    run_ns, wait_ns, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def start_api(port: int, data_dir: str, prefix: str, log_path: Path, prof: Path | None) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "SGAIS_KEY_PREFIX": prefix, "OMP_NUM_THREADS": "1"}
    cmd = (
        [sys.executable]
        + (["-m", "cProfile", "-o", str(prof)] if prof else [])
        + ["-m", "service.cli", "serve", "--port", str(port), "--workers", "0", "--data-dir", data_dir]
    )
    out = log_path.open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"embedded Redis at (\S+)", log_path.read_text())
        if m:
            return proc, m.group(1)
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("API did not print its Redis URL")


# The worker under cProfile, on the wall clock or the CPU clock (time.process_time).  It calls
# ``workers.runner.main()`` rather than running the module as __main__: the module's __main__ block ends with
# os._exit(0) (it skips the interpreter's teardown), which would exit before the profile is written.
_PROFILE = (
    "import cProfile, sys, time; from workers.runner import main\n"
    "p = cProfile.Profile(time.process_time) if sys.argv[2] == 'cpu' else cProfile.Profile(); p.enable()\n"
    "try: main()\n"
    "finally: p.disable(); p.dump_stats(sys.argv[1])"
)


def start_worker(redis_url: str, prefix: str, prof: Path | None, clock: str = "wall") -> subprocess.Popen:
    env = {**os.environ, "SGAIS_REDIS_URL": redis_url, "SGAIS_KEY_PREFIX": prefix, "OMP_NUM_THREADS": "1"}
    if prof is None:
        cmd = [sys.executable, "-m", "workers.runner"]
    else:
        cmd = [sys.executable, "-c", _PROFILE, str(prof), clock]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(base: str) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("service did not become ready")


def find(stats: pstats.Stats, suffix: str, name: str) -> tuple[int, float] | None:
    """(calls, cumulative seconds) of the function, summed over matching entries; None if absent."""
    calls, cum, hit = 0, 0.0, False
    for (file, _, func), (_cc, nc, _tt, ct, _callers) in stats.stats.items():
        if func == name and file.endswith(suffix):
            calls, cum, hit = calls + nc, cum + ct, True
    return (calls, cum) if hit else None


def report_worker(prof: Path, model_chunks: int, top: int, clock: str) -> None:
    stats = pstats.Stats(str(prof))
    print(f"\nWorker under cProfile ({clock} time, {model_chunks} model-chunks):")
    print(f"{'':44} {'calls':>8} {'total s':>8} {'ms/model-chunk':>14}")
    for label, suffix, name in WORKER_FUNCS:
        got = find(stats, suffix, name)
        if got is not None:
            calls, cum = got
            print(f"{label:44} {calls:8d} {cum:8.2f} {1000 * cum / model_chunks:14.3f}")
    if top:
        print(f"\nTop {top} functions by internal time:")
        stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=100, help="500-observation chunks per run")
    ap.add_argument("--no-cprofile", action="store_true", help="measure CPU seconds only")
    ap.add_argument("--top", type=int, default=0, help="also print the top N functions by internal time")
    ap.add_argument(
        "--cprofile-api", action="store_true", help="also run the API under cProfile and print its top functions"
    )
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="the worker's cProfile clock: wall (time waiting on Redis shows) or CPU (process time)",
    )
    ap.add_argument("--keep", type=Path, default=None, help="write worker.prof / api.prof into this directory")
    args = ap.parse_args()
    torch.set_num_threads(1)
    chunks = bench.make_chunks(args.chunks)
    port, prefix = bench.free_port(), f"prof-{uuid.uuid4().hex[:8]}"
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="sgais-prof-") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        api_prof = out / "api.prof" if args.cprofile_api else None
        api, url = start_api(port, str(Path(tmp) / "data"), prefix, Path(tmp) / "api.log", api_prof)
        r = redis.Redis.from_url(url)
        redis_pid = int(r.info("server")["process_id"])
        prof = None if args.no_cprofile else out / "worker.prof"
        worker = start_worker(url, prefix, prof, args.clock)
        try:
            wait_ready(base)
            r.config_resetstat()
            procs = {"api": api.pid, "worker": worker.pid, "redis": redis_pid}
            cpu0 = {k: cpu_seconds(p) for k, p in procs.items()} | {"client": self_cpu()}
            sched0 = {k: schedstat(p) for k, p in procs.items()}
            print(f"load average before: {os.getloadavg()}")
            rows, t_all = [], 0.0
            for n_models in (1, 10):
                t_service, t_post = bench.service_run(base, f"s{n_models}", chunks, n_models)
                rows.append((n_models, t_service, t_post))
                t_all += t_service
            cpu1 = {k: cpu_seconds(p) for k, p in procs.items()} | {"client": self_cpu()}
            sched1 = {k: schedstat(p) for k, p in procs.items()}
            cmdstats = r.info("commandstats")
            print(f"load average after: {os.getloadavg()}")
            bare_cpu = 0.0
            for n_models in (1, 10):
                c0 = time.process_time()
                bench.bare(chunks, n_models)
                bare_cpu += time.process_time() - c0
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
            api.send_signal(signal.SIGTERM)
            api.wait(timeout=60)
        model_chunks = 11 * args.chunks
        print(
            f"\n{args.chunks} chunks x {bench.CHUNK} obs; 1 model then 10 models on one stream "
            f"({model_chunks} model-chunks)"
        )
        for n_models, t_service, t_post in rows:
            print(f"  {n_models:2d} models: service {t_service:6.2f} s (posting {t_post:.2f} s)")
        print(f"\nCPU seconds over both runs ({t_all:.2f} s wall):")
        for k in ("worker", "api", "redis", "client"):
            d = cpu1[k] - cpu0[k]
            print(f"  {k:7} {d:7.2f} s  {1000 * d / model_chunks:7.3f} ms/model-chunk")
        print(f"Main thread of each process over the {t_all:.2f} s: running / runnable but waiting for a CPU / asleep")
        for k in ("worker", "api", "redis"):
            run, wait = (sched1[k][i] - sched0[k][i] for i in (0, 1))
            print(f"  {k:7} {run:7.2f} s / {wait:7.2f} s / {t_all - run - wait:7.2f} s")
        service_cpu = sum(cpu1[k] - cpu0[k] for k in ("worker", "api", "redis"))
        print(
            f"  bare engine {bare_cpu:7.2f} s  {1000 * bare_cpu / model_chunks:7.3f} ms/model-chunk"
            " (same chunks, after)"
        )
        print(
            f"  CPU ratio worker / bare {(cpu1['worker'] - cpu0['worker']) / bare_cpu:.3f}, "
            f"worker + API + Redis / bare {service_cpu / bare_cpu:.3f}"
        )
        print("\nRedis commandstats (calls, server usec total, usec/call):")
        for name, st in sorted(cmdstats.items(), key=lambda kv: -kv[1]["usec"]):
            print(f"  {name.removeprefix('cmdstat_'):22} {st['calls']:8d} {st['usec']:10d} {st['usec_per_call']:8.1f}")
        if prof is not None:
            report_worker(prof, model_chunks, args.top, args.clock)
        if api_prof is not None:
            print("\nAPI under cProfile, top functions by cumulative time:")
            pstats.Stats(str(api_prof)).sort_stats("cumulative").print_stats(args.top or 40)


if __name__ == "__main__":
    main()
