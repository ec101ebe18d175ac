"""The store's domain errors (:mod:`workers.store.errors`) as HTTP: status codes and ``detail`` as in API.md."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.responses import JSONResponse

from workers.store.errors import Conflict, NotFound, SchemaMismatch, StoreError

STATUS: list[tuple[type[StoreError], int]] = [
    (NotFound, status.HTTP_404_NOT_FOUND),
    (Conflict, status.HTTP_409_CONFLICT),  # also SeqGap and NotReady
    (SchemaMismatch, status.HTTP_422_UNPROCESSABLE_CONTENT),
]


def http_status(err: StoreError) -> int:
    """The HTTP status of a store error (500 for one this table does not know)."""
    return next((code for cls, code in STATUS if isinstance(err, cls)), status.HTTP_500_INTERNAL_SERVER_ERROR)


def http_error(err: StoreError) -> HTTPException:
    """``err`` as the HTTPException a route would have raised (for the WebSocket's error messages)."""
    return HTTPException(http_status(err), err.detail)


async def store_error_handler(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, StoreError)
    return JSONResponse({"detail": err.detail}, status_code=http_status(err))


def install(app: FastAPI) -> None:
    """Map every store error raised by a route to its HTTP response."""
    app.add_exception_handler(StoreError, store_error_handler)
