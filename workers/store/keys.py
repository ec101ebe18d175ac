"""Every Redis key name of the service and the workers (one module, DESIGN.md §2).

``P`` is the deployment prefix (``SGAIS_KEY_PREFIX``), ``T`` the tenant:

=====================================  ==========  =========================================================
key                                    type        contents
=====================================  ==========  =========================================================
``P:models``                           set         ``T/model`` of every active model (worker discovery)
``P:T:models``                         set         model names of the tenant
``P:T:model:{m}``                      string      model config JSON (the model resource + ``alerts``)
``P:T:stream:{s}``                     stream      chunk log: ``seq, first_index, n, x_shape, y_shape, x, y``
``P:T:stream:{s}:meta``                hash        ``schema, family, params, chunks, observations``,
                                                   ``models_etag`` (a new token whenever a model of the stream is
                                                   created or deleted: workers/store/reads.py)
``P:T:stream:{s}:seqs``                hash        ``seq -> sha256:first_index:n`` (replay detection)
``P:T:stream:{s}:models``              set         model names on the stream
``P:T:stream:{s}:leader``              string      JSON ``{"model", "observations"}``: most probable model
``P:T:ckpt:{m}``                       hash        ``state`` (safetensors bytes), ``cursor`` (entry id), ``chunks``,
                                                   ``observations``, ``log_evidence``, ``detector``, ``last_block``,
                                                   ``status``, ``error`` (the parameter posterior is computed
                                                   from ``state`` when the API is asked for it)
``P:T:trace:{m}``                      zset        trace rows (JSON) scored by ``first_index``
``P:T:alerts``                         zset        alert JSON scored by creation time (ms)
``P:T:alerts:by_stream``               hash        ``stream/kind`` -> count (``sgais_alerts_total{stream, kind}``)
``P:T:attempts:{m}``                   hash        quarantine: the attempt in progress, failures (workers/quarantine.py)
``P:T:lease:{m}``                      string      lease token of the worker holding the model (PX TTL)
``P:T:events:{s}``                     channel     live events of a stream
``P:workers``                          zset        worker id -> last heartbeat (unix seconds)
``P:costs``                            hash        ``T/model`` -> its measured engine load (engine seconds per second,
                                                   written by its holder; workers/worker/leases.py)
``P:loads``                            hash        worker id -> JSON ``{"load", "models"}``: the summed load of the
                                                   models it holds (same unit) and their number
``P:worker:{id}``                      string      heartbeat JSON (TTL)
``P:metrics:alerts_total``             hash        kind -> count
``P:metrics:block_seconds``            hash        histogram buckets ``le``, ``sum``, ``count``
``P:metrics:lease_losses``             hash        ``worker|T/model`` -> leases the worker lost on the model
``P:metrics:retried_blocks``           hash        ``worker|T/model`` -> blocks computed, refused by the fence, redone
=====================================  ==========  =========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

# Buckets of sgais_block_seconds (seconds), shared by the worker (writer) and the API (reader).
BLOCK_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix."""

    prefix: str = "sgais"

    # ----- global ---------------------------------------------------------------------------
    @property
    def models(self) -> str:
        return f"{self.prefix}:models"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def costs(self) -> str:
        """Hash ``T/model`` -> the model's engine load, for the cost-weighted shares (:mod:`workers.worker.leases`)."""
        return f"{self.prefix}:costs"

    @property
    def loads(self) -> str:
        """Hash worker id -> JSON ``{"load", "models"}``: the summed engine load of the models it holds and their number
        (:mod:`workers.worker.leases`)."""
        return f"{self.prefix}:loads"

    @property
    def alerts_total(self) -> str:
        return f"{self.prefix}:metrics:alerts_total"

    @property
    def block_seconds(self) -> str:
        return f"{self.prefix}:metrics:block_seconds"

    @property
    def lease_losses(self) -> str:
        return f"{self.prefix}:metrics:lease_losses"

    @property
    def retried_blocks(self) -> str:
        return f"{self.prefix}:metrics:retried_blocks"

    # ----- per tenant -----------------------------------------------------------------------
    def tenant_pattern(self, tenant: str) -> str:
        return f"{self.prefix}:{tenant}:*"

    def tenant_models(self, tenant: str) -> str:
        return f"{self.prefix}:{tenant}:models"

    def model(self, tenant: str, model: str) -> str:
        return f"{self.prefix}:{tenant}:model:{model}"

    def log(self, tenant: str, stream: str) -> str:
        return f"{self.prefix}:{tenant}:stream:{stream}"

    def meta(self, tenant: str, stream: str) -> str:
        return f"{self.prefix}:{tenant}:stream:{stream}:meta"

    def seqs(self, tenant: str, stream: str) -> str:
        return f"{self.prefix}:{tenant}:stream:{stream}:seqs"

    def stream_models(self, tenant: str, stream: str) -> str:
        return f"{self.prefix}:{tenant}:stream:{stream}:models"

    def stream_obs(self, tenant: str, stream: str) -> str:
        """Sorted set: the stream's models scored by their committed observations (+inf once in ``error``),
        so a commit finds the stream's common count without reading every model (``lua/commit.lua``)."""
        return f"{self.prefix}:{tenant}:stream:{stream}:obs"

    def leader(self, tenant: str, stream: str) -> str:
        return f"{self.prefix}:{tenant}:stream:{stream}:leader"

    def checkpoint(self, tenant: str, model: str) -> str:
        return f"{self.prefix}:{tenant}:ckpt:{model}"

    def trace(self, tenant: str, model: str) -> str:
        return f"{self.prefix}:{tenant}:trace:{model}"

    def alerts(self, tenant: str) -> str:
        return f"{self.prefix}:{tenant}:alerts"

    def alerts_by_stream(self, tenant: str) -> str:
        """Alert counts of the tenant by ``stream/kind``.

        Written by the commit scripts as ``alerts + ':by_stream'``.
        """
        return f"{self.prefix}:{tenant}:alerts:by_stream"

    def attempts(self, tenant: str, model: str) -> str:
        """The quarantine's attempt record of a model (:mod:`workers.quarantine`)."""
        return f"{self.prefix}:{tenant}:attempts:{model}"

    def lease(self, tenant: str, model: str) -> str:
        return f"{self.prefix}:{tenant}:lease:{model}"

    def events(self, tenant: str, stream: str) -> str:
        return f"{self.prefix}:{tenant}:events:{stream}"


def model_ref(tenant: str, model: str) -> str:
    """Member of ``P:models``: ``tenant/model`` (names never contain '/')."""
    return f"{tenant}/{model}"


def parse_model_ref(ref: str) -> tuple[str, str]:
    tenant, _, model = ref.partition("/")
    return tenant, model


def counter_field(worker_id: str, tenant: str, model: str) -> str:
    """Field of the per-worker, per-model counter hashes (``lease_losses``, ``retried_blocks``)."""
    return f"{worker_id}|{model_ref(tenant, model)}"


def parse_counter_field(field: str) -> tuple[str, str, str]:
    """Inverse of :func:`counter_field`: ``(worker, tenant, model)``."""
    worker, _, ref = field.partition("|")
    return (worker, *parse_model_ref(ref))
