"""Request and response schemas of the HTTP API (API.md), pydantic v2."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt
from pydantic.json_schema import JsonDict

from models import FAMILIES

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case name, ^[a-z0-9][a-z0-9_.-]{0,63}$")]


class ErrorOut(BaseModel):
    detail: Any = Field(..., description="the reason: a message, or FastAPI's list of {loc, msg, type}")


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
#: Responses every authenticated route may return (listed in the OpenAPI document of each route).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "missing or invalid API key"},
    503: {
        "model": ErrorOut,
        "description": "Redis unavailable; retry after Retry-After seconds",
        "headers": _RETRY_AFTER,
    },
}
#: Responses of routes that take a JSON body.
BODY_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "body is not valid UTF-8"},
    413: {"model": ErrorOut, "description": "body too large (checked while reading, before parsing)"},
    415: {"model": ErrorOut, "description": "Content-Type is not application/json"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "unknown model or stream"}}
TOO_MANY: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorOut, "description": "tenant over its quota", "headers": _RETRY_AFTER}
}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----- models ---------------------------------------------------------------------------------
def _params_description() -> str:
    """The ``params`` field's OpenAPI description: each family's prior and hyperparameters with defaults
    (from the families' pydantic schemas, so it cannot go stale; docs/priors.md has the full text)."""
    from pydantic_core import PydanticUndefined

    parts = ["The family's hyperparameters; unknown keys are 422. Priors in full: docs/priors.md."]
    for name in sorted(FAMILIES):
        cls = FAMILIES[name]
        fields = []
        for field, info in cls.Params.model_fields.items():
            default = "required" if info.default is PydanticUndefined else json.dumps(info.default)
            fields.append(f"`{field}` ({default}): {info.description or ''}")
        parts.append(f"**{name}** — prior: {cls.prior}. Params: " + "; ".join(fields) + ".")
    return "\n\n".join(parts)


class ModelCreate(_Request):
    name: Name
    stream: Name | None = Field(None, description="defaults to the model's name")
    family: str = Field(
        ..., description="registered family (models.FAMILIES)", json_schema_extra={"enum": [*sorted(FAMILIES)]}
    )
    params: dict[str, Any] = Field(default_factory=dict, description=_params_description())
    sampler: dict[str, Any] = Field(default_factory=dict, description="SGAIS settings overrides")
    alerts: dict[str, Any] = Field(default_factory=dict, description="change-point alert settings overrides")
    prior_probability: float = Field(1.0, gt=0, allow_inf_nan=False, description="relative prior weight")


class ModelOut(BaseModel):
    name: str
    stream: str
    family: str
    params: dict[str, Any]
    sampler: dict[str, Any]
    alerts: dict[str, Any]
    prior_probability: float
    created_at: datetime


class ModelList(BaseModel):
    items: list[ModelOut]


# ----- chunks ---------------------------------------------------------------------------------
def _whole_number(v: Any) -> Any:
    """JSON Schema's ``integer`` includes ``12.0``; booleans and strings are not numbers here."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    return v


_NUMBERS: JsonDict = {"type": "array", "items": {"type": "number"}}


class ChunkIn(_Request):
    seq: Annotated[StrictInt, BeforeValidator(_whole_number), Field(ge=1)] | None = Field(
        None, description="client chunk number, starting at 1"
    )
    # validated by the stream's family (shapes, finiteness, labels): the schemas below document the form
    x: list[Any] | None = Field(
        None, description="covariates, one row per observation", json_schema_extra={"items": _NUMBERS}
    )
    y: list[Any] = Field(
        ...,
        min_length=1,
        description="observations: a number each, or a list of dim numbers",
        json_schema_extra={"items": {"anyOf": [{"type": "number"}, _NUMBERS]}},
    )


class SocketChunkIn(ChunkIn):
    """A chunk sent over the events WebSocket: ``{"type": "chunk", ...chunk body}``."""

    type: Literal["chunk"]


class ChunkAck(BaseModel):
    stream: str
    seq: int
    first_index: int
    n_observations: int
    duplicate: bool


class StreamModel(BaseModel):
    name: str
    chunks_processed: int
    observations_processed: int


class StreamOut(BaseModel):
    name: str
    schema_: dict[str, Any] = Field(..., alias="schema", serialization_alias="schema")
    chunks: int
    observations: int
    models: list[StreamModel]

    model_config = ConfigDict(populate_by_name=True)


# ----- evidence -------------------------------------------------------------------------------
class Block(BaseModel):
    seq: int
    first_index: int
    observations: int = Field(..., description="stream values in the block")
    log_predictive: float
    annealing_steps: int
    ess: float
    resampled: bool
    seconds: float
    guard_tripped: bool = False
    reannealed: bool = Field(
        False,
        description="the particles and the running log-evidence were replaced by a re-annealing from the prior "
        "over the whole history after this block (sampler.reanneal_steps, or a block of at least "
        "sampler.restart_min_rows rows and as large as the history; the jump is log_evidence_correction)",
    )
    # issue 12 (workers/segmented.py): the change posterior after this block
    change_probability: float | None = Field(
        None, description="posterior probability of a change in the current segment (alerts.change_point.window)"
    )
    change_point: bool = Field(False, description="a change point was confirmed at this block (evidence jumps)")


class TraceRow(Block):
    observations: int = Field(..., description="cumulative stream values absorbed after this block")
    block_observations: int = Field(..., description="stream values in the block")
    log_evidence: float = Field(..., description="running log-evidence (nats)")
    log_evidence_se: float = Field(
        0.0, description="Monte Carlo standard error of log_evidence (nats; 0 = not reported)"
    )
    log_evidence_correction: float = Field(
        0.0,
        description="nats by which log_evidence moved besides log_predictive: a re-annealing replaced the running "
        "estimate of the whole history by the replay's (log Ẑ_replay − log Ẑ_running); 0 when none",
    )


class Trace(BaseModel):
    items: list[TraceRow]


class Evidence(BaseModel):
    model: str
    stream: str
    status: Literal["pending", "ok", "degraded", "error"] = Field(
        ..., description="pending = not yet picked up by a worker; degraded = see error (e.g. block budget exceeded)"
    )
    error: str | None = None
    observations: int
    chunks_processed: int
    chunks_pending: int
    log_evidence: float
    log_evidence_se: float = Field(
        0.0, description="Monte Carlo standard error of log_evidence (nats), calibrated over independent seeds"
    )
    log_evidence_per_observation: float | None
    last_block: Block | None


class CovariateNames(BaseModel):
    axis: int = Field(description="the axis of the parameter that runs over the model's covariates")
    names: list[str] = Field(
        description="the stream's column name of each entry along that axis (`params.columns`), else `x[i]`"
    )


class ParameterSummary(BaseModel):
    shape: list[int]
    mean: Any
    std: Any
    q05: Any
    q95: Any
    covariates: CovariateNames | None = Field(
        None, description="regression weights: which stream column each entry belongs to (absent otherwise)"
    )


class Posterior(BaseModel):
    observations: int
    ess: float
    parameters: dict[str, ParameterSummary]


class ModelProbability(BaseModel):
    model: str
    status: Literal["pending", "ok", "degraded", "error"] = Field(
        "ok", description="the model's status; a model in error is listed without a result"
    )
    error: str | None = Field(None, description="why the model stopped or is degraded")
    log_evidence: float | None = Field(
        ...,
        description="log p(y_{c+1..n} | y_{1..c}) (nats), c = conditioned_on: the same observations for every "
        "model (may differ from the model's own running log-evidence); null without a result",
    )
    log_evidence_se: float | None = Field(None, description="its Monte Carlo standard error (nats)")
    probability: float | None = Field(
        ..., description="∝ prior_probability · exp(log_evidence) over the models with results; null without one"
    )
    log_bayes_factor: float | None = Field(..., description="log_evidence minus the most probable model's (nats)")
    log_bayes_factor_se: float | None = Field(
        None, description="its standard error, sqrt(se² + se_best²) (nats; independent random streams)"
    )


class StreamPosterior(BaseModel):
    stream: str
    observations: int = Field(..., description="n, the largest observation count every active model has processed")
    conditioned_on: int = Field(
        0,
        description="c, the first observations every model is conditioned on: the stream's largest context "
        "(e.g. the largest AR order), or the first count after it at which every model has a trace row",
    )
    models: list[ModelProbability]


# ----- alerts ---------------------------------------------------------------------------------
class Alert(BaseModel):
    id: str
    stream: str
    model: str
    kind: Literal["change_point", "evidence_drop", "annealing_spike", "model_switch"]
    observation_index: int | None
    detected_at_index: int | None
    score: float
    probability: float | None = Field(None, description="change_point: posterior probability of the change")
    log_bayes_factor: float | None = Field(None, description="change_point: log Bayes factor change vs none (nats)")
    message: str
    created_at: datetime


class AlertList(BaseModel):
    items: list[Alert]


# ----- operations -----------------------------------------------------------------------------
class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    redis: bool
    workers: int = Field(..., description="workers with a fresh heartbeat")
