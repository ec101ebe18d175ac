"""Live events of a stream over a WebSocket, and chunks sent over the same socket (API.md "Live events")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

from fastapi import APIRouter, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from service.deps import SettingsDep, websocket_tenant
from service.errors import http_error
from service.routes.chunks import accept_chunk
from service.schemas import NAME_PATTERN, ChunkIn
from workers.store import reads as store
from workers.store.errors import StoreError
from workers.store.keys import Keys

router = APIRouter(prefix="/v1", tags=["events"])


@router.websocket("/streams/{stream}/events")
async def stream_events(websocket: WebSocket, stream: str, settings: SettingsDep) -> None:
    """Relay the stream's events (``evidence``, ``alert``, ``posterior``); accept ``{"type": "chunk", ...}``
    messages and reply ``{"type": "ack", ...}`` (or ``{"type": "error", "status", "detail"}``).

    The handshake is refused with 401 (missing/wrong key) or 404 (no such stream in the tenant).
    """
    tenant = websocket_tenant(websocket, settings)
    if tenant is None:
        await websocket.send_denial_response(JSONResponse({"detail": "missing or invalid API key"}, 401))
        return
    r, keys = websocket.app.state.redis, Keys(settings.key_prefix)
    if not re.match(NAME_PATTERN, stream) or not await store.stream_exists(r, keys, tenant, stream):
        await websocket.send_denial_response(JSONResponse({"detail": f"stream {stream!r} not found"}, 404))
        return
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.events(tenant, stream))
    await websocket.accept()
    lock = asyncio.Lock()

    async def send(text: str) -> None:
        async with lock:
            await websocket.send_text(text)

    async def relay() -> None:
        while True:
            msg = await pubsub.get_message(timeout=1.0)
            if msg is not None and msg["type"] == "message":
                data = msg["data"]
                await send(data.decode() if isinstance(data, bytes) else data)

    relay_task = asyncio.create_task(relay())
    try:
        while True:
            try:
                message = await websocket.receive_json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                await send(json.dumps({"type": "error", "status": 400, "detail": "messages must be JSON objects"}))
                continue
            if not isinstance(message, dict) or message.get("type") != "chunk":
                await send(json.dumps({"type": "error", "status": 422, "detail": 'expected {"type": "chunk", ...}'}))
                continue
            try:
                body = ChunkIn.model_validate({k: v for k, v in message.items() if k != "type"})
                ack = await accept_chunk(r, keys, settings, tenant, stream, body)
                await send(json.dumps({"type": "ack", **ack}))
            except ValidationError as err:
                detail = [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in err.errors()]
                await send(json.dumps({"type": "error", "status": 422, "detail": detail}, default=str))
            except (HTTPException, StoreError) as err:
                if isinstance(err, StoreError):
                    err = http_error(err)
                await send(json.dumps({"type": "error", "status": err.status_code, "detail": err.detail}))
    except WebSocketDisconnect:
        pass
    finally:
        relay_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await relay_task
        with contextlib.suppress(Exception):
            await pubsub.aclose()
