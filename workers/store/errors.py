"""Domain errors of the store: what a read or a write found, in the store's words.

The API maps each to an HTTP status in ``service/app.py`` (:func:`service.errors.http_error`); the
store itself knows nothing of HTTP.  ``detail`` is the text (or, for :class:`SchemaMismatch`, the
FastAPI-style error list) the client sees.
"""

from __future__ import annotations

from typing import Any


class StoreError(Exception):
    """Base class; ``detail`` is what the client is told."""

    def __init__(self, detail: Any):
        super().__init__(detail)
        self.detail = detail


class NotFound(StoreError):
    """A model or stream does not exist in the tenant (HTTP 404)."""

    def __init__(self, what: str, name: str):
        super().__init__(f"{what} {name!r} not found")
        self.what, self.name = what, name


class Conflict(StoreError):
    """The write contradicts stored state: a name taken, a ``seq`` replayed with other content (HTTP 409)."""


class SeqGap(Conflict):
    """A chunk's ``seq`` is past the next expected one (HTTP 409)."""


class NotReady(Conflict):
    """The model has no checkpoint yet: no worker has picked it up (HTTP 409)."""


class SchemaMismatch(StoreError):
    """A new model's observation schema differs from its stream's (HTTP 422, ``detail`` a FastAPI error list)."""
