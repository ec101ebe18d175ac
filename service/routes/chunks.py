"""Chunks: validate with the stream's family, append to the stream log (API.md "Chunks")."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import lru_cache
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from prometheus_client import Counter
from pydantic import ValidationError

from models import Family, ObservationError, make_family
from service import quotas
from service.bodies import FLOAT_MAX, LARGE_BODY_BYTES, pydantic_422, read_body
from service.deps import KeysDep, RedisDep, SettingsDep, TenantDep
from service.schemas import (
    BODY_RESPONSES,
    ERROR_RESPONSES,
    NOT_FOUND,
    TOO_MANY,
    ChunkAck,
    ChunkIn,
    Name,
    SocketChunkIn,
    StreamOut,
)
from workers import screening
from workers.config import Settings
from workers.store import reads as store
from workers.store import records
from workers.store.keys import Keys

router = APIRouter(prefix="/v1", tags=["chunks"], responses={**ERROR_RESPONSES, **NOT_FOUND})

CHUNKS_INGESTED = Counter("sgais_chunks_ingested_total", "chunks appended to stream logs")
OBSERVATIONS_INGESTED = Counter("sgais_observations_ingested_total", "observations appended to stream logs")
_INLINE_ROWS = 5000  # larger chunks are validated in a thread so the event loop keeps serving


@lru_cache(maxsize=256)
def stream_family(family: str, params_json: str) -> Family:
    return make_family(family, json.loads(params_json))


def observation_422(err: ObservationError) -> HTTPException:
    loc: list[Any] = ["body", err.field] + ([err.row] if err.row is not None else [])
    return HTTPException(
        status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": loc, "msg": str(err), "type": "observation_error"}]
    )


def _parse_chunk(text: str, model: type[ChunkIn] = ChunkIn) -> ChunkIn:
    try:
        return model.model_validate_json(text)
    except ValidationError as err:
        raise pydantic_422(err, "body") from None


async def chunk_text(request: Request, settings: SettingsDep) -> str:
    """The request body as text, checked before parsing (``service/bodies.py``: 415 not JSON, 413 over
    ``SGAIS_MAX_BODY_BYTES`` counted while reading, 400 not UTF-8); :func:`accept_chunk_text` parses it.

    pydantic's JSON parser is used rather than FastAPI's body handling, which runs ``json.loads`` first
    (1.6 ms for a 500 x 5 chunk on this machine, against 0.3 ms for ``model_validate_json``:
    ``bench/README.md``, "Service overhead").  Errors keep FastAPI's 422 shape, ``loc`` starting with ``"body"``.
    """
    return await read_body(request, settings.max_body_bytes)


ChunkText = Annotated[str, Depends(chunk_text)]
_chunk_openapi = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": ChunkIn.model_json_schema(ref_template="#/components/schemas/{model}")}
        },
    }
}


def _overflow_row(values: Any) -> int | None:
    """First row of a JSON list (of lists) holding an integer beyond the float range."""
    if not isinstance(values, list):
        return None
    for i, row in enumerate(values):
        items = row if isinstance(row, list) else [row]
        if any(type(v) is int and abs(v) > FLOAT_MAX for v in items):
            return i
    return None


def validate_chunk(family: Family, body: ChunkIn, configs: list[dict[str, Any]] | screening.Plan) -> tuple[Any, Any]:
    """The chunk validated by the stream's schema, then screened by each of the stream's models
    (:mod:`workers.screening`: a row whose log-likelihood is not finite is refused).

    Raises ObservationError naming the field, the row and the reason.
    """
    try:
        x, y = family.validate_stream(body.x, body.y)  # every x column: models may use subsets (features)
    except (OverflowError, TypeError, RuntimeError):
        for field, values in (("y", body.y), ("x", body.x)):
            row = _overflow_row(values)
            if row is not None:
                raise ObservationError(field, "integer beyond the float range", row=row) from None
        raise ObservationError("y", "values could not be read as numbers") from None
    worst = screening.first_nonfinite_row_among(configs, x, y)
    if worst is not None:
        raise ObservationError("y", worst[1], row=worst[0])
    return x, y


#: Each stream's screening plan (its models' configs parsed, their probes grouped: :func:`workers.screening.plan`) by
#: ``(prefix, tenant, stream)``, with the stream's ``models_etag`` and model names it was made for
#: (:data:`workers.store.reads.MODELS_ETAG`): a chunk of a stream whose models did not change reads no config.
_plans: OrderedDict[tuple[str, str, str], tuple[str, list[str], screening.Plan]] = OrderedDict()
_PLANS_SIZE = 1024


async def stream_configs(r, keys: Keys, tenant: str, stream: str) -> tuple[dict[str, str], screening.Plan, int]:
    """The stream's meta hash, its models' screening plan (:func:`workers.screening.plan`, ``configs`` in name
    order) and how many of them are not in ``error`` (404 when the stream does not exist).

    Why kept: a chunk used to read, parse and key every model's config, and read every model's status: a chunk POST
    to a stream of 1,000 models took 45-47 ms, 41-43 of them the API's CPU (``python bench/api_scaling.py``; in
    process, about 40 ms reading the configs and statuses and 9 ms screening).  The plan is kept while the stream's
    ``models_etag`` and model names are those it was made for (a model created or deleted changes the token), and the
    count of active models comes from the stream's sorted set of observation counts (errored models at ``+inf``:
    ``lua/commit.lua``), one ``ZCOUNT``; a stream without the token (written before it) or whose set lacks a model
    reads them as before."""
    meta, names = await store.stream_meta(r, keys, tenant, stream)
    if not names:
        return meta, screening.Plan([], []), 0
    etag, key = meta.get(store.MODELS_ETAG), (keys.prefix, tenant, stream)
    hit = _plans.get(key)
    kept = hit[2] if hit is not None and etag is not None and hit[0] == etag and hit[1] == names else None
    obs = keys.stream_obs(tenant, stream)
    pipe = r.pipeline(transaction=False)
    if kept is None:
        pipe.mget([keys.model(tenant, m) for m in names])
    pipe.zcard(obs)
    pipe.zcount(obs, "-inf", "(+inf")
    *raws, held, active = await pipe.execute()
    if kept is None:
        kept = screening.plan([json.loads(raw) for raw in raws[0] if raw is not None])
        if etag is not None:
            _plans[key] = (etag, names, kept)
            _plans.move_to_end(key)
            while len(_plans) > _PLANS_SIZE:
                _plans.popitem(last=False)
    if held != len(names):  # the sorted set lacks a model: each model's status, read
        pipe = r.pipeline(transaction=False)
        for cfg in kept.configs:
            pipe.hget(keys.checkpoint(tenant, cfg["name"]), "status")
        active = sum(1 for st in await pipe.execute() if st != "error")
    return meta, kept, int(active)


async def accept_chunk(r, keys: Keys, settings: Settings, tenant: str, stream: str, body: ChunkIn) -> dict[str, Any]:
    """Validate ``body`` fully with the stream's family and models, then append it atomically; the ack body.

    Raises HTTPException 404 (no stream), 413 (too many observations), 422 (invalid values, or values
    whose log-likelihood is not finite under one of the stream's models), 429 (tenant's backlog over its
    quota), 409 (seq).
    """
    n = len(body.y)
    if n > settings.max_chunk_observations:
        raise _too_many_observations(n, settings)
    meta, configs, active = await stream_configs(r, keys, tenant, stream)
    family = stream_family(meta["family"], meta["params"])
    try:
        if n > _INLINE_ROWS:
            x, y = await run_in_threadpool(validate_chunk, family, body, configs)
        else:
            x, y = validate_chunk(family, body, configs)
    except ObservationError as err:
        raise observation_422(err) from None
    return await store_chunk(r, keys, settings, tenant, stream, body.seq, records.encode_chunk(x, y), active)


def _too_many_observations(n: int, settings: Settings) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        f"y: {n} observations exceed SGAIS_MAX_CHUNK_OBSERVATIONS={settings.max_chunk_observations}",
    )


async def store_chunk(
    r, keys: Keys, settings: Settings, tenant: str, stream: str, seq: int | None, chunk: dict[str, Any], active: int
) -> dict[str, Any]:
    """Quota check, then the atomic append of a validated, encoded chunk; the ack body."""
    n = int(json.loads(chunk["y_shape"])[0])
    await quotas.check_chunk_quota(r, keys, settings, tenant, active, n)
    ack = await store.ingest(r, keys, tenant, stream, seq, chunk, n)
    if not ack["duplicate"]:
        CHUNKS_INGESTED.inc()
        OBSERVATIONS_INGESTED.inc(ack["n_observations"])
        quotas.accepted(keys, tenant, active, ack["n_observations"])
    return ack


def validate_encoded(
    text: str,
    family: str,
    params_json: str,
    configs: list[dict[str, Any]] | screening.Plan,
    max_observations: int,
    socket: bool = False,
) -> tuple[Any, ...]:
    """Parse, validate, screen and encode a large chunk body, in a worker process (:data:`_pool`).

    Returns ``("ok", seq, encoded chunk)`` or ``("error", status, detail)``: only bytes and small objects
    travel back, never the millions of Python floats the parse creates.  ``socket``: the text is a
    WebSocket message ``{"type": "chunk", ...}``.
    """
    try:
        body = _parse_chunk(text, SocketChunkIn if socket else ChunkIn)
        if len(body.y) > max_observations:
            raise HTTPException(
                status.HTTP_413_CONTENT_TOO_LARGE,
                f"y: {len(body.y)} observations exceed SGAIS_MAX_CHUNK_OBSERVATIONS={max_observations}",
            )
        try:
            x, y = validate_chunk(stream_family(family, params_json), body, configs)
        except ObservationError as err:
            raise observation_422(err) from None
    except HTTPException as err:
        return ("error", err.status_code, err.detail)
    return ("ok", body.seq, records.encode_chunk(x, y))


_pool: ProcessPoolExecutor | None = None


async def _in_process(fn, *args):
    """``fn(*args)`` in the chunk-parsing process (spawned with the first large body; one at a time, so
    the memory a parse takes is bounded to one body's worth)."""
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)
    except BrokenProcessPool:
        _pool = None  # the parse process died (e.g. out of memory): the next large body starts another
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, "request body too large to parse") from None


def shutdown_pool() -> None:
    """Stop the chunk-parsing process, if one was started (the app's lifespan calls this at shutdown: a pool
    left running outlives the API as an orphan process)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
        _pool = None


async def accept_chunk_text(
    r, keys: Keys, settings: Settings, tenant: str, stream: str, text: str, socket: bool = False
) -> dict[str, Any]:
    """:func:`accept_chunk` for a body still in JSON text (``socket``: a WebSocket chunk message).

    Parsing is CPU work that holds the GIL (pydantic-core and ``json.loads`` alike: a 12 MB body stalled
    the event loop 2.4 s even from a thread), so bodies over ``LARGE_BODY_BYTES`` (1 MiB) are parsed,
    validated, screened and encoded in a separate process and the event loop keeps serving.
    """
    if len(text) <= LARGE_BODY_BYTES:
        body = _parse_chunk(text, SocketChunkIn if socket else ChunkIn)
        return await accept_chunk(r, keys, settings, tenant, stream, ChunkIn(x=body.x, y=body.y, seq=body.seq))
    meta, configs, active = await stream_configs(r, keys, tenant, stream)
    outcome = await _in_process(
        validate_encoded, text, meta["family"], meta["params"], configs, settings.max_chunk_observations, socket
    )
    if outcome[0] == "error":
        raise HTTPException(outcome[1], outcome[2])
    return await store_chunk(r, keys, settings, tenant, stream, outcome[1], outcome[2], active)


_responses: dict[int | str, dict[str, Any]] = {
    **BODY_RESPONSES,
    **TOO_MANY,
    409: {"description": "seq gap or replay with different content"},
    413: {"description": "body or chunk too large (the body is counted while it is read, before parsing)"},
    422: {"description": "invalid observations (the detail names the row and the reason)"},
}


@router.post(
    "/streams/{stream}/chunks",
    response_model=ChunkAck,
    status_code=202,
    responses=_responses,
    openapi_extra=_chunk_openapi,
)
async def post_stream_chunk(
    stream: Name,
    text: ChunkText,
    r: RedisDep,
    keys: KeysDep,
    settings: SettingsDep,
    tenant: TenantDep,
    response: Response,
) -> dict[str, Any]:
    """Append a chunk to a stream (202); an identical replay of an accepted ``seq`` is 200 with duplicate=true."""
    return _acked(response, await accept_chunk_text(r, keys, settings, tenant, stream, text))


@router.post(
    "/models/{model}/chunks",
    response_model=ChunkAck,
    status_code=202,
    responses=_responses,
    openapi_extra=_chunk_openapi,
)
async def post_model_chunk(
    model: Name,
    text: ChunkText,
    r: RedisDep,
    keys: KeysDep,
    settings: SettingsDep,
    tenant: TenantDep,
    response: Response,
) -> dict[str, Any]:
    """Append a chunk to the model's stream."""
    cfg = await store.get_model(r, keys, tenant, model)
    return _acked(response, await accept_chunk_text(r, keys, settings, tenant, cfg["stream"], text))


def _acked(response: Response, ack: dict[str, Any]) -> dict[str, Any]:
    """The ack body; 200 instead of 202 for an identical replay of an accepted ``seq``."""
    if ack["duplicate"]:
        response.status_code = status.HTTP_200_OK
    return ack


@router.get("/streams/{stream}", response_model=StreamOut, response_model_by_alias=True)
async def get_stream(stream: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """The stream's schema, chunk and observation counts, and how far each model has got."""
    return await store.stream_status(r, keys, tenant, stream)
