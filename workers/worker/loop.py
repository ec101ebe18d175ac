"""The worker loop (DESIGN.md §2): discover and lease models (:mod:`~workers.worker.leases`), restore each
(:mod:`~workers.worker.restore`), read the stream-log entries after its cursor, absorb them block by block
(:mod:`~workers.worker.blocks`), detect alerts (:mod:`~workers.worker.detect`), then ONE fenced Lua script
per chunk (:meth:`workers.store.commit.Scripts.commit`) that stores the checkpoint, moves the cursor and
writes trace rows, alerts, metrics and events atomically; when the stream's common observation count
moved, the stream posterior (:mod:`~workers.worker.posterior`).  A chunk is applied iff the cursor moved
past it in the script that stored the new state, so a worker killed at any moment loses nothing and counts
nothing twice; a restart reproduces the same values bit for bit.  A heartbeat thread renews the leases
while blocks run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

import redis

from workers import quarantine
from workers.config import Settings
from workers.segmented import SegmentedEngine
from workers.store import records
from workers.store.commit import LeaseLost, Scripts, StreamState
from workers.store.keys import Keys
from workers.worker import detect
from workers.worker.blocks import absorb_chunk
from workers.worker.leases import Heartbeat, Held, Leases
from workers.worker.metrics import ALERTS, BLOCK_SECONDS, LEASES, OBSERVATIONS
from workers.worker.posterior import StreamPosteriors
from workers.worker.restore import restore

log = logging.getLogger("sgais.worker")


class Worker(quarantine.QuarantineHooks):
    """One worker (a process or a thread of ``sgais serve``).  ``run()`` loops until ``stop`` is set, with a
    heartbeat thread; ``step()`` makes one pass over what is there and returns (tests drive it).

    Failures are per model (:class:`~workers.quarantine.QuarantineHooks`, issue 11): an exception or a worker
    death while a model is restored or absorbs a batch counts an attempt in Redis; after
    ``max_block_attempts`` the model goes to ``error``; a block over ``block_budget_seconds`` is aborted and
    the model ``degraded`` and parked.  The loop itself never dies on one model."""

    def __init__(self, settings: Settings, *, stop: threading.Event | None = None, worker_id: str | None = None):
        self.s = settings
        self.r = redis.Redis.from_url(settings.redis_url)
        self.keys = Keys(settings.key_prefix)
        self.id = worker_id or settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.stop = stop or threading.Event()
        self.scripts = Scripts(self.r, self.keys)
        self.leases = Leases(self.r, self.keys, self.scripts, self.id, settings.lease_ttl_seconds)
        self.posteriors = StreamPosteriors(self.scripts)
        # leases are renewed every TTL/3, the heartbeat key at least every heartbeat_seconds
        self.beat_seconds = min(settings.lease_ttl_seconds / 3, settings.heartbeat_seconds)
        self._beat_at = self._scan_at = 0.0
        self._heartbeat: Heartbeat | None = None

    @property
    def held(self) -> dict[str, Held]:
        return self.leases.held

    # ----- loop -------------------------------------------------------------------------------
    def run(self) -> None:
        log.info("worker %s started", self.id)
        with contextlib.suppress(redis.RedisError):
            self.heartbeat()  # counted live before the first scan computes the fair share
        self._heartbeat = Heartbeat(self.heartbeat, self.beat_seconds, self.stop, f"{self.id}-heartbeat").start()
        try:
            while not self.stop.is_set():
                try:
                    self.step()
                    # returns at once while any model has entries pending; saves the empty XRANGE of every
                    # model that another pass would take to find out that nothing new has arrived
                    self.wait_for_data()
                except (redis.ConnectionError, redis.TimeoutError) as err:
                    log.warning("worker %s: Redis unavailable (%s); retrying", self.id, err)
                    self.leases.clear()  # leases and checkpoints are re-read when Redis is back
                    self.stop.wait(1.0)
                except Exception:  # the loop never dies (model failures are handled per model)
                    log.exception("worker %s: unexpected error; continuing", self.id)
                    self.stop.wait(1.0)
        finally:
            self._heartbeat.close()
            self.shutdown()

    def step(self) -> bool:
        """One pass: rescan leases when due, absorb pending chunks.  True if any work was done.  Without the
        heartbeat thread (a step-driven worker) the leases and the heartbeat are renewed here when due."""
        now = time.monotonic()
        self.beat_if_due()
        self.drop_lost()
        if now - self._scan_at >= self.s.poll_seconds:
            self.scan()
        worked = False
        for h in self.leases.snapshot():
            if h.lost or self.stop.is_set():
                continue
            try:
                worked |= self.advance(h)
            except LeaseLost as err:
                self.lose(h, retried_blocks=err.blocks)
        return worked

    def wait_for_data(self) -> None:
        """Block until a leased model's stream has an entry past its cursor, or ``poll_seconds``."""
        cursors: dict[str, bytes] = {}
        for h in self.leases.snapshot():
            k = self.keys.log(h.tenant, h.stream)
            cursors[k] = min(cursors.get(k, h.cursor), h.cursor, key=_entry_id)
        if not cursors:
            self.stop.wait(self.s.poll_seconds)
            return
        self.r.xread(cursors, count=1, block=max(int(self.s.poll_seconds * 1000), 1))

    def beat_if_due(self) -> None:
        """Without the heartbeat thread (a step-driven worker): :meth:`heartbeat` when a period has passed.
        Called at each pass and before each chunk, so leases outlive passes but not a block longer than the TTL."""
        if self._heartbeat is None and time.monotonic() - self._beat_at >= self.beat_seconds:
            self.heartbeat()

    def heartbeat(self) -> None:
        """Renew every held lease (fenced) and the worker's heartbeat key, in one round trip."""
        self.leases.beat(self.s.heartbeat_seconds)
        LEASES.labels(self.id).set(len(self.held))
        self._beat_at = time.monotonic()

    def shutdown(self) -> None:
        with contextlib.suppress(redis.RedisError):
            for h in self.leases.snapshot():
                self.scripts.release(h.tenant, h.name, h.token)
            self.r.delete(self.keys.worker(self.id))
            self.r.zrem(self.keys.workers, self.id)
        self.leases.clear()
        log.info("worker %s stopped", self.id)

    # ----- leases -----------------------------------------------------------------------------
    def scan(self) -> None:
        """Lease models up to a fair share of the live workers (releasing beyond it) and restore them."""
        self._scan_at = time.monotonic()
        for h in self.leases.discover(self.s.heartbeat_seconds):
            self.leases.add(h)  # held (so renewed by the heartbeat) while its history is replayed
            try:
                if not self.load(h):
                    self.leases.release(h)
            except LeaseLost:
                self.leases.drop(h.ref)
            except Exception as err:  # quarantine: counted, error after max_block_attempts
                if not self.model_failed(h, err):
                    raise
                self.leases.drop(h.ref)

    def drop_lost(self) -> None:
        """Drop the models whose lease the heartbeat found lost."""
        for h in self.leases.snapshot():
            if h.lost:
                self.lose(h, retried_blocks=0)

    def lose(self, h: Held, *, retried_blocks: int) -> None:
        """Drop a model whose lease was lost; count the loss and the blocks computed in vain (not when the
        model was deleted: its lease went with it)."""
        log.info("worker %s: lost lease on %s", self.id, h.ref)
        self.leases.drop(h.ref)
        if self.r.exists(self.keys.model(h.tenant, h.name)):
            self.scripts.count_loss(self.id, h.tenant, h.name, retried_blocks)

    def load(self, h: Held) -> bool:
        """Restore (or create) the engine of a freshly leased model.  False if the model is gone."""
        if not self.r.exists(self.keys.model(h.tenant, h.name)):
            return False
        h.cfg = json.loads(self.r.get(self.keys.model(h.tenant, h.name)) or b"{}")
        ckpt_cursor = self.r.hget(self.keys.checkpoint(h.tenant, h.name), "cursor") or b"0-0"
        self.begin_attempt(h, ckpt_cursor, "restore")  # a restore may crash the worker too
        restored = restore(self.r, self.keys, h)
        if restored is None:
            return False
        self.end_attempt(h)  # restored: the attempt is given back
        self.arm_budget(h)  # the block budget, checked inside the engine
        if restored:
            # a worker killed between a commit and its stream-posterior update left that update undone
            self.update_stream_posterior(h, self.posteriors.state(h), [])
        else:
            self.commit(h, b"0-0", 0, [], [])
        return True

    # ----- absorbing --------------------------------------------------------------------------
    def advance(self, h: Held) -> bool:
        """Absorb up to ``read_batch`` chunks past the model's cursor.  True if any.

        Raises
        ------
        LeaseLost
            The lease was lost (``blocks``: the blocks computed and not committed).
        """
        entries = self.r.xrange(self.keys.log(h.tenant, h.stream), b"(" + h.cursor, "+", count=self.s.read_batch)
        for i, (entry_id, fields) in enumerate(entries):
            if self.stop.is_set():
                break
            self.beat_if_due()
            try:
                if i == 0:  # one attempt counted per batch, before its first block; survives a crash
                    self.begin_attempt(h, h.cursor, "block")
                self.absorb(h, entry_id, fields)
            except Exception as err:  # quarantine (LeaseLost and Redis outages are re-raised)
                if not self.model_failed(h, err):
                    raise
                self.leases.drop(h.ref)
                return True
        return bool(entries)

    def absorb(self, h: Held, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        """One chunk: update block by block (timing each), detect alerts, commit."""
        assert h.engine is not None
        seq = int(fields[b"seq"])
        x, y = records.decode_chunk(fields)
        blocks = absorb_chunk(h.engine, x, y, seq=seq, first_index=int(fields[b"first_index"]), budget=h.budget)
        h.detector, found = detect.detect(h.detector, h.cfg, blocks, stream=h.stream, model=h.name)
        if isinstance(h.engine, SegmentedEngine):  # change_point alerts of the challengers (issue 12)
            found += [{**a, "stream": h.stream, "model": h.name} for a in h.engine.take_alerts()]
        rows = [b.row for b in blocks]
        self.commit(h, entry_id, seq, rows, found)
        OBSERVATIONS.inc(int(y.shape[0]))
        for row in rows:
            BLOCK_SECONDS.observe(row["seconds"])

    def commit(self, h: Held, cursor: bytes, seq: int, rows: list[dict], found: list[dict]) -> None:
        """Store checkpoint + cursor + trace rows + histogram + alerts + events in ONE fenced Lua script
        (:meth:`Scripts.commit`, one round trip); then, if the stream's common observation count moved, the
        stream posterior (:meth:`update_stream_posterior`, a second round trip).

        Raises
        ------
        LeaseLost
            The lease no longer holds our token.  Raised by the commit script, nothing was written (``blocks``
            = ``len(rows)``, computed in vain); raised by the stream-posterior update, the commit stands and
            the update is left to the next holder.
        """
        eng = h.engine
        assert eng is not None
        ckpt = {
            "state": eng.to_bytes(include_history=False),
            "cursor": cursor,
            "chunks": seq,
            "observations": eng.observations,
            "log_evidence": repr(eng.log_evidence),
            "detector": json.dumps(h.detector),
            "last_block": json.dumps(records.block_of(rows[-1])) if rows else "",
            # the sampler could not certify its value (workers.conflict, the annealing guard): degraded + reason
            "status": "degraded" if getattr(eng, "degraded", None) else "ok",
            "error": getattr(eng, "degraded", None) or "",
        }
        if isinstance(eng, SegmentedEngine):  # challengers and segment bookkeeping (issue 12)
            ckpt["changepoint"] = eng.changepoint_bytes()
        # the evidence event after each block: the chunk counts as processed with its last block
        events = []
        for i, row in enumerate(rows):
            chunks = seq if i == len(rows) - 1 else seq - 1
            events.append((chunks, records.evidence_event_members(h.name, h.stream, row, chunks)))
        try:
            state = self.scripts.commit(
                tenant=h.tenant,
                model=h.name,
                stream=h.stream,
                token=h.token,
                ttl_ms=self.leases.ttl_ms,
                checkpoint=ckpt,
                rows=rows,
                events=events,
                alerts=[detect.alert_record(a) for a in found],
                observations=eng.observations,
                known=self.posteriors.known(h) if rows else None,
            )
        except LeaseLost as err:
            raise LeaseLost(h.name, blocks=len(rows)) from err
        h.cursor, h.chunks = cursor, seq
        for a in found:
            ALERTS.labels(a["kind"]).inc()
        self.update_stream_posterior(h, state, rows)

    def update_stream_posterior(self, h: Held, state: StreamState | None, rows: list[dict[str, Any]]) -> None:
        """:meth:`StreamPosteriors.update` (a method of the worker so that a test can make it fail)."""
        self.posteriors.update(h, state, rows)

    def record_error(self, h: Held, err: Exception) -> None:
        """Mark the model as failed (status "error" + message), publish it and the stream posterior without it,
        release the lease."""
        log.error("worker %s: model %s/%s failed: %s", self.id, h.tenant, h.name, err)
        k, t = self.keys, h.tenant
        with self.r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(k.lease(t, h.name))
                if pipe.get(k.lease(t, h.name)) != h.token.encode():
                    return
                fresh = not pipe.hexists(k.checkpoint(t, h.name), "chunks")
                pipe.multi()
                fields: dict[str, Any] = {"status": "error", "error": f"{type(err).__name__}: {err}"}
                if fresh:
                    fields.update(chunks=0, observations=0, log_evidence="0.0", cursor="0-0")
                pipe.hset(k.checkpoint(t, h.name), mapping=fields)
                if h.cfg:
                    pipe.publish(
                        k.events(t, h.stream),
                        json.dumps({"type": "error", "model": h.name, "stream": h.stream, "error": fields["error"]}),
                    )
                pipe.execute()
            except redis.WatchError:
                return
        # the failed model leaves the comparison: the common count may move, and the failure must show in
        # the published posterior (with no model_switch, workers.comparison.switch_leader); then release
        if h.cfg:
            with contextlib.suppress(LeaseLost):
                self.update_stream_posterior(h, self.posteriors.state(h), [])
        self.scripts.release(h.tenant, h.name, h.token)


def _entry_id(entry: bytes) -> tuple[int, int]:
    ms, _, n = entry.partition(b"-")
    return int(ms), int(n or 0)
