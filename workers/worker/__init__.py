"""The worker: leases models, absorbs their stream's chunks with SGAIS, commits exactly once.

One module per job (``docs/architecture.md``):

- :mod:`~workers.worker.loop`: the :class:`Worker` (``run()`` until stopped, ``step()`` = one pass);
- :mod:`~workers.worker.leases`: discovery, fair share, fenced renewal and the heartbeat thread;
- :mod:`~workers.worker.restore`: a leased model's engine from its checkpoint (history replayed);
- :mod:`~workers.worker.blocks`: a chunk -> processed blocks -> trace rows (shared with the tests);
- :mod:`~workers.worker.detect`: change-point alerts over the processed blocks;
- :mod:`~workers.worker.posterior`: the stream posterior after a commit;
- :mod:`~workers.worker.metrics`: the worker's own Prometheus registry.

Run alone with ``sgais worker --redis-url URL`` or ``python -m workers.runner``.
"""

from workers.store.commit import LeaseLost
from workers.worker.loop import Worker

__all__ = ["LeaseLost", "Worker"]
