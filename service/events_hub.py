"""One Redis subscription per API process, shared by every WebSocket (API.md "Live events", issue 11).

Each socket used to hold its own pub/sub connection from the app's Redis pool: 100 idle sockets exhausted
the pool and every HTTP request of every tenant was a 500 (hardening review F2), and a slow reader lost
events silently (F9).  Now:

- :class:`EventHub` owns one pub/sub connection, opened lazily with the first socket, and a reader task
  that subscribes to a stream's channel while at least one socket follows it (reference counted).
  Idle sockets hold no Redis connection.
- Each socket is a :class:`Subscriber` with a bounded queue (``SGAIS_WS_QUEUE_SIZE``).  The reader
  never waits for a socket: when a queue is full, its queued events and the new one are replaced by a
  ``gap`` marker, and the socket is sent ``{"type": "gap", "model", "since_index"}`` per model instead of
  the events it missed; the client resyncs from ``GET /v1/models/{model}/trace?since_index=...``.
  ``since_index`` is the ``first_index`` of the first missed block of that model (for a missed event
  without a block, the observations of the last block the hub saw); ``model`` is null for missed
  stream-level events (``posterior``: re-read ``GET /v1/streams/{stream}/posterior``).
- When the subscription's connection is lost (Redis restarted), every socket gets gaps for the models
  the hub has seen on its stream, since their last seen observation count, and the hub re-subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger("sgais.events")
_GAP = object()


def event_position(event: dict[str, Any]) -> tuple[str | None, int | None, int | None]:
    """``(model, since_index if missed, observations after it)`` of an event body."""
    model = event.get("model")
    block = event.get("last_block")
    if isinstance(block, dict) and "first_index" in block:
        return model, int(block["first_index"]), event.get("observations")
    if event.get("type") == "posterior":
        return None, event.get("observations"), None
    return model, None, None


class Subscriber:
    """One socket's bounded queue of event texts, with the gaps it has to be told about."""

    def __init__(self, size: int):
        self.queue: asyncio.Queue[Any] = asyncio.Queue(size)
        self.gaps: dict[str | None, int | None] = {}
        self.dropped = 0

    def offer(self, text: str, model: str | None, since: int | None) -> None:
        """Queue an event; on overflow turn everything queued, and this event, into gaps."""
        try:
            self.queue.put_nowait((text, model, since))
            return
        except asyncio.QueueFull:
            pass
        missed = [(text, model, since)]
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item is not _GAP:
                missed.append(item)
        for _, m, s in missed:
            self.note_gap(m, s)
        self.dropped += len(missed)
        self.queue.put_nowait(_GAP)

    def note_gap(self, model: str | None, since: int | None) -> None:
        if model not in self.gaps or self.gaps[model] is None:
            self.gaps[model] = since
        elif since is not None:
            self.gaps[model] = min(self.gaps[model], since)  # type: ignore[type-var]

    def lost(self, seen: dict[str, int]) -> None:
        """The subscription was interrupted: every model may have missed events since ``seen``."""
        for model, observations in seen.items():
            self.note_gap(model, observations)
        self.note_gap(None, None)
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(_GAP)

    def take_gaps(self) -> list[dict[str, Any]]:
        gaps, self.gaps = self.gaps, {}
        return [{"type": "gap", "model": m, "since_index": s} for m, s in gaps.items()]

    async def next_texts(self) -> list[str]:
        """Wait for the next event (or gap events) to send, as JSON texts."""
        item = await self.queue.get()
        if item is _GAP:
            return [json.dumps(g) for g in self.take_gaps()]
        return [item[0]]


class EventHub:
    """The process's shared pub/sub subscription and its reader task (started lazily)."""

    def __init__(self, r: aioredis.Redis):
        self.r = r
        self.pubsub: Any = None
        self.task: asyncio.Task | None = None
        self.subscribers: dict[str, set[Subscriber]] = {}
        self.seen: dict[str, dict[str, int]] = {}  # channel -> model -> observations of its last block
        self.lock = asyncio.Lock()
        self.followed = asyncio.Event()  # set while some socket follows a channel: the reader waits on it

    async def subscribe(self, channel: str, sub: Subscriber) -> None:
        """Follow ``channel``; raises a Redis error when the subscription cannot be made."""
        async with self.lock:
            if self.pubsub is None:
                self.pubsub = self.r.pubsub(ignore_subscribe_messages=True)
            subs = self.subscribers.setdefault(channel, set())
            if not subs:
                try:
                    await self.pubsub.subscribe(channel)
                except BaseException:
                    del self.subscribers[channel]
                    raise
            subs.add(sub)
            self.followed.set()
            if self.task is None or self.task.done():
                self.task = asyncio.create_task(self._read(), name="sgais-event-hub")

    async def unsubscribe(self, channel: str, sub: Subscriber) -> None:
        async with self.lock:
            subs = self.subscribers.get(channel)
            if subs is None:
                return
            subs.discard(sub)
            if not subs:
                del self.subscribers[channel]
                self.seen.pop(channel, None)
                with contextlib.suppress(RedisError, OSError):
                    await self.pubsub.unsubscribe(channel)

    def dispatch(self, channel: str, text: str) -> None:
        subs = self.subscribers.get(channel)
        if not subs:
            return
        try:
            event = json.loads(text)
            model, since, observations = event_position(event)
        except (ValueError, TypeError, AttributeError):
            model, since, observations = None, None, None
        if model is not None and observations is not None:
            self.seen.setdefault(channel, {})[model] = int(observations)
        for sub in list(subs):
            sub.offer(text, model, since)

    async def _read(self) -> None:
        while True:
            if not self.subscribers:
                # no socket follows any channel: wait for one (a fixed sleep here held a new socket's first
                # events back by up to its length, then sent them in a burst)
                self.followed.clear()
                await self.followed.wait()
                continue
            try:
                msg = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (RedisError, OSError) as err:
                log.warning("event subscription lost (%s); re-subscribing", err)
                for channel, subs in list(self.subscribers.items()):
                    for sub in subs:
                        sub.lost(self.seen.get(channel, {}))
                await asyncio.sleep(1.0)
                with contextlib.suppress(RedisError, OSError):
                    await self.pubsub.connect()  # re-subscribes every channel (redis-py on_connect)
                continue
            if msg is not None and msg.get("type") == "message":
                data = msg["data"]
                self.dispatch(msg["channel"], data.decode() if isinstance(data, bytes) else data)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.pubsub is not None:
            with contextlib.suppress(Exception):
                await self.pubsub.aclose()
