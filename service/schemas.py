"""Request and response schemas of the HTTP API (API.md), pydantic v2."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case name, ^[a-z0-9][a-z0-9_.-]{0,63}$")]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----- models ---------------------------------------------------------------------------------
class ModelCreate(_Request):
    name: Name
    stream: Name | None = Field(None, description="defaults to the model's name")
    family: str = Field(..., description="registered family (models.FAMILIES)")
    params: dict[str, Any] = Field(default_factory=dict, description="the family's hyperparameters")
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
class ChunkIn(_Request):
    seq: StrictInt | None = Field(None, ge=1, description="client chunk number, starting at 1")
    x: list[Any] | None = Field(None, description="covariates, one row per observation")
    y: list[Any] = Field(..., description="observations: a number each, or a list of dim numbers")


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
        description="the particles were merged with a re-annealing from the prior "
        "over the whole history after this block (sampler.reanneal_steps)",
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


class Trace(BaseModel):
    items: list[TraceRow]


class Evidence(BaseModel):
    model: str
    stream: str
    status: Literal["pending", "ok", "error"] = Field(..., description="pending = not yet picked up by a worker")
    error: str | None = None
    observations: int
    chunks_processed: int
    chunks_pending: int
    log_evidence: float
    log_evidence_per_observation: float | None
    last_block: Block | None


class ParameterSummary(BaseModel):
    shape: list[int]
    mean: Any
    std: Any
    q05: Any
    q95: Any


class Posterior(BaseModel):
    observations: int
    ess: float
    parameters: dict[str, ParameterSummary]


class ModelProbability(BaseModel):
    model: str
    log_evidence: float
    probability: float
    log_bayes_factor: float


class StreamPosterior(BaseModel):
    stream: str
    observations: int
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
