"""The worker loop (DESIGN.md §2): discover and lease models (:mod:`~workers.worker.leases`), restore each
(:mod:`~workers.worker.restore`), read the stream-log entries after its cursor, absorb them block by block
(:mod:`~workers.worker.blocks`), detect alerts (:mod:`~workers.worker.detect`), then ONE fenced Lua script
per chunk (:meth:`workers.store.commit.Scripts.commit`) that stores the checkpoint, moves the cursor and
writes trace rows, alerts, metrics and events atomically; when the stream's common observation count
moved, the stream posterior (:mod:`~workers.worker.posterior`).  A chunk is applied iff the cursor moved
past it in the script that stored the new checkpoint (the particle state itself at least every few chunks,
:meth:`Worker.state_due`; a restore re-absorbs the chunks after it from the stream log), so a worker killed at any
moment loses nothing and counts nothing twice; a restart reproduces the same values bit for bit.  A heartbeat thread
renews the leases while blocks run.
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
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import redis

from workers import quarantine
from workers.config import Settings
from workers.engine import block_bounds
from workers.segmented import SegmentedEngine, advance_blocks
from workers.stacking import rows_between
from workers.store import records
from workers.store.commit import COMMITS_PER_SCRIPT, LeaseLost, Scripts, SentCommits, StreamState
from workers.store.keys import Keys
from workers.worker import detect
from workers.worker.blocks import Block, RoundChunks, change_fields
from workers.worker.leases import Heartbeat, Held, Leases
from workers.worker.metrics import ALERTS, BLOCK_SECONDS, LEASES, OBSERVATIONS
from workers.worker.posterior import CommittedStatus, StreamPosteriors
from workers.worker.restore import fresh_engines, restore, restore_from

log = logging.getLogger("sgais.worker")


def warm_lazy_imports(*, optimiser: bool = True) -> None:
    """Import what the first block would otherwise import while holding leases: sympy, which
    ``torch.broadcast_shapes`` loads on first use (a parameter's unconstrained shape, ``models.base``), and
    ``scipy.optimize`` (the Laplace start's L-BFGS-B, ``workers.conflict``; 0.45 s here).  Until session 27 the
    optimiser was torch's, whose first step imported ``torch._dynamo``: 1.7 s and 38 MB more per worker process;
    with sympy 1.5–5 s on this 2-core machine, which a worker's first block spent holding its leases (a step-driven
    worker with a 2 s lease lost them on a busy machine).  Idempotent (the modules stay imported).

    ``optimiser`` False: sympy only, for the API process (``sgais serve``), which validates models but runs no
    Laplace start; imported there before the collector's freeze (:func:`workers.runner.quiet_gc`), or the first
    model registration imported it while serving (195 ms on that request, session 25) and every later
    collection of the older generations scanned its objects."""
    import torch

    if optimiser:
        import scipy.optimize  # noqa: F401

    torch.broadcast_shapes((1,), (1,))


class Worker(quarantine.QuarantineHooks):
    """One worker (a process or a thread of ``sgais serve``).  ``run()`` loops until ``stop`` is set, with a
    heartbeat thread; ``step()`` makes one pass over what is there and returns (tests drive it).

    Failures are per model (:class:`~workers.quarantine.QuarantineHooks`, issue 11): an exception or a worker
    death while a model is restored or absorbs a batch counts an attempt in Redis; after
    ``max_block_attempts`` the model goes to ``error``; a block over ``block_budget_seconds`` is aborted and
    the model ``degraded`` and parked.  The loop itself never dies on one model."""

    def __init__(
        self,
        settings: Settings,
        *,
        stop: threading.Event | None = None,
        worker_id: str | None = None,
        warm: bool = True,
    ):
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
        self._raise_lost = False  # advance(): a lost lease is raised to the caller instead of handled
        if warm:  # else the caller warms up, e.g. after begin() (workers.runner)
            warm_lazy_imports()

    @property
    def held(self) -> dict[str, Held]:
        return self.leases.held

    # ----- loop -------------------------------------------------------------------------------
    def begin(self) -> None:
        """Write the first heartbeat and start the heartbeat thread (idempotent; :meth:`run` calls it): the worker is
        counted live from here, before the first scan computes the fair share.  ``workers.runner`` calls it before the
        worker's warm-up imports (1-2 s of scipy and sympy here), so that a service waiting for its workers (``sgais
        demo``) registers its models that much sooner; leasing waits for :meth:`run`."""
        if self._heartbeat is not None:
            return
        log.info("worker %s started", self.id)
        with contextlib.suppress(redis.RedisError):
            self.heartbeat()
        self._heartbeat = Heartbeat(self.heartbeat, self.beat_seconds, self.stop, f"{self.id}-heartbeat").start()

    def run(self) -> None:
        self.begin()
        assert self._heartbeat is not None
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
        """One pass: rescan leases when due, absorb pending chunks (:meth:`advance_many`: every held model's
        next chunk in one stacked update).  True if any work was done.  Without the heartbeat thread (a
        step-driven worker) the leases and the heartbeat are renewed here when due."""
        now = time.monotonic()
        self.beat_if_due()
        self.drop_lost()
        if now - self._scan_at >= self.s.poll_seconds:
            self.scan()
        held = [h for h in self.leases.snapshot() if not h.lost]
        if not held or self.stop.is_set():
            return False
        return self.advance_many(held)

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
            self.r.hdel(self.keys.loads, self.id)
        self.leases.clear()
        log.info("worker %s stopped", self.id)

    # ----- leases -----------------------------------------------------------------------------
    def scan(self) -> None:
        """Lease models up to a fair share of the live workers' measured load (releasing models towards the
        least-loaded worker: :meth:`Leases.discover`) and restore them."""
        self._scan_at = time.monotonic()
        found = self.leases.discover(self.s.heartbeat_seconds)
        for h in found:
            self.leases.add(h)  # held (so renewed by the heartbeat) while its history is replayed
        self.load_many(found)

    def load_failed(self, h: Held, err: Exception) -> None:
        """A freshly leased model's load raised ``err``: dropped (a lost lease), or quarantined (counted, error after
        ``max_block_attempts``); Redis outages are re-raised."""
        if isinstance(err, LeaseLost):
            self.leases.drop(h.ref)
            return
        if not self.model_failed(h, err):
            raise err
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

    def load_many(self, hs: list[Held], *, alone: bool = False) -> None:
        """Restore (or create) the engines of freshly leased models in four round trips for all: their configs,
        checkpoints and attempt records read at once, their restore attempts begun at once (:meth:`begin_attempts`)
        and given back at once, the fresh models' initial checkpoints committed at once (:meth:`Scripts.commit_many`),
        the restored models' stream posterior checked once per stream.  A model gone from the registry is released.
        A model with an attempt at its checkpoint's cursor that neither committed nor was given back (a worker died
        while it ran, or it failed and is retried) is loaded alone, after the others, as :meth:`advance_many` runs
        such a model alone: a worker killed while restoring one model of a batch counts an attempt against every
        model of it, which would otherwise quarantine the innocent ones with the culprit (``alone``: the models are
        already so isolated).

        Why: one model at a time a load took eight round trips, and 128 models registered back to back kept a
        worker loading them (4 ms of its CPU each) after their first chunks had arrived (bench/README.md, session
        40).
        """
        if not hs:
            return
        batch, suspects = self._leased_records(hs, alone)
        cursors = [ckpt.get(b"cursor", b"0-0") for _, ckpt in batch]
        errors = self.begin_attempts([h for h, _ in batch], cursors, "restore") if batch else []
        # the fresh models' engines built together (their prior draws in one call), each as it is alone
        new = [h for (h, ckpt), error in zip(batch, errors, strict=True) if error is None and b"state" not in ckpt]
        fresh = dict(zip((h.ref for h in new), fresh_engines([h.cfg for h in new]), strict=True))
        loaded: list[tuple[Held, bool]] = []
        for (h, ckpt), error in zip(batch, errors, strict=True):
            try:
                if error is not None:
                    raise error
                # the chunks committed after the stored state are re-absorbed in the rounds, stacked with the other
                # models' work (absorb_round), not here one model at a time
                restored = restore_from(self.r, self.keys, h, h.cfg, ckpt, catch_up_now=False, fresh=fresh.get(h.ref))
                assert restored is not None  # its config was read
                loaded.append((h, restored))
            except Exception as err:
                self.load_failed(h, err)
        if loaded:
            self.end_attempts([h for h, _ in loaded])  # restored: the attempts are given back
        self._loaded([h for h, restored in loaded if restored], [h for h, restored in loaded if not restored])
        for h in suspects:
            self.load_many([h], alone=True)

    def _leased_records(self, hs: list[Held], alone: bool) -> tuple[list[tuple[Held, dict[bytes, bytes]]], list[Held]]:
        """:meth:`load_many`'s read, in one round trip: ``(model, checkpoint hash)`` of the models to load
        together (each model's config parsed into ``h.cfg``), and the suspects to load alone (none when ``alone``); a
        model gone from the registry is released."""
        pipe = self.r.pipeline(transaction=False)
        for h in hs:
            pipe.get(self.keys.model(h.tenant, h.name))
            pipe.hgetall(self.keys.checkpoint(h.tenant, h.name))
            pipe.hmget(quarantine.attempts_key(self.keys, h.tenant, h.name), "cursor", "attempts")
        got = pipe.execute()
        batch: list[tuple[Held, dict[bytes, bytes]]] = []
        suspects: list[Held] = []
        for h, raw, ckpt, (at, attempts) in zip(hs, got[::3], got[1::3], got[2::3], strict=True):
            if raw is None:
                self.leases.release(h)
            elif not alone and at == ckpt.get(b"cursor", b"0-0") and int(attempts or 0) > 0:
                suspects.append(h)
            else:
                h.cfg = json.loads(raw)  # begin_attempts fingerprints it; restore_from keeps it
                batch.append((h, ckpt))
        return batch, suspects

    def _loaded(self, restored: list[Held], fresh: list[Held]) -> None:
        """:meth:`load_many`'s last step: each engine's block budget; the stream posterior of each stream with a
        restored model (a worker killed between a commit and its stream-posterior update left that update undone),
        checked once per stream, by its first restored model whose check does not fail (one round trip per model
        took 43% of a restore's scan: 1.1 of 2.5 ms per model of 128 on one stream, session 40); the fresh models'
        initial checkpoints, in one round trip."""
        for h in [*restored, *fresh]:
            self.arm_budget(h)  # the block budget, checked inside the engine
        streams: dict[tuple[str, str], list[Held]] = {}
        for h in restored:
            streams.setdefault((h.tenant, h.stream), []).append(h)
        for members in streams.values():
            for h in members:
                try:
                    self.update_stream_posterior(h, self.posteriors.state(h), [])
                    break
                except Exception as err:
                    self.load_failed(h, err)
        if not fresh:
            return
        replies = self.scripts.commit_many([self.commit_call(h, b"0-0", 0, [], []) for h in fresh])
        for h, reply in zip(fresh, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                self.committed(h, b"0-0", 0, [], [], reply, with_state=True)
            except Exception as err:
                self.load_failed(h, err)

    # ----- absorbing --------------------------------------------------------------------------
    def advance(self, h: Held) -> bool:
        """Absorb up to ``read_batch`` chunks past one model's cursor (:meth:`advance_many` of it alone).

        Raises
        ------
        LeaseLost
            The lease was lost (``blocks``: the blocks computed and not committed); nothing was written.
        """
        self._raise_lost = True
        try:
            return self.advance_many([h])
        finally:
            self._raise_lost = False

    def advance_many(self, models: list[Held], *, alone: bool = False) -> bool:
        """Absorb up to ``read_batch`` chunks past each model's cursor, the models advancing together (issue 9
        §4): round ``r`` absorbs the ``r``-th pending chunk of every model that has one, whatever its stream,
        in one stacked update per block (:meth:`absorb_round`); then one fenced commit per chunk and model.

        The pending entries of all models are read in one round trip.  Failures stay per model (quarantine:
        one attempt counted per model and batch, before its first chunk); a lost lease drops that model only.
        A model with an attempt at its cursor that neither committed nor failed (its worker died) runs alone,
        after the others, its attempt counted only then: a worker killed by one model of a stack would
        otherwise count an attempt against every model of it, and quarantine the innocent ones with the
        culprit (``alone``: the models are already so isolated).  True if any model had entries.
        """
        # the pending entries (read once per stream and cursor: the models of a stack share both) and each
        # model's attempt record (cursor, attempts), in one round trip
        # (from the stored state's entry while a restored model re-absorbs the chunks committed after it: _read_from)
        reads = list(dict.fromkeys((self.keys.log(h.tenant, h.stream), _read_from(h)) for h in models))
        pipe = self.r.pipeline(transaction=False)
        for log_key, cursor in reads:
            pipe.xrange(log_key, b"(" + cursor, "+", count=self.s.read_batch)
        for h in models:
            pipe.hmget(quarantine.attempts_key(self.keys, h.tenant, h.name), "cursor", "attempts")
        got = pipe.execute()
        entries = dict(zip(reads, got[: len(reads)], strict=True))
        records_of = dict(zip((h.ref for h in models), got[len(reads) :], strict=True))
        pending = {h.ref: entries[(self.keys.log(h.tenant, h.stream), _read_from(h))] for h in models}
        # a model with an attempt at its current cursor: a worker died while it ran, or it failed and is retried
        suspects = [] if alone else [
            h for h in models
            if pending[h.ref] and records_of[h.ref][0] == h.cursor and int(records_of[h.ref][1] or 0) > 0
        ]  # fmt: skip
        isolated = {h.ref for h in suspects}
        active: list[Held] = []
        starting = [h for h in models if pending[h.ref] and h.ref not in isolated]
        if starting and not self.stop.is_set():
            self.beat_if_due()
            try:  # one attempt counted per model and batch, before its first block, all in one round trip
                errors: list[Exception | None] = self.begin_attempts(starting, [h.cursor for h in starting], "block")
            except Exception as err:  # nothing is known of any attempt (e.g. Redis unavailable: re-raised)
                errors = [err] * len(starting)
            for h, error in zip(starting, errors, strict=True):
                if error is None:
                    active.append(h)
                else:
                    self.failed(h, error)
        active = self._rounds(active, pending)
        if self.stop.is_set():  # stopped between rounds: the attempts not used up are given back
            for h in active:
                with contextlib.suppress(redis.RedisError):
                    self.end_attempt(h)
        for h in suspects:
            if self.stop.is_set():
                break
            if h.ref in self.held and not h.lost:
                self.advance_many([h], alone=True)
        return any(pending.values())

    def _rounds(self, active: list[Held], pending: dict[str, list[Any]]) -> list[Held]:
        """:meth:`advance_many`'s rounds: round ``r`` absorbs the ``r``-th pending entry of each model of ``active``
        that has one (:meth:`absorb_round`; its commits run in Redis during the next round's blocks).  Returns the
        models that committed every round they took part in, the last one's commits read."""
        r = 0
        sent: _Round | None = None  # the last round's commits, written to Redis, replies not read yet
        try:
            while active and not self.stop.is_set():
                batch = [(h, pending[h.ref][r]) for h in active if r < len(pending[h.ref])]
                if not batch:
                    break
                self.beat_if_due()
                # a model with more of its entries read in this batch commits this chunk without its state blob
                # (stored with a later chunk, at least every checkpoint_every: see commit_call)
                defer = {h.ref for h, _ in batch if r + 1 < len(pending[h.ref])}
                sent = self.absorb_round(batch, defer, sent)
                going = set(sent.refs())  # committed, or their commits sent: the models of the next round
                active = [h for h in active if h.ref in going]
                r += 1
            if sent is not None:
                done = set(self.settle_round(sent))
                active = [h for h in active if h.ref in done]
            return active
        finally:  # an exception before the replies were read: read them still (the cursors follow what landed)
            if sent is not None and not sent.settled:
                try:
                    self.settle_round(sent)
                except Exception:
                    sent.drop()  # nothing is known of those commits: the loop rereads its leases (Redis errors)

    def failed(self, h: Held, err: Exception) -> None:
        """Work on ``h`` raised ``err``: a lost lease drops the model (:meth:`lose`), any other model failure
        goes to quarantine (:meth:`model_failed`); Redis outages are re-raised (the loop retries)."""
        if isinstance(err, LeaseLost):
            self.model_failed(h, err)  # gives the attempt back
            if self._raise_lost:
                raise err
            self.lose(h, retried_blocks=err.blocks)
            return
        if not self.model_failed(h, err):
            raise err
        self.leases.drop(h.ref)

    def absorb_round(
        self,
        batch: list[tuple[Held, tuple[bytes, dict[bytes, bytes]]]],
        defer: Collection[str] = (),
        previous: _Round | None = None,
    ) -> _Round:
        """One chunk per model (``(held, (entry_id, fields))``): the chunks' blocks absorbed in stacked
        updates (block ``j`` of every model in one :func:`~workers.segmented.advance_blocks` call: all main
        populations and challengers, grouped by stack key inside), alerts detected, then ONE fenced commit
        per model, sent (:meth:`send_round`): :meth:`settle_round` of the result reads the replies.  ``defer``: refs
        of models whose state blob may be left to a later chunk (:meth:`commit_call`).

        ``previous``: the round before, whose commits were sent and not read yet.  Redis runs them while this round's
        blocks are absorbed (the worker waited for them before: 95 µs of about a millisecond per model-block at 128
        models, ``python bench/worker_costs.py --warm 0``); their replies are read after the blocks and before
        anything else of this round goes to Redis.  A model whose commit did not land (its lease lost, its script
        failed) leaves this round: what it absorbed here is dropped with it (its engine is discarded and restored
        from its checkpoint), nothing of it was committed.

        A model's failure (its NumericalError, an exception of its own) fails that model only.  An exception
        of the stacked call itself (e.g. a block budget overrun, a MemoryError) cannot be attributed: the
        models of that call are restored from their checkpoints (nothing of the chunk was committed) and
        absorb the chunk one at a time, so the failing model fails alone and the others commit the same bits.
        A row's ``seconds`` is the stacked call's wall time divided by the models in it (worker seconds per
        model-block).
        """
        work: list[_Chunk] = []
        failures: list[tuple[Held, Exception]] = []  # applied once ``previous`` is read (they write to Redis)
        chunks = RoundChunks()  # each entry decoded once, validated once per layout, for all its models
        for h, (entry_id, fields) in batch:
            try:
                assert h.engine is not None
                x, y = chunks.get(self.keys.log(h.tenant, h.stream), entry_id, fields, h.engine.family, h.layout())
                first, n, size = h.engine.observations, int(y.shape[0]), h.engine.settings.block_size
                replay = h.replay_from is not None and _entry_id(entry_id) <= _entry_id(h.cursor)
                work.append(_Chunk(h, entry_id, fields, int(fields[b"seq"]), int(fields[b"first_index"]), x, y,
                                   block_bounds(first, n, size), replay=replay))  # fmt: skip
            except Exception as err:
                failures.append((h, err))
        alive = work
        j = 0
        while True:
            group = [c for c in alive if j < len(c.bounds)]
            if not group:
                break
            blocks = []
            for c in group:
                a, b = c.bounds[j]
                blocks.append((rows_between(c.x, a, b), rows_between(c.y, a, b)))
            engines = [c.h.engine for c in group]
            budgets = [c.h.budget for c in group if c.h.budget is not None]
            t0 = time.perf_counter()
            for bud in budgets:
                bud.start()
            try:
                results: list[Any] = advance_blocks(engines, blocks)  # type: ignore[arg-type]
            except Exception as err:
                if len(group) == 1 and len(alive) == 1:
                    results = [err]
                else:  # not attributable: every model of the call redoes its chunk alone (docstring)
                    for bud in budgets:
                        bud.stop()
                    log.warning("worker %s: a stacked update of %d models failed (%s); one at a time",
                                self.id, len(group), err)  # fmt: skip
                    landed = self._landed(previous, failures)  # the restores read what the previous round stored
                    rest = [c for c in alive if c not in group and landed(c.h)]
                    done = self.absorb_alone([c for c in group if landed(c.h)]) + self.finish_all(rest, defer)
                    return _Round(done=done)
            finally:
                for bud in budgets:
                    bud.stop()
            seconds = (time.perf_counter() - t0) / len(group)
            for c, (_, yb), res in zip(group, blocks, results, strict=True):
                if isinstance(res, Exception):
                    failures.append((c.h, res))
                    c.failed = True
                    continue
                a, _ = c.bounds[j]
                row = records.trace_row(res, seq=c.seq, first_index=c.first_index + a,
                                        block_observations=int(yb.shape[0]), seconds=seconds)  # fmt: skip
                row.update(change_fields(c.h.engine))
                c.blocks.append(Block(res, row))
            alive = [c for c in alive if not c.failed]
            j += 1
        running = not self.stop.is_set()
        landed = self._landed(previous, failures)
        if running and self.stop.is_set():  # stopped while the previous round's replies were read: as before the
            # overlap, the worker stops after that round; this round's blocks go uncommitted (the engines with them)
            return _Round(done=[c.h.ref for c in alive if landed(c.h)])
        return self.send_round([c for c in alive if landed(c.h)], defer)

    def _landed(self, previous: _Round | None, failures: list[tuple[Held, Exception]]) -> Callable[[Held], bool]:
        """Read ``previous``'s replies (:meth:`settle_round`), then fail the models of ``failures`` whose previous
        commit landed; returns whether a model's did (every model's without ``previous``).  What this round
        absorbed for a model whose commit did not land is dropped (the model was failed or lost, its engine with it)."""
        done = None if previous is None else set(self.settle_round(previous))

        def landed(h: Held) -> bool:
            return done is None or h.ref in done

        for h, err in failures:
            if landed(h):
                self.failed(h, err)
        return landed

    def absorb_alone(self, group: list[_Chunk]) -> list[str]:
        """The fallback of :meth:`absorb_round`: each model restored from its checkpoint (at the entry before its
        chunk: the chunks before were committed, any whose state was deferred re-absorbed by the restore), then
        its chunk absorbed alone."""
        done = []
        for c in group:
            h, cursor = c.h, c.h.cursor
            try:
                if restore(self.r, self.keys, h) is None:
                    self.leases.drop(h.ref)
                    continue
                self.arm_budget(h)
            except Exception as err:
                self.failed(h, err)
                continue
            if c.replay:  # committed before: the restore above re-absorbed it (and every chunk to the cursor)
                done.append(h.ref)
            elif h.cursor == cursor:  # else the next pass reads from the restored cursor
                done += self.settle_round(self.absorb_round([(h, (c.entry_id, c.fields))]))
        return done

    def finish_all(self, chunks: list[_Chunk], defer: Collection[str] = ()) -> list[str]:
        """:meth:`send_round` then :meth:`settle_round`: the round's commits run while the worker waits."""
        return self.settle_round(self.send_round(chunks, defer))

    def send_round(self, chunks: list[_Chunk], defer: Collection[str] = ()) -> _Round:
        """Alerts and the fenced commits of a round's absorbed chunks, written to Redis on one connection as they are
        staged, :data:`~workers.store.commit.COMMITS_PER_SCRIPT` at a time (:meth:`Scripts.send_commits`: each commit
        fenced by its own model's lease token, run by Redis in order and atomically), so Redis runs the first ones
        while the worker stages the next, and nobody waits for the replies (:meth:`settle_round`).  A model whose
        commit could not be formed fails here (handled)."""
        rnd = _Round()
        for c in [c for c in chunks if c.replay]:
            _replayed(c)
            rnd.done.append(c.h.ref)
        chunks = [c for c in chunks if not c.replay]
        unsent = 0  # staged commits not written yet: every COMMITS_PER_SCRIPT, Redis runs them while more are staged
        try:
            for i, c in enumerate(chunks):
                h = c.h
                try:
                    h.detector, found = detect.detect(
                        h.detector, h.alert_settings(), c.blocks, stream=h.stream, model=h.name
                    )
                    if isinstance(h.engine, SegmentedEngine):  # change_point alerts of the challengers (issue 12)
                        found += [{**a, "stream": h.stream, "model": h.name} for a in h.engine.take_alerts()]
                    rows = [b.row for b in c.blocks]
                    seconds = sum(row["seconds"] for row in rows)
                    due = self.state_due(h, defer, seconds)
                    rnd.staged.append(
                        (c, rows, found, self.commit_call(h, c.entry_id, c.seq, rows, found, with_state=due))
                    )
                    unsent += 1
                except Exception as err:
                    self.failed(h, err)  # a model's failure is handled; a Redis error is raised (below)
                if unsent and (unsent == COMMITS_PER_SCRIPT or i == len(chunks) - 1) and rnd.error is None:
                    try:
                        rnd.sent = self.scripts.send_commits([call for *_, call in rnd.staged[-unsent:]], rnd.sent)
                    except Exception as err:  # nothing is known of any commit (e.g. Redis unavailable: re-raised)
                        rnd.error = err
                    unsent = 0
        except BaseException:
            rnd.drop()  # commits in flight whose replies will not be read: nothing is known of them (the loop rereads)
            raise
        return rnd

    def settle_round(self, rnd: _Round) -> list[str]:
        """The replies of :meth:`send_round`'s commits, then the stream posterior at each count a stream moved to,
        once, from the state the last script that saw that count read.  Returns the refs of the models that
        committed (the others failed or lost their lease, handled), with those of ``rnd.done``."""
        rnd.settled = True
        staged = rnd.staged
        if not staged:
            return rnd.done
        try:
            if rnd.error is not None:
                raise rnd.error
            assert rnd.sent is not None
            replies = self.scripts.commit_replies(rnd.sent)
        except Exception as err:  # nothing is known of any commit (e.g. Redis unavailable: re-raised)
            rnd.drop()
            for c, *_ in staged:
                self.failed(c.h, err)
            return []
        # The stream posterior at each count the round moved through is computed and stored once, from the last
        # state returned at that count (the script returns one per stream and count: the first commit that saw
        # it; every model's row at that count was in place by then).  128 models of a fresh stream cost 128
        # computations and compare-and-sets, all but two in vain, otherwise.
        update_at: dict[tuple[str, str, int], int] = {}
        for i, ((c, *_), reply) in enumerate(zip(staged, replies, strict=True)):
            if isinstance(reply, StreamState):
                update_at[(c.h.tenant, c.h.stream, reply.count)] = i
        updates = set(update_at.values())
        done = list(rnd.done)
        for i, ((c, rows, found, call), reply) in enumerate(zip(staged, replies, strict=True)):
            try:
                if isinstance(reply, LeaseLost):
                    raise LeaseLost(c.h.name, blocks=len(rows)) from reply
                if isinstance(reply, Exception):
                    raise reply
                state = reply if i in updates else None
                ckpt = call["checkpoint"]  # the status it stored: the engine may have absorbed the next round since
                self.committed(c.h, c.entry_id, c.seq, rows, found, state, with_state="state" in ckpt,
                               status=(ckpt["status"], ckpt["error"] or None))  # fmt: skip
            except Exception as err:
                self.failed(c.h, err)
                continue
            OBSERVATIONS.inc(int(c.y.shape[0]))
            for row in rows:
                BLOCK_SECONDS.observe(row["seconds"])
            c.h.load.add(sum(row["seconds"] for row in rows), time.monotonic())  # the cost-weighted shares
            done.append(c.h.ref)
        return done

    def state_due(self, h: Held, defer: Collection[str], seconds: float) -> bool:
        """Whether ``h``'s next commit, of a chunk that took ``seconds`` of engine time, stores its state blob: at
        least every ``checkpoint_every`` chunks, and with the last chunk of a batch (not in ``defer``) once the
        engine seconds since the stored state reach ``checkpoint_seconds``.

        Why: a live feed's small chunks each came with the whole state (every population's particles, velocities,
        anchors and two generator states of 5 kB), most of a light model's commit work: 116 of 517 µs of worker
        CPU per model and chunk at 128 one-component gmm models past their warm-up (``python bench/worker_costs.py
        --warm 100 --per-chunk``).  A restore re-absorbs the chunks committed since from the stream log, bit for
        bit (:func:`workers.worker.restore.catch_up`): at most ``checkpoint_every − 1`` chunks and about
        ``checkpoint_seconds`` of engine time per model (its stacked share: alone a block costs more).  The chunks
        without it store :meth:`~workers.engine.ModelEngine.view_bytes`, so the posterior and predictive
        routes read the particles after every chunk.  The price is a failover's re-absorbing: a new worker restored
        those 128 models in 8.95 ms of CPU each with 8 chunks to re-absorb, stacked in its rounds (:meth:`load_many`),
        against 7.1 ms with the state stored every chunk, and 23.4 ms re-absorbing each model alone
        (``python bench/worker_costs.py --warm 100 --per-chunk --restore``); ``checkpoint_every`` bounds it."""
        if h.unsaved + 1 >= self.s.checkpoint_every:
            return True
        return h.ref not in defer and h.unsaved_seconds + seconds >= self.s.checkpoint_seconds

    def commit_call(
        self, h: Held, cursor: bytes, seq: int, rows: list[dict], found: list[dict], *, with_state: bool = True
    ) -> dict[str, Any]:
        """The arguments of :meth:`Scripts.commit` for ``h``'s chunk ``seq`` ending at entry ``cursor``.

        Without ``with_state`` the checkpoint's engine state (``state``, ``changepoint``: the particle
        populations: most of a small model's commit work) is left as stored, at ``state_cursor``, and everything
        else moves to ``cursor`` as always: the chunk is committed exactly once (its rows, events, alerts,
        detector, counters), and a restore re-absorbs the chunks after ``state_cursor`` from the stream log,
        bit for bit (:func:`workers.worker.restore.restore`); ``view`` then holds the posterior's particles after
        the chunk (:meth:`~workers.engine.ModelEngine.view_bytes`, empty when the state is current).  When the
        state is due: :meth:`state_due`.
        """
        eng = h.engine
        assert eng is not None
        blocks = [json.dumps(records.block_of(row)) for row in rows]  # each block's last_block body, encoded once
        ckpt: dict[str, Any] = {
            "cursor": cursor,
            "chunks": seq,
            "observations": eng.observations,
            "log_evidence": repr(eng.log_evidence),
            "log_evidence_se": repr(eng.log_evidence_se),
            "detector": detect.state_json(h.detector, h.detector_text),
            "last_block": blocks[-1] if rows else "",
            # the sampler could not certify its value (workers.conflict, the annealing guard): degraded + reason
            "status": "degraded" if getattr(eng, "degraded", None) else "ok",
            "error": getattr(eng, "degraded", None) or "",
        }
        if with_state:
            ckpt["state"] = eng.to_bytes(include_history=False)
            ckpt["state_cursor"] = cursor
            ckpt["view"] = ""  # the readers take the state
            if isinstance(eng, SegmentedEngine):  # challengers and segment bookkeeping (issue 12)
                ckpt["changepoint"] = eng.changepoint_bytes()
        else:  # the posterior's particles after this chunk, for the posterior and predictive routes
            ckpt["view"] = eng.view_bytes()
        # the evidence event after each block: the chunk counts as processed with its last block
        events = []
        for i, (row, block) in enumerate(zip(rows, blocks, strict=True)):
            chunks = seq if i == len(rows) - 1 else seq - 1
            events.append((chunks, records.evidence_event_head(h.name, h.stream, row, chunks, block)))
        return {
            "tenant": h.tenant,
            "model": h.name,
            "stream": h.stream,
            "token": h.token,
            "ttl_ms": self.leases.ttl_ms,
            "checkpoint": ckpt,
            "rows": rows,
            "events": events,
            "alerts": [detect.alert_record(a) for a in found],
            "observations": eng.observations,
            "known": self.posteriors.known(h) if rows else None,
        }

    def committed(
        self,
        h: Held,
        cursor: bytes,
        seq: int,
        rows: list[dict],
        found: list[dict],
        state: StreamState | None,
        *,
        with_state: bool,
        status: CommittedStatus | None = None,
    ) -> None:
        """After ``h``'s commit: its cursor, the alert counters, the stream posterior when the count moved.
        ``status``: the ``(status, error)`` the commit stored (None: the engine's now)."""
        h.cursor, h.chunks = cursor, seq
        h.unsaved = 0 if with_state else h.unsaved + 1
        h.unsaved_seconds = 0.0 if with_state else h.unsaved_seconds + sum(row["seconds"] for row in rows)
        for a in found:
            ALERTS.labels(a["kind"]).inc()
        self.update_stream_posterior(h, state, rows, status=status)

    def update_stream_posterior(
        self,
        h: Held,
        state: StreamState | None,
        rows: list[dict[str, Any]],
        *,
        status: CommittedStatus | None = None,
    ) -> None:
        """:meth:`StreamPosteriors.update` (a method of the worker so that a test can make it fail)."""
        self.posteriors.update(h, state, rows, status=status)

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
                    pipe.zadd(k.stream_obs(t, h.stream), {h.name: "+inf"})  # out of the common count
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


@dataclass(eq=False)
class _Round:
    """A round's commits (:meth:`Worker.send_round`) until their replies are read (:meth:`Worker.settle_round`)."""

    # refs settled already: replayed chunks, a fallback's synchronous commits; on a stop (Worker.absorb_round), the
    # models whose previous commit landed, this round's blocks dropped
    done: list[str] = field(default_factory=list)
    # (chunk, its trace rows, its alerts, its commit call) per commit sent
    staged: list[tuple[_Chunk, list[dict], list[dict], dict[str, Any]]] = field(default_factory=list)
    sent: SentCommits | None = None
    error: Exception | None = None  # sending failed: nothing is known of any commit
    settled: bool = False  # Worker.settle_round ran (or began)

    def refs(self) -> list[str]:
        """The models that committed in this round or whose commits were sent."""
        return self.done + [c.h.ref for c, *_ in self.staged]

    def drop(self) -> None:
        """Close the connection of replies never to be read (:meth:`workers.store.scripts.Sent.drop`)."""
        if self.sent is not None:
            self.sent.sent.drop()


@dataclass(eq=False)
class _Chunk:
    """One model's chunk in :meth:`Worker.absorb_round`: the entry, its values and block bounds, the blocks done."""

    h: Held
    entry_id: bytes
    fields: dict[bytes, bytes]
    seq: int
    first_index: int
    x: Any
    y: Any
    bounds: list[tuple[int, int]]
    blocks: list[Block] = field(default_factory=list)
    failed: bool = False
    replay: bool = False  # committed before: re-absorbed after a restore, not committed again (_replayed)


def _read_from(h: Held) -> bytes:
    """The stream-log entry after which ``h``'s next chunks are read: its cursor, or while a restored model still
    re-absorbs the chunks committed after its stored state, the last of them it absorbed."""
    return h.cursor if h.replay_from is None else h.replay_from


def _replayed(c: _Chunk) -> None:
    """After a chunk committed before and re-absorbed (:func:`workers.worker.restore.restore` with ``catch_up_now``
    false, then the rounds): nothing is committed again (its rows, events, alerts and detector update were), the
    model counts one more chunk since its stored state, and reads on from it."""
    h = c.h
    h.unsaved += 1
    h.replay_from = None if c.entry_id == h.cursor else c.entry_id
    if isinstance(h.engine, SegmentedEngine):
        h.engine.take_alerts()  # its change-point alerts were committed with the chunk


def _entry_id(entry: bytes) -> tuple[int, int]:
    ms, _, n = entry.partition(b"-")
    return int(ms), int(n or 0)
