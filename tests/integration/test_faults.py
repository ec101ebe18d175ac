"""Fault injection against a real server, worker and Redis (issue 11, acceptance 2; hardening review).

One stack for the module: a ``redis-server`` on a free port (AOF on, so a kill and restart keeps the data),
the API under uvicorn (``service.app:app_from_env``, no worker threads) and one standalone worker process
(``python -m workers.runner``).  Tenant ``beta`` attacks; after each attack the probe checks that tenant
``alpha``'s model absorbs a new chunk within 60 s.  Every HTTP status the suite sees is recorded: no 5xx
other than the 503s asked for while Redis is stopped.  Timing assertions are relative (a /healthz answered
while a large body is parsed) or generous (seconds), never sub-second.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import SMALL_MODEL, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")]
ROOT = Path(__file__).resolve().parents[2]
A, B = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """The processes under test, and every HTTP status seen."""

    def __init__(self, tmp: Path):
        self.tmp, self.redis_port, self.api_port = tmp, free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.statuses: list[tuple[str, int]] = []
        self.allowed_503 = False
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SGAIS_REDIS_URL": self.redis_url,
            "SGAIS_API_KEYS": "alpha=ka,beta=kb",
            "SGAIS_KEY_PREFIX": f"faults-{uuid.uuid4().hex[:6]}",
            "SGAIS_WORKERS": "0",
            "SGAIS_HEARTBEAT_SECONDS": "0.5",
            "SGAIS_MAX_BODY_BYTES": str(16 * 2**20),
            "SGAIS_MAX_MODELS_PER_TENANT": "25",
            "SGAIS_WS_QUEUE_SIZE": "64",
            # 1 s rather than the 0.5 s default: slow replies of a Redis on a loaded machine are not outages
            "SGAIS_API_REDIS_TIMEOUT_SECONDS": "1.0",
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def start_redis(self) -> None:
        self.procs["redis"] = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.tmp),
                "--appendonly",
                "yes",
                "--save",
                "",
            ],
            stdout=open(self.tmp / "redis.log", "a"),
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self._ping(), timeout=30)

    def _ping(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.redis_url, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def start(self) -> None:
        self.start_redis()
        self.procs["api"] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "service.app:app_from_env",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.api_port),
                "--log-level",
                "warning",
            ],
            env=self.env,
            cwd=ROOT,
            stdout=open(self.tmp / "api.log", "w"),
            stderr=subprocess.STDOUT,
        )
        self.procs["worker"] = subprocess.Popen(
            [sys.executable, "-m", "workers.runner"],
            env=self.env,
            cwd=ROOT,
            stdout=open(self.tmp / "worker.log", "w"),
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self._up(), timeout=60, interval=0.2)

    def _up(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        for name in ("worker", "api", "redis"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                if name == "redis":
                    os.kill(p.pid, signal.SIGCONT)
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        res = httpx.request(method, self.url + path, timeout=kw.pop("timeout", 60), **kw)
        self.statuses.append((f"{method} {path}", res.status_code))
        if res.status_code >= 500:
            assert res.status_code == 503 and self.allowed_503, (method, path, res.status_code, res.text[:300])
        return res

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def stack():
    tmp = Path(tempfile.mkdtemp(prefix="sgais-faults-"))
    s = Stack(tmp)
    try:
        s.start()
        res = s.request("POST", "/v1/models", json={"name": "probe", **SMALL_MODEL}, headers=A)
        assert res.status_code == 201, res.text
        s.probe_seq = 0
        yield s
    finally:
        s.stop()
        for name in ("api", "worker"):
            if (tmp / f"{name}.log").exists():
                sys.stdout.write(f"--- {name}.log (tail) ---\n" + s.log(name)[-3000:] + "\n")
        shutil.rmtree(tmp, ignore_errors=True)


def probe(s: Stack) -> None:
    """Tenant alpha's model absorbs a new chunk within 60 s."""
    s.probe_seq += 1
    chunk = {"seq": s.probe_seq, "x": [[0.5, -1.0], [1.5, 2.0]], "y": [0.3, 4.1]}
    assert s.request("POST", "/v1/streams/probe/chunks", json=chunk, headers=A).status_code == 202
    wait_until(
        lambda: s.request("GET", "/v1/models/probe/evidence", headers=A).json()["chunks_processed"] == s.probe_seq,
        timeout=60,
        interval=0.5,
    )


def test_unrunnable_models_are_refused(stack):
    """F1: sampler.device cuda on a CPU host, a gmm of dim 1000 x 1000 components: 422 naming the field."""
    res = stack.request(
        "POST",
        "/v1/models",
        headers=B,
        json={"name": "gpu", "family": "gmm", "params": {"dim": 1, "components": 1}, "sampler": {"device": "cuda"}},
    )
    assert res.status_code == (201 if _has_cuda() else 422)
    if res.status_code == 422:
        assert res.json()["detail"][0]["loc"] == ["body", "sampler", "device"]
    res = stack.request(
        "POST",
        "/v1/models",
        headers=B,
        json={"name": "huge", "family": "gmm", "params": {"dim": 1000, "components": 1000}},
    )
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["body", "params"]
    res = stack.request(
        "POST",
        "/v1/models",
        headers=B,
        json={
            "name": "slow",
            "family": "gmm",
            "params": {"dim": 1, "components": 1},
            "sampler": {"burn_in": 10000, "particles": 1000, "warmup_particles": 1000},
        },
    )
    assert res.status_code == 422 and "burn_in" in res.json()["detail"][0]["loc"]
    probe(stack)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_poisoned_stream_is_refused_then_deleted(stack):
    """F4: 1e308 is 422 naming the row; the stream stays usable; DELETE /v1/streams removes it."""
    for name in ("p1", "p2"):
        body = {"name": name, "stream": "ps", "family": "gmm", "params": {"dim": 1, "components": 1}}
        assert stack.request("POST", "/v1/models", headers=B, json=body).status_code == 201
    res = stack.request("POST", "/v1/streams/ps/chunks", headers=B, json={"y": [0.2, 1e308, -1e308]})
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["body", "y", 1]
    assert stack.request("POST", "/v1/streams/ps/chunks", headers=B, json={"y": [0.1, 0.2, 0.3]}).status_code == 202
    wait_until(
        lambda: all(
            stack.request("GET", f"/v1/models/{m}/evidence", headers=B).json()["chunks_processed"] == 1
            for m in ("p1", "p2")
        ),
        timeout=60,
        interval=0.5,
    )
    assert stack.request("GET", "/v1/models/p1/evidence", headers=B).json()["status"] == "ok"
    assert stack.request("DELETE", "/v1/streams/ps", headers=A).status_code == 404  # tenant-scoped
    assert stack.request("DELETE", "/v1/streams/ps", headers=B).status_code == 204
    assert stack.request("GET", "/v1/models/p1", headers=B).status_code == 404
    probe(stack)


def test_delete_stream_while_the_worker_holds_its_models(stack):
    """A worker holding a deleted stream's models drops them without error and goes on with the others."""
    body = {"name": "busy", "stream": "ds", **SMALL_MODEL, "sampler": {**SMALL_MODEL["sampler"], "block_size": 10}}
    assert stack.request("POST", "/v1/models", headers=B, json=body).status_code == 201
    # data inside the default prior's scale (w0 = 2 on x0 in [0, 2]): the model must run, not fail. (The first
    # version, w0 = 5 on x0 up to 20, diverges in the engine v2 SGHMC with blocks of 10: issue 10's prior-data
    # conflict, not what this test is about.)
    rows = {"x": [[0.01 * i, 1.0] for i in range(200)], "y": [0.02 * i for i in range(200)]}
    for _ in range(3):
        assert stack.request("POST", "/v1/streams/ds/chunks", headers=B, json=rows).status_code == 202
    wait_until(
        lambda: stack.request("GET", "/v1/models/busy/evidence", headers=B).json()["observations"] > 0,
        timeout=60,
        interval=0.2,
    )
    assert stack.request("DELETE", "/v1/streams/ds", headers=B).status_code == 204
    r = redis.Redis.from_url(stack.redis_url)
    probe(stack)
    time.sleep(2)  # a commit of the deleted model, had it not been fenced, would have landed by now
    assert not [k for k in r.scan_iter(match=f"{stack.env['SGAIS_KEY_PREFIX']}:beta:*ds*")]
    assert not [k for k in r.scan_iter(match=f"{stack.env['SGAIS_KEY_PREFIX']}:beta:*busy*")]
    assert stack.procs["worker"].poll() is None and "Traceback" not in stack.log("worker")


def test_hostile_bodies_are_4xx(stack):
    """F8, F12: non-UTF-8, NaN/Infinity, integers beyond float range, text/plain, lax types."""
    assert (
        stack.request(
            "POST", "/v1/models", headers=B, json={"name": "hb", "family": "gmm", "params": {"dim": 1, "components": 1}}
        ).status_code
        == 201
    )
    huge = "1" + "0" * 400
    J = {**B, "content-type": "application/json"}
    cases = [
        ("/v1/streams/hb/chunks", b'{"y":[1.0], "\xff": 1}', J, 400),
        ("/v1/streams/hb/chunks", '{"y": [' + huge + "]}", J, 422),
        ("/v1/streams/hb/chunks", '{"y": [1.0]}', {**B, "content-type": "text/plain"}, 415),
        ("/v1/models", "NaN", J, 422),
        ("/v1/models", '{"name": "q", "family": "gmm", "prior_probability": Infinity}', J, 422),
        ("/v1/models", '{"name": "q", "family": "gmm", "params": {"dim": "2", "components": 1}}', J, 422),
    ]
    for path, body, headers, status in cases:
        assert stack.request("POST", path, content=body, headers=headers).status_code == status, (path, body)
    assert stack.request("GET", "/v1/streams/hb", headers=B).json()["chunks"] == 0
    probe(stack)


def test_large_body_does_not_stall_the_loop(stack):
    """F7: a 12 MB chunk (3 M numbers, over max_chunk_observations) is parsed off the event loop: /healthz
    answers while it is parsed, in a small fraction of its time; a 20 MB body streamed without a length is
    413 while it is read."""
    big = ('{"y": [' + "0.1," * 3_000_000 + "0.1]}").encode()
    done: dict[str, float] = {}

    def post():
        t0 = time.monotonic()
        res = stack.request(
            "POST",
            "/v1/streams/probe/chunks",
            content=big,
            headers={**A, "content-type": "application/json"},
            timeout=300,
        )
        done["status"], done["seconds"] = res.status_code, time.monotonic() - t0

    t = threading.Thread(target=post)
    t.start()
    latencies = []
    while t.is_alive():
        t0 = time.monotonic()
        stack.request("GET", "/healthz")
        latencies.append(time.monotonic() - t0)
        time.sleep(0.05)
    t.join()
    assert done["status"] == 413
    assert len(latencies) >= 3 and max(latencies) < done["seconds"] / 2, (latencies, done)

    def parts():
        for _ in range(20):
            yield b"0.1," * 250_000  # 1 MB each

    res = stack.request(
        "POST", "/v1/streams/probe/chunks", content=parts(), headers={**A, "content-type": "application/json"}
    )
    assert res.status_code == 413
    probe(stack)


def test_model_quota(stack):
    """F11: a tenant over its model quota (25 here) gets 429; other tenants are unaffected."""
    have = len(stack.request("GET", "/v1/models", headers=B).json()["items"])
    codes = [
        stack.request(
            "POST",
            "/v1/models",
            headers=B,
            json={"name": f"q{i}", "stream": "qs", "family": "gmm", "params": {"dim": 1, "components": 1}},
        ).status_code
        for i in range(26 - have)
    ]
    assert codes[:-1] == [201] * (25 - have) and codes[-1] == 429
    assert stack.request("DELETE", "/v1/streams/qs", headers=B).status_code == 204
    probe(stack)


async def _open_sockets(url: str, n: int, stream: str, key: str):
    import websockets

    return [
        await websockets.connect(
            f"{url}/v1/streams/{stream}/events", additional_headers={"Authorization": f"Bearer {key}"}
        )
        for _ in range(n)
    ]


def test_idle_websockets_hold_no_redis_connection(stack):
    """F2: 200 idle sockets of one tenant; every other tenant's HTTP requests still work."""
    assert (
        stack.request(
            "POST", "/v1/models", headers=B, json={"name": "ws", "family": "gmm", "params": {"dim": 1, "components": 1}}
        ).status_code
        == 201
    )
    r = redis.Redis.from_url(stack.redis_url)
    before = len(r.client_list())

    async def run():
        socks = await _open_sockets(stack.url.replace("http", "ws"), 200, "ws", "kb")
        try:
            clients = len(r.client_list())
            for _ in range(5):
                assert (await asyncio.to_thread(stack.request, "GET", "/v1/models", headers=A)).status_code == 200
            await asyncio.to_thread(probe, stack)
            return clients
        finally:
            await asyncio.gather(*(s.close() for s in socks))

    clients = asyncio.run(run())
    assert clients - before <= 5, (before, clients)  # one subscription (plus pooled connections), not 200


def test_slow_reader_gets_a_gap(stack):
    """F9: a socket that stops reading gets {"type": "gap", ...} instead of the events it missed; a reader
    that keeps up on the same stream gets every event."""
    import websockets

    assert (
        stack.request(
            "POST", "/v1/models", headers=B, json={"name": "sr", "family": "gmm", "params": {"dim": 1, "components": 1}}
        ).status_code
        == 201
    )
    channel = f"{stack.env['SGAIS_KEY_PREFIX']}:beta:events:sr"
    r = redis.Redis.from_url(stack.redis_url)
    pad = "x" * 2000
    n = 6000

    async def run():
        ws = stack.url.replace("http", "ws") + "/v1/streams/sr/events"
        slow = await websockets.connect(ws, additional_headers=B, max_queue=1)
        fast = await websockets.connect(ws, additional_headers=B)
        got_fast: list[dict] = []

        async def read_fast():  # until the last event, or 20 s of silence
            while True:
                try:
                    event = json.loads(await asyncio.wait_for(fast.recv(), 20))
                except TimeoutError:
                    return
                got_fast.append(event)
                if event.get("last_block", {}).get("first_index") == n - 1:
                    return

        def publish():
            pipe = r.pipeline(transaction=False)
            for i in range(n):  # synthetic evidence events of model "sr", 2 KB each (12 MB in all)
                event = {
                    "type": "evidence",
                    "model": "sr",
                    "observations": i + 1,
                    "last_block": {"first_index": i},
                    "pad": pad,
                }
                pipe.publish(channel, json.dumps(event))
            pipe.execute()

        reader = asyncio.create_task(read_fast())
        await asyncio.to_thread(publish)
        await asyncio.wait_for(reader, 300)
        got_slow = []
        while True:
            try:
                got_slow.append(json.loads(await asyncio.wait_for(slow.recv(), 10)))
            except TimeoutError:
                break
        await slow.close()
        await fast.close()
        return got_fast, got_slow

    got_fast, got_slow = asyncio.run(run())
    fast_evidence = [e["last_block"]["first_index"] for e in got_fast if e["type"] == "evidence"]
    gaps_fast = [e for e in got_fast if e["type"] == "gap"]
    # the fast reader either got every event in order, or was told where it lost some
    assert fast_evidence == list(range(n)) or gaps_fast
    gaps = [e for e in got_slow if e["type"] == "gap"]
    assert gaps and gaps[0]["model"] == "sr" and isinstance(gaps[0]["since_index"], int)
    seen = [e["last_block"]["first_index"] for e in got_slow if e["type"] == "evidence"]
    # nothing is lost silently: every event the slow socket did not get is at or after a gap's since_index
    missing = sorted(set(range(n)) - set(seen))
    assert missing and min(g["since_index"] for g in gaps) <= missing[0]
    probe(stack)


def test_redis_frozen_and_down_is_503(stack):
    """F6: Redis SIGSTOP, then killed: every route answers 503 with Retry-After well before redis-py's
    5 s default timeout; /readyz too; after a restart (AOF) the probe passes again."""
    rp = stack.procs["redis"]
    stack.allowed_503 = True
    try:
        os.kill(rp.pid, signal.SIGSTOP)
        for method, path in [
            ("GET", "/v1/models"),
            ("GET", "/v1/models/probe/evidence"),
            ("GET", "/v1/alerts"),
            ("POST", "/v1/streams/probe/chunks"),
            ("DELETE", "/v1/streams/zz"),
            ("GET", "/readyz"),
        ]:
            t0 = time.monotonic()
            kw = {"json": {"x": [[1, 2]], "y": [1.0]}} if method == "POST" else {}
            res = stack.request(method, path, headers=A, **kw)
            assert res.status_code == 503, (path, res.text)
            assert path == "/readyz" or res.headers["retry-after"] == "1"
            assert time.monotonic() - t0 < 4.5, path  # 1 s socket timeout, no retries (was 5 s x retries, then 500)
        os.kill(rp.pid, signal.SIGCONT)
        wait_until(lambda: stack.request("GET", "/v1/models", headers=A).status_code == 200, timeout=30)
        rp.terminate()
        rp.wait(30)
        res = stack.request("GET", "/v1/models/probe", headers=A)
        assert res.status_code == 503 and res.headers["retry-after"] == "1"
        stack.start_redis()
        wait_until(lambda: stack.request("GET", "/readyz").status_code == 200, timeout=60, interval=0.5)
    finally:
        if stack.procs["redis"].poll() is None:
            os.kill(stack.procs["redis"].pid, signal.SIGCONT)
        stack.allowed_503 = False
    probe(stack)


def test_no_server_errors_seen(stack):
    """Every response of the suite: no 5xx but the 503s while Redis was stopped; the worker never died."""
    bad = [(what, code) for what, code in stack.statuses if code >= 500 and code != 503]
    assert not bad
    assert stack.procs["worker"].poll() is None
    assert "Traceback" not in stack.log("api"), stack.log("api")[-3000:]
