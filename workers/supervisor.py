"""Supervision of worker processes for ``sgais serve`` (issue 11).

:class:`Supervisor` starts N worker processes and restarts any that dies, after an exponential backoff
(``restart_backoff_seconds`` doubled per death that came within :data:`HEALTHY_SECONDS` of its start, at
most ``restart_backoff_max_seconds``), logging the exit code or signal.  A model that crashes every worker
that takes it is quarantined by the workers themselves (:mod:`workers.quarantine`), so a crash loop ends
after ``max_block_attempts`` deaths; the backoff keeps the loop cheap meanwhile.  Each child gets
``SGAIS_PARENT_PID`` and exits when this process dies (:mod:`workers.lifeline`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("sgais.supervisor")

HEALTHY_SECONDS = 60.0  # a worker that lived this long resets its slot's backoff


def describe_exit(code: int) -> str:
    """``Popen.returncode`` in words: ``exit code 1`` or ``killed by SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def backoff(deaths: int, base: float, cap: float) -> float:
    """Delay before a restart after ``deaths`` consecutive quick deaths (1 = the first): ``min(base·2^(k-1), cap)``."""
    return min(base * 2.0 ** max(deaths - 1, 0), cap)


class Supervisor:
    """Keep ``count`` worker processes alive (a thread of the serving process).

    ``command``: the worker's argv (default ``python -m workers.runner``); ``env``: its environment
    (``SGAIS_PARENT_PID`` is added, unset values are left out).  ``start()`` launches them and the watch
    thread; ``stop()`` stops the restarts, sends SIGTERM, waits ``timeout`` seconds and SIGKILLs what is left.
    """

    def __init__(
        self,
        count: int,
        env: Mapping[str, str | None],
        *,
        command: Sequence[str] | None = None,
        base_seconds: float = 1.0,
        max_seconds: float = 60.0,
        poll_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.count = count
        self.command = list(command or [sys.executable, "-m", "workers.runner"])
        self.env = {**{k: v for k, v in env.items() if v is not None}, "SGAIS_PARENT_PID": str(os.getpid())}
        self.base, self.cap, self.poll = base_seconds, max_seconds, poll_seconds
        self.clock = clock
        self.children: list[subprocess.Popen | None] = [None] * count
        self.started_at = [0.0] * count
        self.deaths = [0] * count  # consecutive quick deaths per slot
        self.due = [0.0] * count  # when a dead slot may restart
        self.restarts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _spawn(self, slot: int) -> None:
        child = subprocess.Popen(self.command, env=self.env)
        self.children[slot], self.started_at[slot] = child, self.clock()
        log.info("worker slot %d: started pid %d", slot, child.pid)

    def start(self) -> None:
        with self._lock:
            for slot in range(self.count):
                self._spawn(slot)
        # PR_SET_PDEATHSIG fires when the *thread* that forked a child exits: the first children come from
        # the caller's (main) thread, restarts from the watch thread; both live until stop().
        self._thread = threading.Thread(target=self._watch, name="sgais-supervisor", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """One pass: reap dead children, schedule and perform restarts that are due."""
        now = self.clock()
        with self._lock:
            if self._stop.is_set():
                return
            for slot, child in enumerate(self.children):
                if child is not None:
                    code = child.poll()
                    if code is None:
                        continue
                    lived = now - self.started_at[slot]
                    self.deaths[slot] = 1 if lived >= HEALTHY_SECONDS else self.deaths[slot] + 1
                    delay = backoff(self.deaths[slot], self.base, self.cap)
                    self.due[slot] = now + delay
                    self.children[slot] = None
                    log.warning(
                        "worker slot %d: pid %d died (%s) after %.1f s; restarting in %.1f s",
                        slot, child.pid, describe_exit(code), lived, delay,
                    )  # fmt: skip
                elif now >= self.due[slot]:
                    self._spawn(slot)
                    self.restarts += 1

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.check()
            except OSError as err:  # e.g. fork failed under memory pressure: try again next pass
                log.error("supervisor: %s", err)

    def pids(self) -> list[int]:
        with self._lock:
            return [c.pid for c in self.children if c is not None]

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._stop.set()
            alive = [c for c in self.children if c is not None]
        for child in alive:
            child.terminate()
        for child in alive:
            try:
                child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
