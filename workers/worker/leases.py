"""Leases: which models this worker holds, discovery up to a fair share, and the heartbeat thread that
keeps every held lease and the worker's heartbeat fresh while blocks run (DESIGN.md §2).

A lease is ``SET P:T:lease:{m} <token> NX PX <ttl>``.  The :class:`Heartbeat` thread renews every held
lease every ``ttl / 3`` (and at least every ``heartbeat_seconds``), independent of the block being
absorbed, in one round trip: the fenced ``lua/renew.lua`` (a lease that no longer holds our token is
left alone and flagged lost) pipelined with the worker's heartbeat key.  So a block may take longer
than the lease TTL without the lease expiring under it; a lost lease is noticed by the worker loop,
which drops the model and counts the loss (``P:metrics:lease_losses``).
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from workers.alerts import AlertSettings
from workers.engine import ModelEngine
from workers.quarantine import Budget, attempts_key
from workers.segmented import SegmentedEngine
from workers.store.commit import Scripts
from workers.store.keys import Keys, model_ref, parse_model_ref
from workers.store.scripts import RENEW_LUA
from workers.worker.blocks import layout
from workers.worker.detect import WindowText

log = logging.getLogger("sgais.worker")


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
    unsaved: int = 0  # chunks committed since the checkpoint's state blob was stored (Worker.commit_call)
    detector: dict[str, Any] = field(default_factory=dict)
    detector_text: WindowText = field(default_factory=WindowText, repr=False)  # detect.state_json's last window
    lost: bool = False  # set by the heartbeat when a renewal found the lease gone
    # quarantine (workers/quarantine.py): the attempt being made and the block budget
    fp: str = ""
    attempt: int = 0
    attempt_id: str = ""
    attempt_cursor: bytes | None = None
    budget: Budget | None = None
    _alerts: tuple[dict[str, Any], AlertSettings] | None = field(default=None, repr=False)
    _layout: tuple[Any, tuple[Any, ...]] | None = field(default=None, repr=False)

    def alert_settings(self) -> AlertSettings:
        """``cfg["alerts"]`` validated once per config (a reload replaces ``cfg``, never edits it), not per chunk."""
        if self._alerts is None or self._alerts[0] is not self.cfg:
            self._alerts = (self.cfg, AlertSettings(**self.cfg.get("alerts", {})))
        return self._alerts[1]

    def layout(self) -> tuple[Any, ...]:
        """The engine's family's :func:`~workers.worker.blocks.layout`, computed once per family object (a restore
        builds a new engine), not per chunk."""
        assert self.engine is not None
        family = self.engine.family
        if self._layout is None or self._layout[0] is not family:
            self._layout = (family, layout(family))
        return self._layout[1]

    @property
    def stream(self) -> str:
        return self.cfg["stream"]

    @property
    def ref(self) -> str:
        return model_ref(self.tenant, self.name)


class Leases:
    """The held models of one worker, shared by the worker loop and its heartbeat thread (``lock``)."""

    def __init__(self, r: redis.Redis, keys: Keys, scripts: Scripts, worker_id: str, ttl_seconds: float):
        self.r, self.keys, self.scripts, self.worker_id = r, keys, scripts, worker_id
        self.ttl_ms = int(ttl_seconds * 1000)
        self.held: dict[str, Held] = {}
        self.lock = threading.Lock()

    def snapshot(self) -> list[Held]:
        with self.lock:
            return list(self.held.values())

    def add(self, h: Held) -> None:
        with self.lock:
            self.held[h.ref] = h

    def drop(self, ref: str) -> Held | None:
        with self.lock:
            return self.held.pop(ref, None)

    def clear(self) -> None:
        with self.lock:
            self.held.clear()

    def live_count(self) -> int:
        """Held models not flagged lost."""
        with self.lock:
            return sum(not h.lost for h in self.held.values())

    def release(self, h: Held) -> None:
        """Give the model up (the lease is deleted if still ours)."""
        self.drop(h.ref)
        self.scripts.release(h.tenant, h.name, h.token)

    def beat(self, heartbeat_seconds: float) -> None:
        """Renew every held lease (fenced) and write the worker's heartbeat, in one round trip; flag the
        leases found lost (:attr:`Held.lost`)."""
        held = self.snapshot()
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        if held:
            keys = [self.keys.lease(h.tenant, h.name) for h in held]
            pipe.eval(RENEW_LUA, len(keys), *keys, self.ttl_ms, *(h.token for h in held))
        beat = json.dumps({"worker": self.worker_id, "leases": len(held), "at": now})
        pipe.set(self.keys.worker(self.worker_id), beat, px=int(3 * heartbeat_seconds * 1000))
        pipe.zadd(self.keys.workers, {self.worker_id: now})
        pipe.zremrangebyscore(self.keys.workers, "-inf", now - 3600)
        replies = pipe.execute()
        for h, ok in zip(held, replies[0] if held else [], strict=True):
            if not ok:
                h.lost = True

    def discover(self, heartbeat_seconds: float) -> list[Held]:
        """Release models beyond a fair share of the live workers, then lease free models up to it: the
        newly leased models (not yet restored; the caller adds those it restores)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.smembers(self.keys.models)
        pipe.zcount(self.keys.workers, time.time() - 3 * heartbeat_seconds, "+inf")
        members, live = pipe.execute()
        refs = sorted(x.decode() for x in members)
        share = math.ceil(len(refs) / max(live, 1))
        # a held model that left the registry was deleted (its lease went with it): flagged lost at once, so
        # the loop drops it now and it stops counting towards the share; waiting for the heartbeat's renewal
        # to find the lease gone kept a worker at its share from leasing a new model for up to a second
        present = set(refs)
        for h in self.snapshot():
            if h.ref not in present:
                h.lost = True
        while self.live_count() > share:  # rebalance towards workers that joined
            with self.lock:
                ref = sorted(r for r, h in self.held.items() if not h.lost)[-1]
            self.release(self.held[ref])
        free = [ref for ref in refs if ref not in self.held]
        if self.live_count() >= share or not free:
            return []
        # each worker tries the models in its own order, so racing workers rarely collide
        free.sort(key=lambda ref: zlib.crc32(f"{self.worker_id}/{ref}".encode()))
        pipe = self.r.pipeline(transaction=False)
        for ref in free:
            pipe.hget(self.keys.checkpoint(*parse_model_ref(ref)), "status")
            pipe.hget(attempts_key(self.keys, *parse_model_ref(ref)), "parked_until")
        taken: list[Held] = []
        res = pipe.execute()
        held = self.live_count()
        for ref, st, parked in zip(free, res[::2], res[1::2], strict=True):
            if held + len(taken) >= share:
                break
            if st == b"error" or (parked is not None and float(parked) > time.time()):  # failed, or parked
                continue
            tenant, name = parse_model_ref(ref)
            token = secrets.token_hex(8)
            if self.r.set(self.keys.lease(tenant, name), token, nx=True, px=self.ttl_ms):
                taken.append(Held(tenant, name, token))
        return taken


class Heartbeat:
    """A daemon thread calling ``beat`` every ``period`` seconds until ``stop`` is set (or :meth:`close`);
    Redis errors are logged and retried at the next period."""

    def __init__(self, beat: Callable[[], None], period: float, stop: threading.Event, name: str):
        self._beat, self.period = beat, period
        self._stop = threading.Event()
        self._outer = stop
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Heartbeat:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not (self._stop.wait(self.period) or self._outer.is_set()):
            try:
                self._beat()
            except redis.RedisError as err:
                log.warning("heartbeat: Redis unavailable (%s); retrying", err)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
