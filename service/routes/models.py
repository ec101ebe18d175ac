"""Models: create, list, read, delete (API.md "Models")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response, status
from pydantic import ValidationError

from models import FAMILIES, UnknownFamilyError
from service import quotas
from service.bodies import loads_strict, pydantic_422, read_body
from service.deps import KeysDep, RedisDep, SettingsDep, TenantDep
from service.schemas import BODY_RESPONSES, ERROR_RESPONSES, NOT_FOUND, TOO_MANY, ModelCreate, ModelList, ModelOut, Name
from workers import admission, screening
from workers.alerts import AlertSettings
from workers.settings import SamplerSettings
from workers.store import reads as store

router = APIRouter(prefix="/v1/models", tags=["models"], responses=ERROR_RESPONSES)
MAX_MODEL_BODY_BYTES = 1 << 20  # a model config is a few hundred bytes


async def model_body(request: Request) -> ModelCreate:
    """The body of ``POST /v1/models``: JSON (415), at most 1 MiB (413), UTF-8 (400), no NaN/Infinity or
    integers beyond float range anywhere (422), strict types (``"dim": "2"`` is 422)."""
    data = loads_strict(await read_body(request, MAX_MODEL_BODY_BYTES))
    try:
        return ModelCreate.model_validate(data, strict=True)
    except ValidationError as err:
        raise pydantic_422(err, "body") from None


_model_openapi = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": ModelCreate.model_json_schema(ref_template="#/components/schemas/{model}")}
        },
    }
}


def validation_422(err: ValidationError, *loc: str) -> HTTPException:
    """A pydantic error of a nested object as a FastAPI-style 422 with ``loc`` prefixed."""
    return pydantic_422(err, "body", *loc)


@router.post(
    "",
    response_model=ModelOut,
    status_code=201,
    responses={
        **BODY_RESPONSES,
        **TOO_MANY,
        409: {"description": "name taken"},
        422: {"description": "invalid config, schema mismatch, or a model the service cannot run (admission)"},
    },
    openapi_extra=_model_openapi,
)
async def create_model(
    request: Request, r: RedisDep, keys: KeysDep, settings: SettingsDep, tenant: TenantDep
) -> dict[str, Any]:
    """Create a model on a stream (the stream is created with the first model and fixes the schema).

    Refused with 422 when the worker could not run it (device, estimated memory or time per block over
    the limits: ``workers/admission.py``) and 429 when the tenant is over its quotas.
    """
    body = await model_body(request)
    try:
        if body.family not in FAMILIES:
            raise UnknownFamilyError(body.family)
        # strict: "dim": "2" or true is an error, not 2 or 1 (the JSON types are the contract)
        cls = FAMILIES[body.family]
        family = cls(cls.Params.model_validate(body.params, strict=True))
    except UnknownFamilyError:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            [
                {
                    "loc": ["body", "family"],
                    "type": "unknown_family",
                    "msg": f"unknown family {body.family!r}; known: {sorted(FAMILIES)}",
                }
            ],
        ) from None
    except ValidationError as err:
        raise validation_422(err, "params") from None
    try:
        sampler = SamplerSettings.model_validate({"device": settings.device, **body.sampler}, strict=True)
    except ValidationError as err:
        raise validation_422(err, "sampler") from None
    try:
        alerts = AlertSettings.model_validate(body.alerts, strict=True)
    except ValidationError as err:
        raise validation_422(err, "alerts") from None
    refused = admission.check(family, sampler, settings)
    if refused:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, refused)
    backlog = await quotas.check_model_quota(r, keys, settings, tenant, body.stream or body.name)
    cfg = {
        "name": body.name,
        "stream": body.stream or body.name,
        "family": body.family,
        "params": family.params.model_dump(),
        "sampler": sampler.model_dump(),
        "alerts": alerts.model_dump(),
        "prior_probability": body.prior_probability,
        "created_at": datetime.now(UTC).isoformat(),
    }
    screening.prepare(cfg, family)  # its chunk screening's probes, drawn now rather than at its stream's next chunk
    await store.create_model(r, keys, tenant, cfg, family.observation_schema())
    quotas.model_accepted(keys, tenant, backlog)
    return cfg


@router.get("", response_model=ModelList)
async def list_models(r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """Every model of the caller's tenant, by name."""
    return {"items": await store.list_models(r, keys, tenant)}


@router.get("/{model}", response_model=ModelOut, responses=NOT_FOUND)
async def get_model(model: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """One model."""
    return await store.get_model(r, keys, tenant, model)


@router.delete("/{model}", status_code=204, response_class=Response, response_model=None, responses=NOT_FOUND)
async def delete_model(model: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> Response:
    """Delete a model: state, trace and alerts removed; the stream stays."""
    cfg = await store.get_model(r, keys, tenant, model)
    await store.delete_model(r, keys, tenant, cfg)
    return Response(status_code=204)
