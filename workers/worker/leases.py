"""Leases: which models this worker holds, discovery up to a fair share, and the heartbeat thread that
keeps every held lease and the worker's heartbeat fresh while blocks run (DESIGN.md §2).

A lease is ``SET P:T:lease:{m} <token> NX PX <ttl>``.  The :class:`Heartbeat` thread renews every held
lease every ``ttl / 3`` (and at least every ``heartbeat_seconds``), independent of the block being
absorbed, in one round trip: the fenced ``lua/renew.lua`` (a lease that no longer holds our token is
left alone and flagged lost) pipelined with the worker's heartbeat key.  So a block may take longer
than the lease TTL without the lease expiring under it; a lost lease is noticed by the worker loop,
which drops the model and counts the loss (``P:metrics:lease_losses``).

Shares by measured cost.  Models differ in cost by an order of magnitude (the demo's two-component gmm on
Bitcoin took 25 s of engine CPU, a one-component gmm on UKCoal a fraction of one), so shares by count left one
of two workers with twice the other's work (session 28: 63.6 against 46.6 s of worker CPU quiet, 75.9 against
35.8 beside two CPU-bound processes).  Each worker measures the engine load of every model it holds
(:class:`EngineLoad`: engine seconds per second of wall time, exponentially weighted) and publishes it
(``P:costs``), with its own summed load (``P:loads``), at every scan.  A scan then (:func:`wanted`,
:func:`surplus`):

* leases free models, in its own order, while its load is below the target ``total / live workers`` and not
  above the least published load of the other workers by more than ``SHARE_MARGIN`` times the model's cost: the
  least-loaded worker is below the target while any model is free, so every model is taken, and by it;
* releases a model held for :data:`MIN_HOLD_SECONDS` or longer, of cost ``c``, while ``c·(1 + SHARE_MARGIN) < L −
  L_min``, ``L`` its load and ``L_min`` the least-loaded other live worker's, counting each release towards that
  worker: such a move lowers the sum of squared loads, and the model does not move back (the receiver's lead over
  the sender is then below ``c``); a worker that released leases nothing in that scan.

A model counts as at least :data:`COST_FLOOR`, and one not measured yet as the median of the measured ones, so
with no load measured (idle models, a new deployment) the shares are the models' count, as before: ``ceil(n /
workers)`` at most.
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
from workers.store.records import parse_share
from workers.store.scripts import RENEW_LUA
from workers.worker.blocks import layout
from workers.worker.detect import WindowText

log = logging.getLogger("sgais.worker")

#: Time constant of a model's measured engine load (seconds): a block's engine seconds count with weight
#: ``exp(−age / τ)``.  Long enough that one slow block does not move a model, short enough that a demo's first
#: minute is balanced by its own measurements.
COST_TIME_CONSTANT = 20.0
#: The least load a model counts as (engine seconds per second): idle models weigh the same, so with nothing
#: measured the shares are by count.
COST_FLOOR = 1e-3
#: A held model moves to the least-loaded worker only if the loads differ by more than ``(1 + SHARE_MARGIN)``
#: times its cost: measured loads fluctuate, and a move costs a restore.
SHARE_MARGIN = 0.25
#: A model is released towards another worker only once held this long (seconds): its load is measured over
#: three time constants by then, and so are those of the models the other workers took meanwhile; and a move costs
#: a restore, with the chunks since the last stored state absorbed again.  With 10 s the demo's models moved as
#: their first costs came in: 3 workers took 21.1-22.1 s against 17.9-18.7 by count, and 12% more worker CPU
#: (bench/README.md, session 32): a burst that ends within the minute is left as it was leased.
MIN_HOLD_SECONDS = 60.0


class EngineLoad:
    """A model's engine load: engine seconds per second of wall time, an exponentially weighted rate with time
    constant :data:`COST_TIME_CONSTANT` (``S(t) = Σ_i s_i·exp(−(t − t_i)/τ)``, rate ``S/τ``; before ``τ`` has
    passed, ``S / (τ·(1 − exp(−age/τ)))``, unbiased for a steady rate).  ``published``: the rate its previous
    holder published, taken as the state at ``now`` (it then decays like an older measurement)."""

    def __init__(self, now: float, published: float | None = None):
        self.at = now
        self.start: float | None = now if published is None else None  # a published rate is warm already
        self.total = published * COST_TIME_CONSTANT if published is not None else 0.0
        self.measured = published is not None

    def add(self, seconds: float, now: float) -> None:
        """Count ``seconds`` of engine time spent at ``now`` (monotonic seconds)."""
        self.total = self.total * math.exp(-(now - self.at) / COST_TIME_CONSTANT) + seconds
        self.at, self.measured = now, True

    def rate(self, now: float) -> float | None:
        """Engine seconds per second at ``now``; None while nothing is known."""
        if not self.measured:
            return None
        total = self.total * math.exp(-(now - self.at) / COST_TIME_CONSTANT)
        if self.start is None:
            return total / COST_TIME_CONSTANT
        warm = -math.expm1(-max(now - self.start, 1e-3) / COST_TIME_CONSTANT)
        return total / (COST_TIME_CONSTANT * warm)


def model_costs(refs: list[str], published: dict[str, float | None], own: dict[str, float | None]) -> dict[str, float]:
    """Each registered model's cost for the shares: this worker's own measurement of a held model, else the
    published one, else the median of the known ones; at least :data:`COST_FLOOR` (module docstring)."""
    known = {ref: c for ref, c in published.items() if c is not None}
    known.update({ref: c for ref, c in own.items() if c is not None})
    values = sorted(known[ref] for ref in refs if ref in known)
    default = values[len(values) // 2] if values else COST_FLOOR
    return {ref: max(known.get(ref, default), COST_FLOOR) for ref in refs}


def wanted(free: list[str], costs: dict[str, float], load: float, target: float, least: float | None) -> list[str]:
    """The free models (in the caller's order) to lease: each while the load is below ``target`` (by more than
    the rounding of the sums: equal costs then give the shares by count) and, where other workers published
    their loads (least ``least``), not above theirs by more than ``SHARE_MARGIN`` times the model's cost: a free
    model goes to the least-loaded worker, not to whichever scans first."""
    out = []
    for ref in free:
        if load >= target * (1 - 1e-9):
            break
        if least is not None and load - least > SHARE_MARGIN * costs[ref]:
            continue
        out.append(ref)
        load += costs[ref]
    return out


def surplus(held: list[str], costs: dict[str, float], load: float, least: float | None) -> list[str]:
    """The held models to release towards the least-loaded other worker (load ``least``; None: no other live
    worker): the costliest model whose move lowers the pair's difference by a margin, repeatedly, each move
    counted on both sides (module docstring)."""
    out: list[str] = []
    if least is None:
        return out
    rest = sorted(held, key=lambda ref: (costs[ref], ref))
    while rest:
        fits = [ref for ref in rest if costs[ref] * (1 + SHARE_MARGIN) < load - least]
        if not fits:
            return out
        ref = fits[-1]
        rest.remove(ref)
        out.append(ref)
        load, least = load - costs[ref], least + costs[ref]
    return out


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
    unsaved_seconds: float = 0.0  # their engine seconds (the trace rows' ``seconds``)
    # after a restore, the last committed entry the engine has absorbed while it is behind the cursor (None: at it)
    replay_from: bytes | None = None
    detector: dict[str, Any] = field(default_factory=dict)
    detector_text: WindowText = field(default_factory=WindowText, repr=False)  # detect.state_json's last window
    lost: bool = False  # set by the heartbeat when a renewal found the lease gone
    # engine seconds per second (the cost-weighted shares, module docstring); replaced at the lease by the published
    load: EngineLoad = field(default_factory=lambda: EngineLoad(time.monotonic()))
    leased_at: float = field(default_factory=time.monotonic)  # monotonic seconds (MIN_HOLD_SECONDS)
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
        self.checked_at = -math.inf  # monotonic time of the last check of every model's lease (discover)

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
        """Publish the held models' loads; release models towards the least-loaded worker and lease free models
        up to the target load (module docstring): the newly leased models (not yet restored; the caller adds those
        it restores)."""
        now_wall, now = time.time(), time.monotonic()
        pipe = self.r.pipeline(transaction=False)
        pipe.smembers(self.keys.models)
        pipe.zrangebyscore(self.keys.workers, now_wall - 3 * heartbeat_seconds, "+inf")
        pipe.hgetall(self.keys.costs)
        pipe.hgetall(self.keys.loads)
        members, live_ids, published_raw, loads_raw = pipe.execute()
        refs = sorted(x.decode() for x in members)
        live = {x.decode() for x in live_ids} | {self.worker_id}
        published = {k.decode(): _float(v) for k, v in published_raw.items()}
        # a held model that left the registry was deleted (its lease went with it): flagged lost at once, so
        # the loop drops it now and it stops counting towards the share; waiting for the heartbeat's renewal
        # to find the lease gone kept a worker at its share from leasing a new model for up to a second
        present = set(refs)
        for h in self.snapshot():
            if h.ref not in present:
                h.lost = True
        with self.lock:
            held = {ref: h for ref, h in self.held.items() if not h.lost}
        own = {ref: h.load.rate(now) for ref, h in held.items()}
        costs = model_costs(refs, published, own)
        target = sum(costs.values()) / max(len(live), 1)
        shares = {k.decode(): parse_share(v) for k, v in loads_raw.items()}
        others = [x[0] for w, x in shares.items() if w in live and w != self.worker_id and x is not None]
        # releases: a live worker that published nothing yet has just joined and holds nothing (0)
        joined = len(others) < len(live) - 1
        least = (0.0 if joined else min(others)) if len(live) > 1 else None
        load = sum(costs[ref] for ref in held)
        # towards workers that joined or carry less; a model leased within MIN_HOLD_SECONDS stays (its load is not
        # measured yet, nor the other workers' since they took theirs)
        settled = [ref for ref, h in held.items() if now - h.leased_at >= MIN_HOLD_SECONDS]
        released = surplus(settled, costs, load, least)
        for ref in released:
            log.info("worker %s: releases %s (%.3g engine s/s; load %.3g, least %.3g)", self.worker_id, ref,
                     costs[ref], load, least)  # fmt: skip
            self.release(held.pop(ref))
            load -= costs[ref]
        taken: list[Held] = []
        # a worker that released leases nothing in the same scan: the models it gave up are for the others
        # the other live workers' published model counts: while they and ours cover the registry no model is free,
        # and the per-model pipeline below is skipped (an idle worker scans every poll_seconds), but at least once per
        # lease TTL: a lease that lapsed under a live holder stays in its count until that holder's next scan
        leased = len(held) + sum(x[1] for w, x in shares.items() if w in live and w != self.worker_id and x)
        due = leased < len(refs) or now - self.checked_at >= self.ttl_ms / 1000
        if not released and load < target * (1 - 1e-9) and due:
            self.checked_at = now
            rest = [ref for ref in refs if ref not in self.held]
            pipe = self.r.pipeline(transaction=False)
            for ref in rest:
                tenant, name = parse_model_ref(ref)
                pipe.exists(self.keys.lease(tenant, name))
                pipe.hget(self.keys.checkpoint(tenant, name), "status")
                pipe.hget(attempts_key(self.keys, tenant, name), "parked_until")
            res = pipe.execute()
            free = [
                ref
                for ref, has_lease, st, parked in zip(rest, res[::3], res[1::3], res[2::3], strict=True)
                # not held by another worker, not failed, not parked (quarantine)
                if not has_lease and st != b"error" and not (parked is not None and float(parked) > now_wall)
            ]
            # each worker tries the models in its own order, so racing workers rarely collide
            free.sort(key=lambda ref: zlib.crc32(f"{self.worker_id}/{ref}".encode()))
            # leases: only the published loads (at a fresh start nobody published, and every worker fills its share)
            for ref in wanted(free, costs, load, target, min(others) if others else None):
                tenant, name = parse_model_ref(ref)
                token = secrets.token_hex(8)
                if self.r.set(self.keys.lease(tenant, name), token, nx=True, px=self.ttl_ms):
                    h = Held(tenant, name, token)
                    h.load = EngineLoad(now, published.get(ref))
                    taken.append(h)
                    load += costs[ref]
        pipe = self.r.pipeline(transaction=False)
        mine = {ref: rate for ref, rate in own.items() if rate is not None and ref in held}
        if mine:
            pipe.hset(self.keys.costs, mapping={ref: repr(rate) for ref, rate in mine.items()})
        stale = [ref for ref in published if ref not in present]
        if stale:
            pipe.hdel(self.keys.costs, *stale)
        gone = [k for k in loads_raw if k.decode() not in live]
        if gone:
            pipe.hdel(self.keys.loads, *gone)
        pipe.hset(self.keys.loads, self.worker_id, json.dumps({"load": load, "models": len(held) + len(taken)}))
        pipe.execute()
        return taken


def _float(raw: bytes | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


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
