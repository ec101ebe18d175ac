"""Streams: delete (API.md "Chunks": ``DELETE /v1/streams/{stream}``)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.deps import KeysDep, RedisDep, TenantDep
from service.schemas import ERROR_RESPONSES, NOT_FOUND, Name
from workers.store.errors import NotFound
from workers.store.streams import delete_stream as delete_stream_keys

router = APIRouter(prefix="/v1", tags=["chunks"], responses={**ERROR_RESPONSES, **NOT_FOUND})


@router.delete("/streams/{stream}", status_code=204, response_class=Response, response_model=None)
async def delete_stream(stream: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> Response:
    """Delete a stream: its log, its models (state, trace, lease) and their alerts, in one atomic step.

    A worker holding one of the models finds its lease gone at its next renewal or commit and drops the
    model without writing anything (the commit is fenced by the lease), as for a deleted model.
    404 when the stream does not exist in the caller's tenant.
    """
    if await delete_stream_keys(r, keys, tenant, stream) is None:
        raise NotFound("stream", stream)
    return Response(status_code=204)
