"""Live events of a stream over a WebSocket, and chunks sent over the same socket (API.md "Live events").

Events come from the process's shared subscription (:mod:`service.events_hub`): a socket holds no Redis
connection and a socket that reads too slowly gets ``gap`` events instead of the events it missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

from fastapi import APIRouter, FastAPI, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import RedisError

from service.bodies import LARGE_BODY_BYTES
from service.deps import SettingsDep, websocket_tenant
from service.errors import http_error
from service.events_hub import EventHub, Subscriber
from service.routes.chunks import accept_chunk, accept_chunk_text
from service.schemas import NAME_PATTERN, ChunkIn
from service.unavailable import unavailable_response
from workers.store import reads as store
from workers.store.errors import StoreError
from workers.store.keys import Keys

router = APIRouter(prefix="/v1", tags=["events"])
log = logging.getLogger("sgais.events")


def event_hub(app: FastAPI) -> EventHub:
    """The app's shared subscription (created with the first socket)."""
    hub = getattr(app.state, "event_hub", None)
    if hub is None:
        hub = app.state.event_hub = EventHub(app.state.redis)
    return hub


async def close_hub(app: FastAPI) -> None:
    """Stop the shared subscription (the app's lifespan calls this at shutdown)."""
    hub = getattr(app.state, "event_hub", None)
    if hub is not None:
        app.state.event_hub = None
        await hub.close()


def _error(status: int, detail) -> str:
    return json.dumps({"type": "error", "status": status, "detail": detail}, default=str)


async def _reply(text: str, r, keys: Keys, settings, tenant: str, stream: str) -> str:
    """The reply to one text message: an ack, or an error with its HTTP status.  Messages over 1 MiB are
    parsed off the event loop, in the chunk-parsing process (:func:`accept_chunk_text`)."""
    if len(text) > LARGE_BODY_BYTES:
        try:
            return json.dumps({"type": "ack", **await accept_chunk_text(r, keys, settings, tenant, stream, text, True)})
        except (HTTPException, StoreError) as err:
            err = http_error(err) if isinstance(err, StoreError) else err
            return _error(err.status_code, err.detail)
        except (RedisError, OSError):
            return _error(503, "storage unavailable, retry later")
    try:
        data = json.loads(text)
    except ValueError:
        return _error(400, "messages must be JSON objects")
    if not isinstance(data, dict) or data.get("type") != "chunk":
        return _error(422, 'expected {"type": "chunk", ...}')
    try:
        body = ChunkIn.model_validate({k: v for k, v in data.items() if k != "type"})
        ack = await accept_chunk(r, keys, settings, tenant, stream, body)
        return json.dumps({"type": "ack", **ack})
    except ValidationError as err:
        detail = [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in err.errors()]
        return _error(422, detail)
    except (HTTPException, StoreError) as err:
        err = http_error(err) if isinstance(err, StoreError) else err
        return _error(err.status_code, err.detail)
    except (RedisError, OSError):
        return _error(503, "storage unavailable, retry later")
    except Exception:  # noqa: BLE001 - one bad message must not drop the socket
        log.exception("websocket chunk failed")
        return _error(500, "internal error")


@router.websocket("/streams/{stream}/events")
async def stream_events(websocket: WebSocket, stream: str, settings: SettingsDep) -> None:
    """Relay the stream's events (``evidence``, ``alert``, ``posterior``, ``gap``); accept
    ``{"type": "chunk", ...}`` messages and reply ``{"type": "ack", ...}`` (or ``{"type": "error",
    "status", "detail"}``; binary frames get a 400 error, the socket stays open).

    The handshake is refused with 401 (missing/wrong key), 404 (no such stream in the tenant) or 503
    (Redis unavailable).
    """
    tenant = websocket_tenant(websocket, settings)
    if tenant is None:
        await websocket.send_denial_response(JSONResponse({"detail": "missing or invalid API key"}, 401))
        return
    r, keys = websocket.app.state.redis, Keys(settings.key_prefix)
    hub, sub, channel = event_hub(websocket.app), Subscriber(settings.ws_queue_size), keys.events(tenant, stream)
    try:
        if not re.match(NAME_PATTERN, stream) or not await store.stream_exists(r, keys, tenant, stream):
            await websocket.send_denial_response(JSONResponse({"detail": f"stream {stream!r} not found"}, 404))
            return
        await hub.subscribe(channel, sub)
    except (RedisError, OSError):
        await websocket.send_denial_response(unavailable_response())
        return
    try:
        await websocket.accept()
    except BaseException:
        await hub.unsubscribe(channel, sub)
        raise
    lock = asyncio.Lock()

    async def send(text: str) -> None:
        async with lock:
            await websocket.send_text(text)

    async def pump() -> None:
        while True:
            for text in await sub.next_texts():
                await send(text)

    pump_task = asyncio.create_task(pump())
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("text") is None:
                await send(_error(400, "binary frames are not supported: send JSON text messages"))
                continue
            await send(await _reply(message["text"], r, keys, settings, tenant, stream))
    except WebSocketDisconnect:
        pass
    finally:
        pump_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump_task
        await hub.unsubscribe(channel, sub)
