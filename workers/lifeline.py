"""A worker started by a supervisor (``sgais serve``) exits when that supervisor dies (issue 11).

Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` (man 2 prctl) asks the kernel to send SIGTERM when the parent
dies; the worker's SIGTERM handler stops its loop.  Everywhere (and in case the parent died before the
``prctl`` call, or the signal was missed): a daemon thread compares ``os.getppid()`` with the supervisor's
pid every ``poll_seconds``.  Either way the worker first stops gracefully (its leases are released) and,
should that not finish within ``grace_seconds`` (a long block), exits hard: every commit is fenced, so an
exit at any moment loses nothing (DESIGN.md §2).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("sgais.worker")

PARENT_ENV = "SGAIS_PARENT_PID"
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Linux only: the kernel sends ``sig`` to this process when its parent thread exits. True if set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(
    stop: threading.Event,
    parent: int | None = None,
    *,
    poll_seconds: float = 1.0,
    grace_seconds: float = 30.0,
) -> threading.Thread | None:
    """Stop (``stop.set()``) when the supervisor ``parent`` dies; ``os._exit(1)`` if still alive ``grace_seconds``
    later.  ``parent`` defaults to ``$SGAIS_PARENT_PID``; nothing is watched when neither is set (a standalone
    ``sgais worker``).  Returns the watcher thread, or None."""
    if parent is None:
        raw = os.environ.get(PARENT_ENV, "")
        if not raw.isdigit():
            return None
        parent = int(raw)
    set_parent_death_signal(signal.SIGTERM)

    def watch() -> None:
        # keeps watching after a stop for another reason: the parent-death SIGTERM sets ``stop`` first, and a
        # graceful stop that then hangs must still end in the hard exit below
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        log.warning("worker: supervisor %d is gone; stopping", parent)
        stop.set()
        hard = threading.Timer(grace_seconds, lambda: os._exit(1))
        hard.daemon = True  # a worker that stopped in time exits without waiting for it
        hard.start()

    thread = threading.Thread(target=watch, name="sgais-lifeline", daemon=True)
    thread.start()
    return thread
