"""The worker's lifeline (workers/lifeline.py): once its supervisor is gone the worker exits, even when its
graceful stop hangs and the stop was already requested by the parent-death SIGTERM (which, arriving first,
made the watcher return without arming the hard exit: a worker outlived a SIGKILLed ``sgais serve`` by more
than 90 s in a loaded CI run, test_supervision.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]

# the worker: SIGTERM (the parent-death signal) sets its stop, as in workers/runner.py; its graceful stop hangs
WORKER = textwrap.dedent(
    """
    import signal, sys, threading, time
    from workers import lifeline
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # as workers/runner.py
    lifeline.watch_parent(stop, int(sys.argv[1]), poll_seconds=0.5, grace_seconds=0.5)
    print("watching", flush=True)
    time.sleep(600)  # a graceful stop that never finishes
    """
)
# the supervisor: starts the worker, waits until it watches, prints its pid and dies
SUPERVISOR = textwrap.dedent(
    """
    import os, subprocess, sys
    cmd = [sys.executable, "-c", sys.argv[1], str(os.getpid())]  # the supervisor's pid, as SGAIS_PARENT_PID gives it
    w = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    w.stdout.readline()  # the worker watches its supervisor: die now
    print(w.pid, flush=True)
    """
)


def _running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_whose_stop_was_requested_still_exits_when_its_supervisor_dies() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", SUPERVISOR, WORKER], env=env, capture_output=True, text=True, timeout=60
    )
    pid = int(out.stdout.split()[0])
    try:
        # grace 0.5 s after the parent is seen gone; the minute only absorbs a busy machine's start-up
        wait_until(lambda: not _running(pid), timeout=60, interval=0.1)
    finally:
        if _running(pid):
            os.kill(pid, 9)
