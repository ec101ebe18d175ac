"""Restore a freshly leased model: its config, and its engine from the checkpoint (the history rebuilt
by replaying the stream log up to the cursor, DESIGN.md §2) or a new engine.

The checkpoint's engine state may be a few chunks behind its cursor (:meth:`workers.worker.loop.Worker.state_due`):
those chunks are re-absorbed from the stream log as the worker absorbed them (the same blocks; here by
:func:`~workers.worker.blocks.absorb_chunk`, or in the worker's stacked rounds), so the engine ends bit for bit
where it was when the cursor moved; their rows, events and alerts were committed then and are not repeated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import redis

from workers import alerts as detector_lib
from workers.engine import ModelEngine
from workers.segmented import SegmentedEngine
from workers.stacking import init_states
from workers.store import records
from workers.store.keys import Keys
from workers.worker.blocks import absorb_chunk
from workers.worker.leases import Held


def restore(r: redis.Redis, keys: Keys, h: Held, *, catch_up_now: bool = True) -> bool | None:
    """Fill ``h`` (config, engine, cursor, chunk count, detector state) from Redis.

    The engine is at the checkpoint's stored state, which may be behind its cursor; ``catch_up_now`` re-absorbs the
    chunks between (:func:`catch_up`), else ``h.replay_from`` says where the caller's rounds read from to re-absorb
    them (:meth:`workers.worker.loop.Worker.absorb_round`: stacked with the other models' work; a new worker
    restoring 128 models with 8 such chunks each spent 8.95 ms of CPU per model so, 23.4 ms one at a time).

    Returns None when the model is gone, True when it was restored from a checkpoint, False when it is
    new (a fresh engine at the start of the stream: the caller commits its initial checkpoint).

    Raises
    ------
    ValueError
        A checkpoint or model config the engine cannot restore.
    """
    pipe = r.pipeline(transaction=False)
    pipe.get(keys.model(h.tenant, h.name))
    pipe.hgetall(keys.checkpoint(h.tenant, h.name))
    raw, ckpt = pipe.execute()
    return restore_from(r, keys, h, None if raw is None else json.loads(raw), ckpt, catch_up_now=catch_up_now)


def restore_from(
    r: redis.Redis,
    keys: Keys,
    h: Held,
    cfg: dict[str, Any] | None,
    ckpt: dict[bytes, bytes],
    *,
    catch_up_now: bool = True,
    fresh: SegmentedEngine | Exception | None = None,
) -> bool | None:
    """:func:`restore` from the model's config ``cfg`` (parsed; None: the model is gone) and checkpoint hash ``ckpt``
    read by the caller (:meth:`workers.worker.loop.Worker.load_many` reads every leased model's in one round trip).
    ``fresh``: the model's new engine (or the exception its creation raised) if the caller built it
    (:func:`fresh_engines`), used when the checkpoint holds no state.  Returns and raises as :func:`restore`; Redis
    is read only to replay the stream log."""
    if cfg is None:
        return None
    h.cfg = cfg
    if b"state" in ckpt:
        h.cursor, h.chunks = ckpt[b"cursor"], int(ckpt[b"chunks"])
        h.detector = json.loads(ckpt[b"detector"])
        at = ckpt.get(b"state_cursor", h.cursor)  # absent before deferred states: the state is at the cursor
        # the main engine plus its change-point challengers (field absent in older checkpoints; issue 12)
        h.engine = SegmentedEngine.restore(
            ckpt[b"state"], ckpt.get(b"changepoint"), changepoint_settings(h.cfg), lambda: replay(r, keys, h, at)
        )
        h.replay_from = None
        if catch_up_now:
            h.unsaved = catch_up(r, keys, h, at)
        else:
            h.unsaved, h.replay_from = 0, (None if at == h.cursor else at)
        return True
    if isinstance(fresh, Exception):
        raise fresh
    h.engine = fresh or SegmentedEngine.create(
        h.cfg["family"], h.cfg["params"], h.cfg["sampler"], changepoint_settings(h.cfg)
    )
    h.cursor, h.chunks, h.detector = b"0-0", 0, detector_lib.initial_state()
    return False


def fresh_engines(cfgs: list[dict[str, Any]]) -> list[SegmentedEngine | Exception]:
    """New engines of the model configs ``cfgs`` (``SegmentedEngine.create`` of each), their populations' prior draws
    taken by one :func:`workers.stacking.init_states` call: each engine bit for bit the one it gets alone (its draws
    from its own generator).  Per config its engine, or the exception creating it raised (a config the engine
    refuses: ``ValueError``; prior draws that are not finite: :class:`workers.sgais.NumericalError`).

    Why: built one at a time, the engines were about a third of the 4 ms of worker CPU that loading one of 128 freshly
    registered models took (py-spy of the worker; bench/README.md, session 40), and most of what remained once the
    round trips were batched: a 50-particle state is mostly per-call overhead."""
    out: list[SegmentedEngine | Exception] = []
    for cfg in cfgs:
        try:
            main = ModelEngine(cfg["family"], cfg["params"], cfg["sampler"], _init_state=False)
            out.append(SegmentedEngine(main, changepoint_settings(cfg)))
        except Exception as err:
            out.append(err)
    made = [(i, e.main) for i, e in enumerate(out) if isinstance(e, SegmentedEngine)]
    states = init_states([(m.generator, m.family, m.settings) for _, m in made])
    for (i, main), st in zip(made, states, strict=True):
        if isinstance(st, Exception):
            out[i] = st
        else:
            main.state = st
    return out


def replay(r: redis.Redis, keys: Keys, h: Held, end: bytes, page: int = 256) -> Iterator[tuple[Any, Any]]:
    """The stream's chunks from the start up to entry ``end`` (included), as ``(x, y)`` tensors."""
    start: str | bytes = "-"
    key = keys.log(h.tenant, h.stream)
    while True:
        entries = r.xrange(key, start, end, count=page)
        for _, fields in entries:
            yield records.decode_chunk(fields)
        if len(entries) < page:
            return
        start = b"(" + entries[-1][0]


def catch_up(r: redis.Redis, keys: Keys, h: Held, state_cursor: bytes) -> int:
    """Re-absorb the committed chunks after ``state_cursor`` up to ``h.cursor`` into ``h.engine`` through the
    worker's own chunk path (:func:`workers.worker.blocks.absorb_chunk`: the same blocks; a model's bits do not
    depend on the stack it ran in), dropping the rows and alerts they give (committed with their chunks).
    Returns the number of chunks.

    Raises
    ------
    workers.sgais.NumericalError, ValueError
        A chunk the engine absorbed when it was committed fails now (the replay diverged).
    """
    if state_cursor == h.cursor:
        return 0
    assert h.engine is not None
    entries = r.xrange(keys.log(h.tenant, h.stream), b"(" + state_cursor, h.cursor)
    for _, fields in entries:
        x, y = records.decode_chunk(fields)
        absorb_chunk(h.engine, x, y, seq=int(fields[b"seq"]), first_index=int(fields[b"first_index"]))
    if isinstance(h.engine, SegmentedEngine):
        h.engine.take_alerts()
    return len(entries)


def changepoint_settings(cfg: dict[str, Any]) -> Any:
    """The model's change-point settings (``alerts.change_point``, issue 12)."""
    return detector_lib.AlertSettings(**cfg.get("alerts", {})).change_point
