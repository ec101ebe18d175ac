"""The worker: leases models, absorbs their stream's chunks with SGAIS, commits exactly once.

Loop (DESIGN.md §2): heartbeat; discover models (``P:models``) and lease a fair share of them
(``SET NX PX`` with a random token, renewed); restore each leased model from its checkpoint
(history rebuilt by replaying the stream log); read the log entries after the model's cursor;
``ModelEngine.update`` block by block; then ONE ``MULTI/EXEC`` per chunk, fenced by the lease
(``WATCH`` the lease key and check it still holds our token), that stores the checkpoint, moves
the cursor, and writes trace rows, alerts, metrics and events.  A chunk is applied iff the
cursor moved past it in the transaction that stored the new state, so a worker killed at any
moment loses nothing and counts nothing twice; a restart reproduces the same values bit for bit.

Run alone with ``sgais worker --redis-url URL`` or ``python -m workers.runner``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import signal
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from service import records
from service.comparison import leader as leader_of
from service.keys import BLOCK_SECONDS_BUCKETS, Keys, parse_model_ref
from service.settings import Settings, get_settings
from workers import alerts as detector_lib
from workers.engine import ModelEngine
from workers.sgais import NumericalError

log = logging.getLogger("sgais.worker")

WORKER_REGISTRY = CollectorRegistry()
BLOCK_SECONDS = Histogram("sgais_block_seconds", "wall-clock seconds per absorbed block",
                          buckets=BLOCK_SECONDS_BUCKETS, registry=WORKER_REGISTRY)
ALERTS = Counter("sgais_alerts", "alerts raised", ["kind"], registry=WORKER_REGISTRY)
LEASES = Gauge("sgais_worker_leases", "models leased by the worker", ["worker"], registry=WORKER_REGISTRY)
OBSERVATIONS = Counter("sgais_worker_observations", "observations absorbed by this worker", registry=WORKER_REGISTRY)

RENEW_LUA = ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) "
             "else return 0 end")
RELEASE_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


class LeaseLost(Exception):
    """Our lease on a model expired, was taken over, or the model was deleted."""


@dataclass
class Held:
    """A model this worker leases: its engine and committed position in the stream log."""

    tenant: str
    name: str
    token: str
    cfg: dict[str, Any] = field(default_factory=dict)
    engine: ModelEngine | None = None
    cursor: bytes = b"0-0"  # id of the last applied stream-log entry
    chunks: int = 0
    detector: dict[str, Any] = field(default_factory=dict)
    renewed_at: float = 0.0

    @property
    def stream(self) -> str:
        return self.cfg["stream"]


class Worker:
    """One worker (a process or a thread of ``sgais serve``). ``run()`` loops until ``stop`` is set."""

    def __init__(self, settings: Settings, *, stop: threading.Event | None = None, worker_id: str | None = None):
        self.s = settings
        self.r = redis.Redis.from_url(settings.redis_url)
        self.keys = Keys(settings.key_prefix)
        self.id = worker_id or settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.stop = stop or threading.Event()
        self.held: dict[str, Held] = {}
        self.ttl_ms = int(settings.lease_ttl_seconds * 1000)
        self._beat_at = self._scan_at = 0.0
        self._priors: dict[tuple[str, str, str], float] = {}  # (tenant, stream, model) -> prior_probability

    # ----- loop -------------------------------------------------------------------------------
    def run(self) -> None:
        log.info("worker %s started", self.id)
        while not self.stop.is_set():
            try:
                if not self.step():
                    self.wait_for_data()
            except (redis.ConnectionError, redis.TimeoutError) as err:
                log.warning("worker %s: Redis unavailable (%s); retrying", self.id, err)
                self.held.clear()  # leases and checkpoints are re-read when Redis is back
                self.stop.wait(1.0)
        self.shutdown()

    def step(self) -> bool:
        """One pass: heartbeat, rescan leases when due, absorb pending chunks. True if any work was done."""
        now = time.monotonic()
        if now - self._beat_at >= self.s.heartbeat_seconds:
            self.heartbeat()
        if now - self._scan_at >= self.s.poll_seconds:
            self.scan()
        worked = False
        for ref, h in list(self.held.items()):
            try:
                worked |= self.advance(h)
            except LeaseLost:
                log.info("worker %s: lost lease on %s", self.id, ref)
                self.held.pop(ref, None)
        return worked

    def wait_for_data(self) -> None:
        """Block until a leased model's stream has an entry past its cursor, or ``poll_seconds``."""
        cursors: dict[str, bytes] = {}
        for h in self.held.values():
            k = self.keys.log(h.tenant, h.stream)
            cursors[k] = min(cursors.get(k, h.cursor), h.cursor, key=_entry_id)
        if not cursors:
            self.stop.wait(self.s.poll_seconds)
            return
        self.r.xread(cursors, count=1, block=max(int(self.s.poll_seconds * 1000), 1))

    def heartbeat(self) -> None:
        now = time.time()
        beat = json.dumps({"worker": self.id, "leases": len(self.held), "at": now})
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.keys.worker(self.id), beat, px=int(3 * self.s.heartbeat_seconds * 1000))
        pipe.zadd(self.keys.workers, {self.id: now})
        pipe.zremrangebyscore(self.keys.workers, "-inf", now - 3600)
        pipe.execute()
        LEASES.labels(self.id).set(len(self.held))
        self._beat_at = time.monotonic()

    def shutdown(self) -> None:
        with contextlib.suppress(redis.RedisError):
            for h in self.held.values():
                self.r.eval(RELEASE_LUA, 1, self.keys.lease(h.tenant, h.name), h.token)
            self.r.delete(self.keys.worker(self.id))
            self.r.zrem(self.keys.workers, self.id)
        self.held.clear()
        log.info("worker %s stopped", self.id)

    # ----- leases -----------------------------------------------------------------------------
    def scan(self) -> None:
        """Renew held leases, drop lost ones, and lease models up to a fair share of the live workers."""
        self._scan_at = time.monotonic()
        for ref, h in list(self.held.items()):
            if not self.r.eval(RENEW_LUA, 1, self.keys.lease(h.tenant, h.name), h.token, self.ttl_ms):
                self.held.pop(ref)
            else:
                h.renewed_at = time.monotonic()
        refs = sorted(x.decode() for x in self.r.smembers(self.keys.models))
        live = max(self.r.zcount(self.keys.workers, time.time() - 3 * self.s.heartbeat_seconds, "+inf"), 1)
        share = math.ceil(len(refs) / live)
        while len(self.held) > share:  # rebalance towards workers that joined
            ref = sorted(self.held)[-1]
            h = self.held.pop(ref)
            self.r.eval(RELEASE_LUA, 1, self.keys.lease(h.tenant, h.name), h.token)
        free = [ref for ref in refs if ref not in self.held]
        if len(self.held) >= share or not free:
            return
        # each worker tries the models in its own order, so racing workers rarely collide
        free.sort(key=lambda ref: zlib.crc32(f"{self.id}/{ref}".encode()))
        pipe = self.r.pipeline(transaction=False)
        for ref in free:
            pipe.hget(self.keys.checkpoint(*parse_model_ref(ref)), "status")
        for ref, st in zip(free, pipe.execute()):
            if len(self.held) >= share:
                break
            if st == b"error":
                continue
            tenant, name = parse_model_ref(ref)
            token = secrets.token_hex(8)
            if self.r.set(self.keys.lease(tenant, name), token, nx=True, px=self.ttl_ms):
                h = Held(tenant, name, token, renewed_at=time.monotonic())
                try:
                    if self.load(h):
                        self.held[ref] = h
                except LeaseLost:
                    pass
                except (NumericalError, ValueError) as err:
                    self.record_error(h, err)

    def renew_if_due(self, h: Held) -> None:
        if time.monotonic() - h.renewed_at > self.s.lease_ttl_seconds / 3:
            if not self.r.eval(RENEW_LUA, 1, self.keys.lease(h.tenant, h.name), h.token, self.ttl_ms):
                raise LeaseLost(h.name)
            h.renewed_at = time.monotonic()

    def load(self, h: Held) -> bool:
        """Restore (or create) the engine of a freshly leased model. False if the model is gone."""
        raw = self.r.get(self.keys.model(h.tenant, h.name))
        if raw is None:
            self.r.eval(RELEASE_LUA, 1, self.keys.lease(h.tenant, h.name), h.token)
            return False
        h.cfg = json.loads(raw)
        ckpt = self.r.hgetall(self.keys.checkpoint(h.tenant, h.name))
        if b"state" in ckpt:
            h.cursor, h.chunks = ckpt[b"cursor"], int(ckpt[b"chunks"])
            h.detector = json.loads(ckpt[b"detector"])
            h.engine = ModelEngine.from_bytes(ckpt[b"state"], history_blocks=self.replay(h))
        else:
            h.engine = ModelEngine(h.cfg["family"], h.cfg["params"], h.cfg["sampler"])
            h.cursor, h.chunks, h.detector = b"0-0", 0, detector_lib.initial_state()
            self.commit(h, b"0-0", 0, [], [])
        return True

    def replay(self, h: Held) -> Iterator[tuple[Any, Any]]:
        """The stream's chunks from the start up to the model's cursor, as ``(x, y)`` tensors."""
        start, key = "-", self.keys.log(h.tenant, h.stream)
        while True:
            entries = self.r.xrange(key, start, h.cursor, count=256)
            for entry_id, fields in entries:
                yield records.decode_chunk(fields)
            if len(entries) < 256:
                return
            start = b"(" + entries[-1][0]

    # ----- absorbing --------------------------------------------------------------------------
    def advance(self, h: Held) -> bool:
        """Absorb up to ``read_batch`` chunks past the model's cursor. True if any."""
        entries = self.r.xrange(self.keys.log(h.tenant, h.stream), b"(" + h.cursor, "+", count=self.s.read_batch)
        for entry_id, fields in entries:
            if self.stop.is_set():
                break
            try:
                self.absorb(h, entry_id, fields)
            except (NumericalError, ValueError) as err:
                self.record_error(h, err)
                self.held.pop(f"{h.tenant}/{h.name}", None)
                return True
        return bool(entries)

    def absorb(self, h: Held, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        """One chunk: update block by block (timing each), detect alerts, commit."""
        # The stream log holds the chunk as validated by the stream's schema; this model's family
        # may lay it out differently (a 1-D gmm wants y: [B, 1], an autoregressive model y: [B]).
        x, y = h.engine.family.validate(*records.decode_chunk(fields))
        seq, first = int(fields[b"seq"]), int(fields[b"first_index"])
        size, n = h.engine.settings.block_size, y.shape[0]
        settings = detector_lib.AlertSettings(**h.cfg.get("alerts", {}))
        rows, found = [], []
        for start in range(0, n, size):
            self.renew_if_due(h)
            xb, yb = (x[start:start + size] if x is not None else None), y[start:start + size]
            t0 = time.perf_counter()
            (info,) = h.engine.update(xb, yb, validated=True)
            seconds = time.perf_counter() - t0
            row = {
                "seq": seq, "first_index": first + start, "block_observations": int(yb.shape[0]),
                "observations": first + start + int(yb.shape[0]), "log_predictive": info.log_predictive,
                "log_evidence": info.log_evidence, "annealing_steps": info.annealing_steps, "ess": info.ess,
                "resampled": info.resampled, "guard_tripped": info.guard_tripped, "seconds": seconds,
            }
            rows.append(row)
            h.detector, new = detector_lib.detect(h.detector, settings, {
                "first_index": row["first_index"], "observations": info.observations,
                "log_predictive": info.log_predictive, "annealing_steps": info.annealing_steps})
            found += [{**a, "stream": h.stream, "model": h.name} for a in new]
        self.commit(h, entry_id, seq, rows, found)
        OBSERVATIONS.inc(n)
        for row in rows:
            BLOCK_SECONDS.observe(row["seconds"])

    def commit(self, h: Held, cursor: bytes, seq: int, rows: list[dict], found: list[dict]) -> None:
        """Store checkpoint + cursor + trace rows + alerts + events in ONE fenced MULTI/EXEC.

        Raises LeaseLost when the lease no longer holds our token (nothing is written then).
        """
        eng, k, t = h.engine, self.keys, h.tenant
        ckpt = {
            "state": eng.to_bytes(include_history=False), "cursor": cursor, "chunks": seq,
            "observations": eng.observations, "log_evidence": repr(eng.log_evidence),
            "detector": json.dumps(h.detector), "posterior": json.dumps(eng.posterior_summary()),
            "last_block": json.dumps(records.block_of(rows[-1])) if rows else "", "status": "ok", "error": "",
        }
        lease, leader_key = k.lease(t, h.name), k.leader(t, h.stream)
        while True:
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(lease, leader_key)
                    if pipe.get(lease) != h.token.encode():
                        raise LeaseLost(h.name)
                    compare = self.compare(h, eng.observations, rows) if rows else None
                    stream_chunks = int(self.r.hget(k.meta(t, h.stream), "chunks") or 0)
                    pipe.multi()
                    pipe.hset(k.checkpoint(t, h.name), mapping=ckpt)
                    channel = k.events(t, h.stream)
                    if rows:
                        pipe.zadd(k.trace(t, h.name), {json.dumps(r): r["first_index"] for r in rows})
                        self._histogram(pipe, rows)
                        for i, row in enumerate(rows):
                            body = records.evidence_body(h.name, h.stream, {
                                "chunks": seq if i == len(rows) - 1 else seq - 1,
                                "observations": row["observations"], "log_evidence": row["log_evidence"],
                                "last_block": json.dumps(records.block_of(row)), "status": "ok"}, stream_chunks)
                            pipe.publish(channel, json.dumps({"type": "evidence", **body}))
                    alerts = list(found)
                    if compare is not None:
                        posterior, leader_record, switch = compare
                        pipe.set(leader_key, json.dumps(leader_record))
                        if switch:
                            alerts.append(switch)
                        if posterior is not None:
                            pipe.publish(channel, json.dumps({"type": "posterior", **posterior}))
                    for a in alerts:
                        a = {"id": secrets.token_hex(8), "observation_index": None, "detected_at_index": None,
                             **a, "created_at": datetime.now(timezone.utc).isoformat()}
                        pipe.zadd(k.alerts(t), {json.dumps(a): time.time() * 1000})
                        pipe.hincrby(k.alerts_total, a["kind"], 1)
                        pipe.publish(channel, json.dumps({"type": "alert", **a}))
                    pipe.pexpire(lease, self.ttl_ms)
                    pipe.execute()
                except redis.WatchError:
                    continue  # the lease or the stream's leader changed: re-check and retry
            break
        h.cursor, h.chunks, h.renewed_at = cursor, seq, time.monotonic()
        for a in found:
            ALERTS.labels(a["kind"]).inc()

    def compare(self, h: Held, observations: int, rows: list[dict]) -> tuple[dict | None, dict, dict | None]:
        """Stream posterior after this commit: (event body if the common count grew, leader record, switch alert)."""
        k, t = self.keys, h.tenant
        names = sorted(m.decode() for m in self.r.smembers(k.stream_models(t, h.stream)))
        # Model configs are immutable while a model exists: read each one once (prior probability).
        # (A model deleted and re-created under the same name between two commits keeps its old prior
        # here until the next worker restart; deleted names are pruned below.)
        for key in [key for key in self._priors if key[:2] == (t, h.stream) and key[2] not in names]:
            del self._priors[key]
        unknown = [m for m in names if (t, h.stream, m) not in self._priors]
        pipe = self.r.pipeline(transaction=False)
        for m in unknown:
            pipe.get(k.model(t, m))
        for m in names:
            pipe.hmget(k.checkpoint(t, m), ["observations", "status"])
        pipe.get(k.leader(t, h.stream))
        got = pipe.execute()
        for m, cfg in zip(unknown, got[: len(unknown)]):
            if cfg is not None:
                self._priors[(t, h.stream, m)] = json.loads(cfg)["prior_probability"]
        states, priors = {}, {}
        for m, (obs, st) in zip(names, got[len(unknown) : len(unknown) + len(names)]):
            if (t, h.stream, m) in self._priors:
                priors[m] = self._priors[(t, h.stream, m)]
                states[m] = {"observations": int(obs or 0), "status": (st or b"").decode()}
        states[h.name] = {"observations": observations, "status": "ok"}
        priors[h.name] = h.cfg["prior_probability"]
        previous = json.loads(got[-1]) if got[-1] else None
        count = records.common_count(states)
        if previous is not None and count == previous["observations"]:
            return None, previous, None  # the common count did not move: nothing to recompute
        active = [m for m in states if states[m]["status"] != "error"]
        lz = {m: 0.0 for m in active}
        if count > 0:
            mine = [r for r in rows if r["observations"] == count]
            pipe = self.r.pipeline(transaction=False)
            others = [m for m in active if not (m == h.name and mine)]
            for m in others:
                pipe.zrevrangebyscore(k.trace(t, m), count - 1, "-inf", start=0, num=1)
            lz = {m: row["log_evidence"] for m, r in zip(others, pipe.execute())
                  if (row := records.trace_row_at(r, count)) is not None}
            if mine:
                lz[h.name] = mine[0]["log_evidence"]
        entries = [{"model": m, "prior_probability": priors[m], "log_evidence": lz[m]} for m in active if m in lz]
        posterior = records.stream_posterior(h.stream, count, entries)
        new_leader = leader_of(posterior["models"])
        record = {"model": new_leader, "observations": count}
        if previous is not None and count <= previous["observations"]:
            return None, (previous if count == previous["observations"] else record), None
        switch = None
        if previous is not None and previous["model"] in states:
            switch = detector_lib.model_switch(previous["model"], posterior["models"])
            if switch is not None:
                switch.update(stream=h.stream, observation_index=previous["observations"],
                              detected_at_index=count - 1)
        return posterior, record, switch

    def _histogram(self, pipe, rows: list[dict]) -> None:
        for row in rows:
            le = next((b for b in BLOCK_SECONDS_BUCKETS if row["seconds"] <= b), None)
            if le is not None:
                pipe.hincrby(self.keys.block_seconds, str(le), 1)
            pipe.hincrby(self.keys.block_seconds, "count", 1)
            pipe.hincrbyfloat(self.keys.block_seconds, "sum", row["seconds"])

    def record_error(self, h: Held, err: Exception) -> None:
        """Mark the model as failed (status "error" + message), publish it, release the lease."""
        log.error("worker %s: model %s/%s failed: %s", self.id, h.tenant, h.name, err)
        k, t = self.keys, h.tenant
        with self.r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(k.lease(t, h.name))
                if pipe.get(k.lease(t, h.name)) != h.token.encode():
                    return
                fresh = not pipe.hexists(k.checkpoint(t, h.name), "chunks")
                pipe.multi()
                fields = {"status": "error", "error": f"{type(err).__name__}: {err}"}
                if fresh:
                    fields.update(chunks=0, observations=0, log_evidence="0.0", cursor="0-0")
                pipe.hset(k.checkpoint(t, h.name), mapping=fields)
                if h.cfg:
                    pipe.publish(k.events(t, h.stream), json.dumps(
                        {"type": "error", "model": h.name, "stream": h.stream, "error": fields["error"]}))
                pipe.delete(k.lease(t, h.name))
                pipe.execute()
            except redis.WatchError:
                pass


def _entry_id(entry: bytes) -> tuple[int, int]:
    ms, _, n = entry.partition(b"-")
    return int(ms), int(n or 0)


def main(settings: Settings | None = None) -> None:
    """Run one worker until SIGTERM/SIGINT; metrics on ``SGAIS_METRICS_PORT`` when set."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings or get_settings()
    if not settings.redis_url:
        raise SystemExit("SGAIS_REDIS_URL (or --redis-url) is required for a standalone worker")
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=WORKER_REGISTRY)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    Worker(settings, stop=stop).run()


if __name__ == "__main__":
    main()
