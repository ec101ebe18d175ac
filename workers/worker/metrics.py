"""The worker's own Prometheus registry (served on ``SGAIS_METRICS_PORT`` by ``python -m workers.runner``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from workers.store.keys import BLOCK_SECONDS_BUCKETS

WORKER_REGISTRY = CollectorRegistry()
BLOCK_SECONDS = Histogram(
    "sgais_block_seconds",
    "wall-clock seconds per absorbed block",
    buckets=BLOCK_SECONDS_BUCKETS,
    registry=WORKER_REGISTRY,
)
ALERTS = Counter("sgais_alerts", "alerts raised", ["kind"], registry=WORKER_REGISTRY)
LEASES = Gauge("sgais_worker_leases", "models leased by the worker", ["worker"], registry=WORKER_REGISTRY)
OBSERVATIONS = Counter("sgais_worker_observations", "observations absorbed by this worker", registry=WORKER_REGISTRY)
