"""Soak test (issue 11, acceptance 5): mixed traffic against ``sgais serve`` with worker SIGKILLs.

Starts ``sgais serve --workers W`` (real processes, supervised workers) on a real Redis, then for
``--minutes``:

* posts a chunk to each of ``--streams`` streams every ``--post-every`` seconds (two persistent models
  per stream, deterministic data);
* keeps ``--sockets`` WebSocket clients on the streams' event channels, each reconnecting every
  ``--reconnect-every`` seconds;
* every ``--churn-every`` seconds creates a model on a fresh stream, posts two chunks to it, waits
  for them and deletes it: every other time the model then its stream (``DELETE /v1/models/{m}``,
  ``DELETE /v1/streams/{s}``), otherwise the stream with its model in one call;
* SIGKILLs one worker process every ``--kill-every`` seconds (``sgais serve`` restarts it; 0: never);
* samples the RSS of the API process and of each worker, and the load average, every ``--sample-every``
  seconds.

Then it waits until every persistent model has absorbed every chunk and compares each model's trace
with an uninterrupted bare-engine run on the same chunks (every field but ``seconds``), and prints a
JSON summary: HTTP status counts (5xx), WebSocket events, kills and restarts, RSS series with their
least-squares slope over the second half (MB per hour, for the API and for every worker), trace equality,
and the memory accounting: the tensor bytes the reference engines (the same states as the worker's, change-
point challengers included) hold at the end and at half the chunks, i.e. what the workers must hold.

    python bench/soak.py --minutes 12 --redis-url redis://127.0.0.1:6379/8
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import redis
import torch
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workers.history import History  # noqa: E402
from workers.segmented import SegmentedEngine  # noqa: E402
from workers.store.records import BLOCK_FIELDS  # noqa: E402
from workers.worker.blocks import absorb_chunk  # noqa: E402
from workers.worker.restore import changepoint_settings  # noqa: E402

MODELS = {
    "lr-a": {"family": "linear_regression", "params": {"features": 2}, "sampler": {"particles": 10, "seed": 1}},
    "lr-b": {"family": "linear_regression", "params": {"features": 2}, "sampler": {"particles": 20, "seed": 2}},
}
#: Every trace-row field but ``seconds`` (wall-clock time), as tests/integration/helpers.py compares them.
COMPARED = ("seq", "first_index", "block_observations", "observations", *BLOCK_FIELDS)


def chunk(stream_index: int, seq: int, rows: int) -> dict:
    """Chunk ``seq`` (1-based) of stream ``stream_index``: y = x·(1, 2) + 0.5 + N(0, 1), deterministic."""
    g = torch.Generator().manual_seed(1000 * stream_index + seq)
    x = torch.randn(rows, 2, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, 2.0], dtype=torch.float64) + 0.5 + torch.randn(rows, generator=g, dtype=torch.float64)
    return {"seq": seq, "x": x.tolist(), "y": y.tolist()}


def held_bytes(engine: SegmentedEngine) -> dict[str, int]:
    """Tensor bytes an engine holds: every distinct tensor storage reachable from it (main population and
    challengers, their histories, particles and generators), ``allocated`` (storage sizes, e.g. a history's
    doubling buffer) and ``history_rows`` (the rows the histories hold, x and y), plus the live challengers."""
    seen: set[int] = set()
    storages: dict[int, int] = {}
    rows = 0

    def walk(obj) -> None:
        nonlocal rows
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list | tuple | set):
            for v in obj:
                walk(v)
        elif type(obj).__module__.startswith("workers") and hasattr(obj, "__dict__"):
            if isinstance(obj, History):
                rows += obj.size * sum(t[0].numel() * t.element_size() for t in (obj.x, obj.y) if t is not None)
            for v in vars(obj).values():
                walk(v)

    walk(engine)
    return {"allocated": sum(storages.values()), "history_rows": int(rows), "challengers": len(engine.challengers)}


def reference(model: dict, chunks: list[dict], marks: tuple[int, ...] = ()) -> tuple[list[dict], dict[int, dict]]:
    """The trace rows of an uninterrupted run on the worker's path, without Redis: the model's engine as the
    worker builds it (:func:`workers.worker.restore.changepoint_settings`, change-point challengers included)
    and :func:`workers.worker.blocks.absorb_chunk` (which splits the stream's first values into blocks of one);
    and the engine's :func:`held_bytes` after each of the chunk counts ``marks``."""
    torch.set_num_threads(1)
    eng = SegmentedEngine.create(model["family"], model["params"], model["sampler"], changepoint_settings(model))
    rows: list[dict] = []
    held: dict[int, dict] = {}
    for n, c in enumerate(chunks, start=1):
        first = rows[-1]["observations"] if rows else 0
        rows += [b.row for b in absorb_chunk(eng, c["x"], c["y"], seq=c["seq"], first_index=first)]
        if n in marks:
            held[n] = held_bytes(eng)
    return [{k: row[k] for k in COMPARED} for row in rows], held


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.stop = threading.Event()
        self.status: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.events: collections.Counter[str] = collections.Counter()
        self.posted = {f"s{i}": 0 for i in range(args.streams)}
        self.kills: list[dict] = []
        self.samples: list[dict] = []
        self.churned = 0
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{args.port}"
        self.http = httpx.Client(base_url=self.url, timeout=30)

    # ----- HTTP with accounting ---------------------------------------------------------------
    def call(self, method: str, path: str, **kw) -> httpx.Response | None:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as err:
            with self.lock:
                self.errors[type(err).__name__] += 1
            return None
        with self.lock:
            self.status[str(r.status_code)] += 1
        return r

    # ----- traffic ------------------------------------------------------------------------------
    def poster(self) -> None:
        while not self.stop.wait(self.a.post_every):
            for i, s in enumerate(self.posted):
                seq = self.posted[s] + 1
                r = self.call("POST", f"/v1/streams/{s}/chunks", json=chunk(i, seq, self.a.rows))
                if r is not None and r.status_code == 202:
                    self.posted[s] = seq

    def socket_client(self, stream: str) -> None:
        while not self.stop.is_set():
            try:
                with connect(f"ws://127.0.0.1:{self.a.port}/v1/streams/{stream}/events", open_timeout=30) as ws:
                    until = time.monotonic() + self.a.reconnect_every
                    while not self.stop.is_set() and time.monotonic() < until:
                        try:
                            msg = json.loads(ws.recv(timeout=1.0))
                        except TimeoutError:
                            continue
                        with self.lock:
                            self.events[msg.get("type", "?")] += 1
                with self.lock:
                    self.events["reconnects"] += 1
            except Exception as err:  # noqa: BLE001 - counted, then retried
                with self.lock:
                    self.errors[f"ws:{type(err).__name__}"] += 1
                self.stop.wait(1.0)

    def churner(self) -> None:
        while not self.stop.wait(self.a.churn_every):
            k = self.churned
            name, stream = f"tmp-{k}", f"churn-{k}"
            r = self.call("POST", "/v1/models", json={"name": name, "stream": stream, **MODELS["lr-a"]})
            if r is None or r.status_code != 201:
                continue
            for seq in (1, 2):
                self.call("POST", f"/v1/streams/{stream}/chunks", json=chunk(99, seq, self.a.rows))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not self.stop.is_set():
                r = self.call("GET", f"/v1/models/{name}/evidence")
                if r is not None and r.status_code == 200 and r.json()["chunks_processed"] == 2:
                    break
                time.sleep(1.0)
            if k % 2 == 0:
                self.call("DELETE", f"/v1/models/{name}")
            self.call("DELETE", f"/v1/streams/{stream}")
            self.churned += 1

    def reader(self) -> None:
        """Light read traffic: evidence, stream posterior, alerts."""
        while not self.stop.wait(1.0):
            s = random.choice(list(self.posted))
            self.call("GET", f"/v1/streams/{s}/posterior")
            self.call("GET", f"/v1/models/{s}-lr-a/evidence")
            self.call("GET", "/v1/alerts", params={"stream": s})

    # ----- processes ----------------------------------------------------------------------------
    def workers(self) -> list[psutil.Process]:
        try:
            return [p for p in psutil.Process(self.serve.pid).children() if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.NoSuchProcess:
            return []

    def killer(self) -> None:
        if self.a.kill_every <= 0:
            return
        rng = random.Random(7)
        while not self.stop.wait(self.a.kill_every):
            procs = self.workers()
            if procs:
                p = rng.choice(procs)
                with self.lock:
                    self.kills.append({"t": round(time.monotonic() - self.t0, 1), "pid": p.pid})
                os.kill(p.pid, signal.SIGKILL)

    def sampler(self) -> None:
        while True:
            try:
                api = psutil.Process(self.serve.pid).memory_info().rss
                ws = {str(p.pid): p.memory_info().rss for p in self.workers()}
                t = round(time.monotonic() - self.t0, 1)
                self.samples.append({"t": t, "api": api, "workers": ws, "load": os.getloadavg()[0]})
            except psutil.NoSuchProcess:
                pass
            if self.stop.wait(self.a.sample_every):
                return

    # ----- run ----------------------------------------------------------------------------------
    def start_server(self) -> None:
        env = {
            **os.environ,
            "SGAIS_KEY_PREFIX": self.a.prefix,
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "SGAIS_RESTART_BACKOFF_SECONDS": "1",
        }
        cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(self.a.port)]
        cmd += ["--redis-url", self.a.redis_url, "--workers", str(self.a.workers)]
        log = open(self.a.log, "w")  # noqa: SIM115 - kept open for the server's lifetime
        self.serve = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit("sgais serve did not become ready")

    def run(self) -> dict:
        self.start_server()
        self.t0 = time.monotonic()
        for i in range(self.a.streams):
            for name, model in MODELS.items():
                r = self.call("POST", "/v1/models", json={"name": f"s{i}-{name}", "stream": f"s{i}", **model})
                assert r is not None and r.status_code == 201, r and r.text
        threads = [threading.Thread(target=f, daemon=True) for f in (self.poster, self.churner, self.killer)]
        threads += [threading.Thread(target=self.reader, daemon=True)]
        threads += [
            threading.Thread(target=self.socket_client, args=(f"s{k % self.a.streams}",), daemon=True)
            for k in range(self.a.sockets)
        ]
        sampler = threading.Thread(target=self.sampler, daemon=True)
        sampler.start()
        for t in threads:
            t.start()
        try:
            self.stop.wait(self.a.minutes * 60)
        finally:
            self.stop.set()
        for t in threads:
            t.join(timeout=60)
        traffic_seconds = time.monotonic() - self.t0
        # drain: every chunk absorbed by every persistent model
        drained_at = None
        deadline = time.monotonic() + self.a.drain_timeout
        while time.monotonic() < deadline:
            done = all(
                (r := self.call("GET", f"/v1/models/{s}-{m}/evidence")) is not None
                and r.json()["chunks_processed"] == n
                for s, n in self.posted.items()
                for m in MODELS
            )
            if done:
                drained_at = time.monotonic() - self.t0
                break
            time.sleep(2.0)
        sampler.join(timeout=5)
        traces, held = {}, {}
        for i, (s, n) in enumerate(self.posted.items()):
            chunks = [chunk(i, seq, self.a.rows) for seq in range(1, n + 1)]
            for m, model in MODELS.items():
                r = self.call("GET", f"/v1/models/{s}-{m}/trace", params={"limit": 10000})
                got = [{k: row[k] for k in COMPARED} for row in r.json()["items"]] if r is not None else []
                firsts = [row["first_index"] for row in got]
                want, held[f"{s}-{m}"] = reference(model, chunks, marks=(n // 2, n))
                traces[f"{s}-{m}"] = {
                    "rows": len(got),
                    "reference_rows": len(want),
                    "duplicates": len(firsts) - len(set(firsts)),
                    "equal_to_uninterrupted": got == want,
                    "first_difference": next(
                        (
                            {"row": i, "got": a, "want": b}
                            for i, (a, b) in enumerate(zip(got, want, strict=False))
                            if a != b
                        ),
                        None,
                    ),
                }
        workers_now = [p.pid for p in self.workers()]
        self.serve.send_signal(signal.SIGTERM)
        self.serve.wait(timeout=120)
        return self.summary(traffic_seconds, drained_at, traces, workers_now, held)

    def summary(self, traffic_seconds, drained_at, traces, workers_now, held) -> dict:
        """The JSON result (see the module docstring)."""

        def slope_mb_per_hour(points: list[tuple[float, float]]) -> float | None:
            pts = points[len(points) // 2 :]
            if len(pts) < 3:
                return None
            n = len(pts)
            mt = sum(t for t, _ in pts) / n
            mv = sum(v for _, v in pts) / n
            den = sum((t - mt) ** 2 for t, _ in pts)
            return sum((t - mt) * (v - mv) for t, v in pts) / den * 3600 / 2**20 if den else None

        api = [(s["t"], s["api"]) for s in self.samples]
        per_worker: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for s in self.samples:
            for pid, rss in s["workers"].items():
                per_worker[pid].append((s["t"], rss))
        longest = max(per_worker.items(), key=lambda kv: kv[1][-1][0] - kv[1][0][0]) if per_worker else None
        mb = lambda v: round(v / 2**20, 1)  # noqa: E731
        workers = {
            pid: {
                "seconds": round(pts[-1][0] - pts[0][0], 1),
                "rss_mb_first": mb(pts[0][1]),
                "rss_mb_max": mb(max(v for _, v in pts)),
                "rss_mb_last": mb(pts[-1][1]),
                "slope_mb_per_hour_second_half": slope_mb_per_hour(pts),
            }
            for pid, pts in per_worker.items()
        }
        # what the workers must hold: the engines' tensors at the end and at half the chunks (the chunks are
        # posted at a steady rate, so the second half of the chunks is about the second half of the traffic)
        end = {k: h[max(h)] for k, h in held.items() if h}
        half = {k: h[min(h)] for k, h in held.items() if h}
        accounting = {
            "per_model_at_end": end,
            "allocated_mb_at_end": mb(sum(h["allocated"] for h in end.values())),
            "allocated_mb_at_half": mb(sum(h["allocated"] for h in half.values())),
            "history_rows_mb_at_end": mb(sum(h["history_rows"] for h in end.values())),
            "history_rows_mb_at_half": mb(sum(h["history_rows"] for h in half.values())),
            "allocated_mb_per_hour_second_half": mb(
                sum(end[k]["allocated"] - half[k]["allocated"] for k in end) / (traffic_seconds / 2) * 3600
            ),
            "history_rows_mb_per_hour_second_half": mb(
                sum(end[k]["history_rows"] - half[k]["history_rows"] for k in end) / (traffic_seconds / 2) * 3600
            ),
        }
        loads = [s["load"] for s in self.samples if "load" in s]
        return {
            "minutes_of_traffic": round(traffic_seconds / 60, 2),
            "drained_after_seconds": None if drained_at is None else round(drained_at, 1),
            "chunks_posted": dict(self.posted),
            "http_status": dict(self.status),
            "http_5xx": sum(v for k, v in self.status.items() if k.startswith("5")),
            "client_errors": dict(self.errors),
            "ws_events": dict(self.events),
            "models_churned": self.churned,
            "worker_kills": len(self.kills),
            "workers_alive_at_end": len(workers_now),
            "api_rss_mb": {"first": mb(api[0][1]), "max": mb(max(v for _, v in api)), "last": mb(api[-1][1])},
            "api_rss_slope_mb_per_hour_second_half": slope_mb_per_hour(api),
            "longest_lived_worker": None
            if longest is None
            else {
                "pid": longest[0],
                "seconds": round(longest[1][-1][0] - longest[1][0][0], 1),
                "rss_mb_first": mb(longest[1][0][1]),
                "rss_mb_max": mb(max(v for _, v in longest[1])),
                "rss_mb_last": mb(longest[1][-1][1]),
                "slope_mb_per_hour_second_half": slope_mb_per_hour(longest[1]),
            },
            "workers": workers,
            # to compare with the accounting's growth: the workers alive through the traffic's second half
            "workers_rss_slope_mb_per_hour_second_half_sum": sum(
                slope_mb_per_hour(pts) or 0.0
                for pts in per_worker.values()
                if pts[0][0] <= traffic_seconds / 2 and pts[-1][0] >= traffic_seconds - 3 * self.a.sample_every
            ),
            "memory_accounting": accounting,
            "load_average_1min": {"min": min(loads), "median": sorted(loads)[len(loads) // 2], "max": max(loads)}
            if loads
            else None,
            "traces": traces,
            "samples": self.samples,
            "kills": self.kills,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--redis-url", default=os.environ.get("SGAIS_TEST_REDIS_URL", "redis://127.0.0.1:6379/8"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--rows", type=int, default=50)
    p.add_argument("--post-every", type=float, default=3.0)
    p.add_argument("--sockets", type=int, default=4)
    p.add_argument("--reconnect-every", type=float, default=60.0)
    p.add_argument("--churn-every", type=float, default=60.0)
    p.add_argument("--kill-every", type=float, default=150.0, help="seconds between worker SIGKILLs (0: none)")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--drain-timeout", type=float, default=900.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--out", default="bench/results/soak.json")
    p.add_argument("--log", default="/tmp/sgais-soak-serve.log")
    args = p.parse_args()
    args.port = args.port or free_port()
    args.prefix = f"soak-{secrets.token_hex(4)}"
    soak = Soak(args)
    try:
        result = soak.run()
    finally:
        if getattr(soak, "serve", None) is not None and soak.serve.poll() is None:
            soak.serve.kill()
        r = redis.Redis.from_url(args.redis_url)
        keys = list(r.scan_iter(match=f"{args.prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            r.delete(*keys[i : i + 1000])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "kills")}, indent=1))


if __name__ == "__main__":
    main()
