"""Models: create, list, read, delete (API.md "Models")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from pydantic import ValidationError

from models import FAMILIES, UnknownFamilyError, make_family
from service.deps import KeysDep, RedisDep, SettingsDep, TenantDep
from service.schemas import ModelCreate, ModelList, ModelOut, Name
from workers.alerts import AlertSettings
from workers.settings import SamplerSettings
from workers.store import reads as store

router = APIRouter(prefix="/v1/models", tags=["models"])


def validation_422(err: ValidationError, *loc: str) -> HTTPException:
    """A pydantic error of a nested object as a FastAPI-style 422 with ``loc`` prefixed."""
    detail = [{"loc": ["body", *loc, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in err.errors()]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)


@router.post(
    "",
    response_model=ModelOut,
    status_code=201,
    responses={409: {"description": "name taken"}, 422: {"description": "invalid config or schema mismatch"}},
)
async def create_model(
    body: ModelCreate, r: RedisDep, keys: KeysDep, settings: SettingsDep, tenant: TenantDep
) -> dict[str, Any]:
    """Create a model on a stream (the stream is created with the first model and fixes the schema)."""
    try:
        family = make_family(body.family, body.params)
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
        sampler = SamplerSettings(**{"device": settings.device, **body.sampler})
    except ValidationError as err:
        raise validation_422(err, "sampler") from None
    except TypeError as err:
        raise HTTPException(422, [{"loc": ["body", "sampler"], "msg": str(err), "type": "type_error"}]) from None
    try:
        alerts = AlertSettings(**body.alerts)
    except ValidationError as err:
        raise validation_422(err, "alerts") from None
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
    await store.create_model(r, keys, tenant, cfg, family.observation_schema())
    return cfg


@router.get("", response_model=ModelList)
async def list_models(r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """Every model of the caller's tenant, by name."""
    return {"items": await store.list_models(r, keys, tenant)}


@router.get("/{model}", response_model=ModelOut)
async def get_model(model: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """One model."""
    return await store.get_model(r, keys, tenant, model)


@router.delete("/{model}", status_code=204, response_class=Response, response_model=None)
async def delete_model(model: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> Response:
    """Delete a model: state, trace and alerts removed; the stream stays."""
    cfg = await store.get_model(r, keys, tenant, model)
    await store.delete_model(r, keys, tenant, cfg)
    return Response(status_code=204)
