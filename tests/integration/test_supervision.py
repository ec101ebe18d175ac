"""Crash loops end in quarantine; ``sgais serve`` restarts dead workers and its workers die with it (issue 11).

Real processes throughout: worker subprocesses SIGKILLed mid-block, ``sgais serve`` started as a
subprocess and SIGKILLed.  Every wait is on a condition with a generous timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import linear_chunks
from workers.quarantine import attempts_key
from workers.store.keys import Keys
from workers.supervisor import Supervisor, backoff, describe_exit

# ~16 annealing steps x 3000 SGHMC steps: tens of seconds per block, so the worker is surely mid-block when killed
CRASHY = {**SMALL_MODEL, "sampler": {**SMALL_MODEL["sampler"], "burn_in": 3000, "moves": "every_step", "seed": 8}}


def worker_env(settings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "SGAIS_REDIS_URL": settings.redis_url,
        "SGAIS_KEY_PREFIX": settings.key_prefix,
        "SGAIS_LEASE_TTL_SECONDS": "2",
        "SGAIS_HEARTBEAT_SECONDS": "0.2",
        "SGAIS_POLL_SECONDS": "0.1",
        **extra,
    }


def start_worker(settings, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.runner"],
        env=worker_env(settings, **extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def record(r, settings, name):
    return {
        k.decode(): v.decode() for k, v in r.hgetall(attempts_key(Keys(settings.key_prefix), "default", name)).items()
    }


@pytest.mark.slow
def test_a_model_that_kills_its_worker_is_quarantined_after_n_deaths(settings):
    r = redis.Redis.from_url(settings.redis_url)
    chunks = linear_chunks(2, 20, seed=6)
    with TestClient(create_app(settings, workers=0)) as api:
        for name, model, stream in (("crashy", CRASHY, "c"), ("light", SMALL_MODEL, "l")):
            assert api.post("/v1/models", json={"name": name, "stream": stream, **model}).status_code == 201
        assert api.post("/v1/streams/c/chunks", json=chunks[0]).status_code == 202
        assert api.post("/v1/streams/l/chunks", json=chunks[0]).status_code == 202
        kills = 0
        for attempt in (1, 2, 3):  # each worker starts crashy's block (counted first), then dies: SIGKILL
            worker = start_worker(settings, SGAIS_MAX_BLOCK_ATTEMPTS="3")
            try:
                wait_until(
                    lambda a=attempt: (
                        (x := record(r, settings, "crashy")).get("attempts") == str(a)
                        and x.get("what", "").startswith("block")
                    ),
                    timeout=120,
                )
            finally:
                worker.send_signal(signal.SIGKILL)
                worker.wait()
            kills += 1
            assert api.get("/v1/models/crashy/evidence").json()["status"] == "ok"  # not yet quarantined
        # the fourth worker finds 3 failed attempts at crashy's cursor and quarantines it instead of running it
        worker = start_worker(settings, SGAIS_MAX_BLOCK_ATTEMPTS="3")
        try:
            body = wait_until(
                lambda: (e := api.get("/v1/models/crashy/evidence").json())["status"] == "error" and e, timeout=120
            )
            assert (
                body["error"] == "quarantined after 3 failed attempts at the same block; last: the worker process died"
            )
            assert body["chunks_processed"] == 0
            wait_until(lambda: api.get("/v1/models/light/evidence").json()["chunks_processed"] == 1, timeout=60)
            assert api.post("/v1/streams/l/chunks", json=chunks[1]).status_code == 202
            wait_until(lambda: api.get("/v1/models/light/evidence").json()["chunks_processed"] == 2, timeout=60)
            assert worker.poll() is None  # alive: it did not run the model that killed the others
        finally:
            worker.terminate()
            assert worker.wait(timeout=60) == 0
    assert kills == 3


def test_backoff_doubles_per_quick_death_up_to_the_cap():
    assert [backoff(k, 1.0, 10.0) for k in (1, 2, 3, 4, 5, 6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(3) == "exit code 3"


def test_supervisor_restarts_a_killed_worker(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    sup = Supervisor(2, dict(os.environ), command=sleeper, base_seconds=0.2, max_seconds=1.0, poll_seconds=0.1)
    sup.start()
    try:
        first = sup.pids()
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        new = wait_until(lambda: (p := sup.pids()) and len(p) == 2 and first[0] not in p and p, timeout=60)
        assert first[1] in new  # the other worker was left alone
        assert sup.restarts == 1 and sup.deaths[0] == 1
        os.kill(new[0], signal.SIGKILL)  # a second quick death: the next delay doubles
        wait_until(lambda: (p := sup.pids()) and len(p) == 2 and new[0] not in p, timeout=60)
        assert sup.restarts == 2 and sup.deaths[0] == 2
    finally:
        pids = sup.pids()
        sup.stop(timeout=30)
    for pid in pids:
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workers_ready(url: str) -> int:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).json().get("workers", 0)
    except (httpx.HTTPError, ValueError):
        return 0


def _diagnose(pid: int, log_path) -> str:
    """What a worker that outlived its supervisor was doing: its state, parent and threads' kernel waits (from
    /proc), and the tail of the log it shared with ``sgais serve``."""
    lines = []
    try:
        with open(f"/proc/{pid}/status") as f:
            lines += [x.strip() for x in f if x.startswith(("State", "PPid", "Threads", "SigCgt", "SigBlk", "SigPnd"))]
        for task in sorted(os.listdir(f"/proc/{pid}/task")):
            try:
                with open(f"/proc/{pid}/task/{task}/comm") as c, open(f"/proc/{pid}/task/{task}/wchan") as w:
                    lines.append(f"thread {task} {c.read().strip()} waits in {w.read().strip() or '-'}")
            except OSError:  # the thread ended meanwhile
                continue
    except OSError as err:
        lines.append(f"/proc: {err}")
    tail = log_path.read_text(errors="replace").splitlines()[-40:] if log_path.exists() else ["(no log)"]
    return "\n".join([*lines, "--- log tail ---", *tail])


@pytest.mark.slow
def test_serve_restarts_a_dead_worker_and_its_workers_die_with_it(settings, tmp_path):
    port = _free_port()
    log_path = tmp_path / "serve.log"
    env = {
        **os.environ,
        "SGAIS_KEY_PREFIX": settings.key_prefix,
        "SGAIS_HEARTBEAT_SECONDS": "0.5",
        "SGAIS_RESTART_BACKOFF_SECONDS": "0.5",
        "PYTHONPATH": os.getcwd(),
    }
    log_file = open(log_path, "wb")  # serve's and its workers' (inherited) output, for the failure message
    serve = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--redis-url", settings.redis_url],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    worker = None
    try:
        (worker,) = wait_until(lambda: _children(serve.pid), timeout=120)
        wait_until(lambda: _workers_ready(url) >= 1, timeout=120)
        os.kill(worker, signal.SIGKILL)
        restarted = wait_until(lambda: [p for p in _children(serve.pid) if p != worker and _alive(p)], timeout=120)
        assert len(restarted) == 1
        worker = restarted[0]
        assert serve.poll() is None
        # the restarted worker works: it heartbeats
        r = redis.Redis.from_url(settings.redis_url)
        # members are "host-pid-hex": match the pid whole (a substring could match the killed worker's stale entry)
        wait_until(
            lambda: any(f"-{worker}-" in m.decode() for m in r.zrange(f"{settings.key_prefix}:workers", 0, -1)), 60
        )
        serve.send_signal(signal.SIGKILL)  # no cleanup runs in serve: the worker must notice by itself
        serve.wait()
        wait_until(lambda: not _alive(worker), timeout=90)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        log_file.close()
        if worker is not None and _alive(worker):
            diagnosis = _diagnose(worker, log_path)
            os.kill(worker, signal.SIGKILL)
            pytest.fail(f"worker {worker} outlived sgais serve:\n{diagnosis}")
