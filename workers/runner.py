"""The worker: leases models, absorbs their stream's chunks with SGAIS, commits exactly once.

Loop (DESIGN.md §2): heartbeat; discover models (``P:models``) and lease a fair share of them
(``SET NX PX`` with a random token, renewed); restore each leased model from its checkpoint
(history rebuilt by replaying the stream log); read the log entries after the model's cursor;
``ModelEngine.update`` block by block; then ONE Lua script per chunk (``workers.store.commit``, one
round trip), fenced by the lease (it writes nothing unless the lease still holds our token), that
stores the checkpoint, moves the cursor, and writes trace rows, alerts, metrics and events
atomically; when the stream's common observation count moved, a second fenced script stores the
stream posterior.  A chunk is applied iff the cursor moved past it in the script that stored the
new state, so a worker killed at any moment loses nothing and counts nothing twice; a restart
reproduces the same values bit for bit.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from workers import alerts as detector_lib
from workers.comparison import leader as leader_of
from workers.config import Settings, get_settings
from workers.engine import ModelEngine
from workers.segmented import SegmentedEngine
from workers.sgais import NumericalError
from workers.store import records
from workers.store.commit import LeaseLost, Scripts, StreamState
from workers.store.keys import BLOCK_SECONDS_BUCKETS, Keys, parse_model_ref

log = logging.getLogger("sgais.worker")

WORKER_REGISTRY = CollectorRegistry()
BLOCK_SECONDS = Histogram(
    "sgais_block_seconds",
    "wall-clock seconds per absorbed block",
    buckets=BLOCK_SECONDS_BUCKETS,
    registry=WORKER_REGISTRY,
)
ALERTS = Counter("sgais_alerts", "alerts raised", ["kind"], registry=WORKER_REGISTRY)
LEASES = Gauge("sgais_worker_leases", "models leased by the worker", ["worker"], registry=WORKER_REGISTRY)
OBSERVATIONS = Counter("sgais_worker_observations", "observations absorbed by this worker", registry=WORKER_REGISTRY)

RENEW_LUA = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end"
)
RELEASE_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


@dataclass
class Held:
    """A model this worker leases: its engine and committed position in the stream log."""

    tenant: str
    name: str
    token: str
    cfg: dict[str, Any] = field(default_factory=dict)
    engine: ModelEngine | SegmentedEngine | None = None  # SegmentedEngine: main engine + challengers (issue 12)
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
        self.scripts = Scripts(self.r, self.keys)

    # ----- loop -------------------------------------------------------------------------------
    def run(self) -> None:
        log.info("worker %s started", self.id)
        while not self.stop.is_set():
            try:
                self.step()
                # returns at once while any model has entries pending; saves the empty XRANGE of every
                # model that another pass would take to find out that nothing new has arrived
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
            if ref not in self.held:  # dropped by keep_alive while another model worked
                continue
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
        held = list(self.held.items())
        pipe = self.r.pipeline(transaction=False)  # one round trip for every renewal and the discovery reads
        for _, h in held:
            pipe.eval(RENEW_LUA, 1, self.keys.lease(h.tenant, h.name), h.token, self.ttl_ms)
        pipe.smembers(self.keys.models)
        pipe.zcount(self.keys.workers, time.time() - 3 * self.s.heartbeat_seconds, "+inf")
        sent = time.monotonic()
        *renewed, members, live = pipe.execute()
        for (ref, h), ok in zip(held, renewed):
            if ok:
                h.renewed_at = sent
            else:
                self.held.pop(ref)
        refs = sorted(x.decode() for x in members)
        live = max(live, 1)
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

    def keep_alive(self, h: Held) -> None:
        """Called before every block of ``h`` and by the engine between the blocks of a re-annealing:
        keep every held lease and the worker's heartbeat (``/readyz``) fresh while one model works.

        A pass over many models can outlast the lease TTL (10 models x 64 chunks of 25 ms = 16 s):
        renewing only the working model let the idle models' leases expire, and the next scan
        re-leased and reloaded each of them, replaying its stream's history (bench/README.md,
        "Service overhead on a quiet machine").  Renewals that are due go in one round trip.

        Raises LeaseLost for ``h``; another model whose lease was lost is dropped here.
        """
        now = time.monotonic()
        due = [(ref, x) for ref, x in self.held.items() if now - x.renewed_at > self.s.lease_ttl_seconds / 3]
        if due:
            pipe = self.r.pipeline(transaction=False)
            for _, x in due:
                pipe.eval(RENEW_LUA, 1, self.keys.lease(x.tenant, x.name), x.token, self.ttl_ms)
            lost_h = False
            for (ref, x), ok in zip(due, pipe.execute()):
                if ok:
                    x.renewed_at = now
                elif x is h:
                    lost_h = True
                else:
                    self.held.pop(ref, None)
            if lost_h:
                raise LeaseLost(h.name)
        if now - self._beat_at >= self.s.heartbeat_seconds:
            self.heartbeat()

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
            # issue 12: the main engine plus its change-point challengers (field absent in older checkpoints)
            h.engine = SegmentedEngine.restore(
                ckpt[b"state"], ckpt.get(b"changepoint"), _changepoint_settings(h.cfg), lambda: self.replay(h)
            )
            # a worker killed between a commit and its stream-posterior update left that update undone
            state = self.scripts.stream_state(tenant=h.tenant, stream=h.stream, known=self._known(h))
            self.update_stream_posterior(h, state, [])
        else:
            h.engine = SegmentedEngine.create(
                h.cfg["family"], h.cfg["params"], h.cfg["sampler"], _changepoint_settings(h.cfg)
            )
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
            self.keep_alive(h)
            xb, yb = (x[start : start + size] if x is not None else None), y[start : start + size]
            t0 = time.perf_counter()
            (info,) = h.engine.update(xb, yb, validated=True, heartbeat=lambda: self.keep_alive(h))
            seconds = time.perf_counter() - t0
            row = {
                "seq": seq,
                "first_index": first + start,
                "block_observations": int(yb.shape[0]),
                "observations": first + start + int(yb.shape[0]),
                "log_predictive": info.log_predictive,
                "log_evidence": info.log_evidence,
                "annealing_steps": info.annealing_steps,
                "ess": info.ess,
                "resampled": info.resampled,
                "guard_tripped": info.guard_tripped,
                "reannealed": info.reannealed,
                "seconds": seconds,
                **_change_fields(h.engine),  # issue 12: change_probability, change_point
            }
            rows.append(row)
            h.detector, new = detector_lib.detect(
                h.detector,
                settings,
                {
                    "first_index": row["first_index"],
                    "observations": info.observations,
                    "log_predictive": info.log_predictive,
                    "annealing_steps": info.annealing_steps,
                },
            )
            found += [{**a, "stream": h.stream, "model": h.name} for a in new]
            if isinstance(h.engine, SegmentedEngine):  # issue 12: change_point alerts of the challengers
                found += [{**a, "stream": h.stream, "model": h.name} for a in h.engine.take_alerts()]
        self.commit(h, entry_id, seq, rows, found)
        OBSERVATIONS.inc(n)
        for row in rows:
            BLOCK_SECONDS.observe(row["seconds"])

    def commit(self, h: Held, cursor: bytes, seq: int, rows: list[dict], found: list[dict]) -> None:
        """Store checkpoint + cursor + trace rows + histogram + alerts + events in ONE fenced Lua script
        (``workers.store.commit.COMMIT_LUA``, one round trip); then, if the stream's common observation count
        moved, the stream posterior (:meth:`update_stream_posterior`, a second round trip).

        Raises
        ------
        LeaseLost
            The lease no longer holds our token.  Raised by the commit script, nothing was written; raised
            by the stream-posterior update, the commit stands and the update is left to the next holder.
        """
        eng = h.engine
        ckpt = {
            "state": eng.to_bytes(include_history=False),
            "cursor": cursor,
            "chunks": seq,
            "observations": eng.observations,
            "log_evidence": repr(eng.log_evidence),
            "detector": json.dumps(h.detector),
            "last_block": json.dumps(records.block_of(rows[-1])) if rows else "",
            "status": "ok",
            "error": "",
        }
        if isinstance(eng, SegmentedEngine):  # issue 12: challengers and segment bookkeeping
            ckpt["changepoint"] = eng.changepoint_bytes()
        events = []
        for i, row in enumerate(rows):
            chunks = seq if i == len(rows) - 1 else seq - 1
            events.append(
                (
                    chunks,
                    records.evidence_event_head(
                        h.name,
                        h.stream,
                        {
                            "chunks": chunks,
                            "observations": row["observations"],
                            "log_evidence": row["log_evidence"],
                            "last_block": json.dumps(records.block_of(row)),
                            "status": "ok",
                        },
                    ),
                )
            )
        sent = time.monotonic()
        state = self.scripts.commit(
            tenant=h.tenant,
            model=h.name,
            stream=h.stream,
            token=h.token,
            ttl_ms=self.ttl_ms,
            checkpoint=ckpt,
            rows=rows,
            events=events,
            alerts=[_alert(a) for a in found],
            observations=eng.observations,
            known=self._known(h) if rows else None,
        )
        h.cursor, h.chunks, h.renewed_at = cursor, seq, sent
        for a in found:
            ALERTS.labels(a["kind"]).inc()
        self.update_stream_posterior(h, state, rows)

    def _known(self, h: Held) -> list[str]:
        """Models of the stream whose prior this worker has cached (the scripts skip reading their configs)."""
        return sorted({m for (t, s, m) in self._priors if (t, s) == (h.tenant, h.stream)} | {h.name})

    def update_stream_posterior(self, h: Held, state: StreamState | None, rows: list[dict]) -> None:
        """Store the stream posterior of ``state`` (leader record, ``posterior`` event, ``model_switch`` alert)
        with the fenced compare-and-set ``LEADER_LUA``; re-read and recompute while another worker moved the
        leader record first.  ``rows``: this model's rows just committed (the commit script read the stream
        before writing them).  Nothing to do when ``state`` is None.

        Raises
        ------
        LeaseLost
            The lease no longer holds our token (nothing written).
        """
        while state is not None:
            posterior, record, switch = self.stream_posterior(h, state, rows)
            if self.scripts.set_leader(
                tenant=h.tenant,
                model=h.name,
                stream=h.stream,
                token=h.token,
                expected=state.leader_raw,
                record=record,
                posterior=posterior,
                alert=_alert(switch) if switch is not None else None,
            ):
                return
            # another worker moved the leader record first: re-read
            state = self.scripts.stream_state(tenant=h.tenant, stream=h.stream, known=self._known(h))

    def stream_posterior(self, h: Held, state: StreamState, rows: list[dict]) -> tuple[dict | None, dict, dict | None]:
        """Stream posterior at ``state.count``: (event body, or None if the count went down; leader record;
        ``model_switch`` alert or None).  ``rows``: this model's rows not yet in ``state`` (see above)."""
        t, count = h.tenant, state.count
        # Model configs are immutable while a model exists: each prior is read once (a model deleted and
        # re-created under the same name keeps its old prior here until the worker restarts).
        names = {m for m, *_ in state.models}
        for key in [key for key in self._priors if key[:2] == (t, h.stream) and key[2] not in names]:
            del self._priors[key]
        states, priors, lz = {}, {}, {}
        for m, obs, status, row, cfg in state.models:
            if cfg:
                self._priors[(t, h.stream, m)] = json.loads(cfg)["prior_probability"]
            priors[m] = h.cfg["prior_probability"] if m == h.name else self._priors[(t, h.stream, m)]
            states[m] = {"observations": obs, "status": status}
            if row and (found := records.trace_row_at([row], count)) is not None:
                lz[m] = found["log_evidence"]
        lz.update({h.name: r["log_evidence"] for r in rows if r["observations"] == count})
        active = [m for m in states if states[m]["status"] != "error"]
        if count == 0:
            lz = {m: 0.0 for m in active}
        entries = [{"model": m, "prior_probability": priors[m], "log_evidence": lz[m]} for m in active if m in lz]
        posterior = records.stream_posterior(h.stream, count, entries)
        record = {"model": leader_of(posterior["models"]), "observations": count}
        previous = state.previous
        if previous is not None and count < previous["observations"]:
            return None, record, None  # a model joined the stream: the count went down
        switch = None
        if previous is not None and previous["model"] in states:
            switch = detector_lib.model_switch(previous["model"], posterior["models"])
            if switch is not None:
                switch.update(stream=h.stream, observation_index=previous["observations"], detected_at_index=count - 1)
        return posterior, record, switch

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
                    pipe.publish(
                        k.events(t, h.stream),
                        json.dumps({"type": "error", "model": h.name, "stream": h.stream, "error": fields["error"]}),
                    )
                pipe.delete(k.lease(t, h.name))
                pipe.execute()
            except redis.WatchError:
                pass


def _changepoint_settings(cfg: dict[str, Any]):
    """The model's change-point settings (``alerts.change_point``, issue 12)."""
    return detector_lib.AlertSettings(**cfg.get("alerts", {})).change_point


def _change_fields(engine: Any) -> dict[str, Any]:
    """Trace-row fields of the change posterior after the latest block (issue 12); none without challengers."""
    block = getattr(engine, "last_block", None)
    if not block:
        return {}
    return {"change_probability": block["change_probability"], "change_point": block["change_point"]}


def _alert(a: dict[str, Any]) -> dict[str, Any]:
    """An alert record (API.md "Alerts") from a detector's body: id, default indices, creation time."""
    return {
        "id": secrets.token_hex(8),
        "observation_index": None,
        "detected_at_index": None,
        **a,
        "created_at": datetime.now(UTC).isoformat(),
    }


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
