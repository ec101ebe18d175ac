"""Request bodies (API.md, issue 11): content type, size while reading, UTF-8, strict JSON.

Every JSON body of the API goes through :func:`read_json_body`, in this order, each step before any parsing:

1. ``Content-Type`` must be ``application/json`` (or ``*/*+json``): otherwise ``415``.
2. The body is read chunk by chunk and counted: past the limit, ``413`` at once (a declared
   ``Content-Length`` over the limit is refused before reading anything).
3. It must decode as UTF-8 (RFC 8259 §8.1): otherwise ``400``.

Chunk bodies over :data:`LARGE_BODY_BYTES` are then parsed in a separate process
(``service/routes/chunks.py``: a 46 MB chunk took 10 s to parse and stalled every request of every tenant,
hardening review F7; a thread does not help, the parsers hold the GIL), one at a time (a parsed number
costs ~30 bytes of Python objects: two 61 MB bodies raised the API's memory by 1.4 GB).

:func:`loads_strict` is the parser of small configuration bodies (``POST /v1/models``): ``NaN``,
``Infinity`` and integers beyond float range are ``422`` wherever they occur.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

LARGE_BODY_BYTES = 1 << 20
FLOAT_MAX = 1.7976931348623157e308


def _error(code: int, msg: str, type_: str, loc: tuple[Any, ...] = ("body",)) -> HTTPException:
    if code == status.HTTP_422_UNPROCESSABLE_CONTENT:
        return HTTPException(code, [{"loc": list(loc), "msg": msg, "type": type_}])
    return HTTPException(code, msg)


def is_json_media_type(content_type: str | None) -> bool:
    """True for ``application/json`` and ``application/<anything>+json`` (parameters ignored)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_body(request: Request, limit: int) -> str:
    """The request body as text, checked before parsing (steps 1-3 above).

    Raises
    ------
    HTTPException
        415 (not JSON), 413 (over ``limit`` bytes, counted while reading), 400 (not UTF-8).
    """
    if not is_json_media_type(request.headers.get("content-type")):
        raise _error(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json", "media_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _error(status.HTTP_413_CONTENT_TOO_LARGE, f"request body exceeds {limit} bytes", "too_large")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise _error(status.HTTP_413_CONTENT_TOO_LARGE, f"request body exceeds {limit} bytes", "too_large")
        parts.append(part)
    raw = b"".join(parts)
    try:
        return raw.decode("utf-8") if size <= LARGE_BODY_BYTES else await run_in_threadpool(raw.decode, "utf-8")
    except UnicodeDecodeError as err:
        raise _error(
            status.HTTP_400_BAD_REQUEST, f"request body is not valid UTF-8 (byte {err.start})", "unicode"
        ) from None


def _reject_constant(name: str) -> Any:
    raise _StrictJSONError(f"{name} is not a valid JSON number")


def _bounded_int(text: str) -> int:
    value = int(text)
    if abs(value) > FLOAT_MAX:
        raise _StrictJSONError(f"integer {text[:20]}... ({len(text)} digits) is beyond the float range")
    return value


class _StrictJSONError(ValueError):
    pass


def loads_strict(text: str) -> Any:
    """``json.loads`` refusing ``NaN``, ``Infinity`` and integers beyond float range.

    Raises
    ------
    HTTPException
        422 naming the reason (invalid JSON with line and column, non-finite constant, huge integer,
        nesting too deep).
    """
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_int=_bounded_int)
    except _StrictJSONError as err:
        raise _error(status.HTTP_422_UNPROCESSABLE_CONTENT, str(err), "json_invalid") from None
    except json.JSONDecodeError as err:
        raise _error(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"invalid json: {err.msg} (line {err.lineno}, column {err.colno})",
            "json_invalid",
        ) from None
    except RecursionError:
        raise _error(status.HTTP_422_UNPROCESSABLE_CONTENT, "invalid json: nested too deeply", "json_invalid") from None


def pydantic_422(err: ValidationError, *loc: Any) -> HTTPException:
    """A pydantic error as FastAPI's 422 shape, ``loc`` prefixed, without the offending input (which may be
    bytes, NaN or a 5 MB string: echoing it made some 422s into 500s, review F8)."""
    detail = [{"loc": [*loc, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in err.errors(include_url=False)]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)
