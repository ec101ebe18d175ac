"""A real Prometheus (Debian's ``prometheus``) scrapes a real API and a real worker on loopback, evaluates
``deploy/sgais.rules.yml`` and sends the change-point alert through Debian's ``prometheus-alertmanager`` to a
webhook receiver run by the test (issue 14).

Every process is started by a fixture and stopped by its finalizer (SIGTERM, then SIGKILL after 10 s).
Short scrape and evaluation intervals (1 s) keep the test quick; every wait is on a condition with a
generous timeout (CI is a busy 2-core machine).  The tests skip only where a binary is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from service.demo import free_port
from tests.conftest import wait_until
from tests.integration.helpers import linear_chunks

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "sgais.rules.yml"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
METRICS_KEY = "metrics-key-for-the-test"
API_KEY = "key-t1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not installed (Debian package prometheus)"),
]


def spawn(request, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` with its output in ``log``; the test's finalizer stops it."""
    fh = log.open("w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)

    def stop():
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        fh.close()

    request.addfinalizer(stop)
    return proc


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90.0, **kwargs) -> None:
    def up():
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(url, timeout=5, **kwargs).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(up, timeout=timeout, interval=0.3)


@pytest.fixture
def sgais(request, redis_url, key_prefix, tmp_path):
    """The API (``sgais serve --workers 0``, API keys and a metrics key) and one standalone worker with
    its own metrics port, both on loopback. Yields ``(api_url, worker_metrics_port)``."""
    if redis_url.startswith("unix://"):
        pytest.skip("needs a TCP Redis (SGAIS_TEST_REDIS_URL) shared by separate processes")
    api_port, worker_port = free_port(), free_port()
    env = dict(
        os.environ,
        SGAIS_KEY_PREFIX=key_prefix,
        SGAIS_API_KEYS=f"t1={API_KEY}",
        SGAIS_METRICS_KEY=METRICS_KEY,
        SGAIS_HEARTBEAT_SECONDS="0.5",
        SGAIS_LEASE_TTL_SECONDS="120",  # the re-annealing block after the shift may be long on a loaded machine
        OMP_NUM_THREADS="1",
    )
    cli = [sys.executable, "-c", "from service.cli import app; app()"]
    api_log, worker_log = tmp_path / "api.log", tmp_path / "worker.log"
    api = spawn(
        request,
        [*cli, "serve", "--host", "127.0.0.1", "--port", str(api_port), "--workers", "0", "--redis-url", redis_url],
        api_log,
        env,
    )
    worker = spawn(
        request, [*cli, "worker", "--redis-url", redis_url, "--metrics-port", str(worker_port)], worker_log, env
    )
    url = f"http://127.0.0.1:{api_port}"
    wait_http(f"{url}/readyz", api, api_log)  # ready = Redis reachable and the worker's heartbeat fresh
    wait_http(f"http://127.0.0.1:{worker_port}/metrics", worker, worker_log)
    return url, worker_port


class Webhook:
    """Alertmanager's webhook receiver: collects the JSON notifications posted to it (loopback)."""

    def __init__(self):
        self.notifications: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def alerts(self, name: str) -> list[dict]:
        return [a for n in self.notifications for a in n["alerts"] if a["labels"].get("alertname") == name]


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def alertmanager(request, tmp_path, webhook):
    if ALERTMANAGER is None:
        pytest.skip("alertmanager binary not installed (Debian package prometheus-alertmanager)")
    port = free_port()
    config = {
        "route": {"receiver": "test", "group_by": ["alertname", "stream"], "group_wait": "1s", "group_interval": "1s"},
        "receivers": [{"name": "test", "webhook_configs": [{"url": webhook.url, "send_resolved": False}]}],
    }
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(config))
    log = tmp_path / "alertmanager.log"
    proc = spawn(
        request,
        [
            ALERTMANAGER,
            f"--config.file={cfg}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port
        ],
        log,
    )
    wait_http(f"http://127.0.0.1:{port}/-/ready", proc, log)
    return f"127.0.0.1:{port}"


def start_prometheus(request, tmp_path, api_url: str, worker_port: int, alertmanager: str | None) -> str:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "sgais-api",
                "authorization": {"credentials": METRICS_KEY},
                "static_configs": [{"targets": [api_url.removeprefix("http://")]}],
            },
            {"job_name": "sgais-worker", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
        ],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config))
    check = subprocess.run([shutil.which("promtool") or "promtool", "check", "config", str(cfg)], capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log = tmp_path / "prometheus.log"
    proc = spawn(
        request,
        [
            PROMETHEUS,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/-/ready", proc, log)
    return url


def query(prom: str, promql: str) -> list[dict]:
    res = httpx.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert res["status"] == "success", res
    return res["data"]["result"]


def api(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)


MODEL = {"family": "linear_regression", "params": {"features": 2}}
SAMPLER = {"particles": 10, "burn_in": 5, "block_size": 50, "seed": 3}


def caught_up(c: httpx.Client, stream: str, chunks: int):
    body = c.get(f"/v1/streams/{stream}").json()
    return all(m["chunks_processed"] == chunks for m in body["models"]) and body


def test_prometheus_scrapes_api_and_worker_and_fires_change_point_through_alertmanager(
    request, tmp_path, sgais, alertmanager, webhook
):
    api_url, worker_port = sgais
    prom = start_prometheus(request, tmp_path, api_url, worker_port, alertmanager)
    first, second = linear_chunks(2, 200, seed=5)
    second["y"] = [v + 8.0 for v in second["y"]]  # a change the evidence-drop detector sees
    with api(api_url) as c:
        for name, seed in (("lin-a", 3), ("lin-b", 4)):
            body = {"name": name, "stream": "cp", **MODEL, "sampler": {**SAMPLER, "seed": seed}}
            assert c.post("/v1/models", json=body).status_code == 201
        assert c.post("/v1/streams/cp/chunks", json=first).status_code == 202
        wait_until(lambda: caught_up(c, "cp", 1), timeout=180)
        # both targets up, the per-model series and the zero alert counter of the stream are in Prometheus
        wait_until(lambda: len(query(prom, "up == 1")) == 2, timeout=60, interval=0.5)
        wait_until(lambda: query(prom, 'sgais_stream_alerts_total{stream="cp",kind="evidence_drop"} == 0'), 60, 0.5)
        # Prometheus holds the value of its last scrape, which may predate the chunk's commit on a busy machine
        # (the model's log-evidence is 0 between its lease and its first block): wait for a scrape after it
        own = {m: c.get(f"/v1/models/{m}/evidence").json()["log_evidence"] for m in ("lin-a", "lin-b")}

        def scraped_after_commit():
            series = query(prom, 'sgais_log_evidence{stream="cp",tenant="t1"}')
            got = {s["metric"]["model"]: float(s["value"][1]) for s in series}
            return got if set(got) == set(own) and all(abs(got[m] - own[m]) <= 1e-9 for m in own) else None

        wait_until(scraped_after_commit, 60, 0.5)
        probs = wait_until(lambda: query(prom, 'sgais_model_probability{stream="cp"}'), 60, 0.5)
        assert sum(float(s["value"][1]) for s in probs) == pytest.approx(1.0, abs=1e-9)
        assert query(prom, 'sgais_model_status{stream="cp",status="ok"} == 1')
        # the worker's own endpoint: its blocks and observations
        assert wait_until(lambda: query(prom, 'sgais_worker_observations_total{job="sgais-worker"} >= 400'), 60, 0.5)
        # a recording rule evaluated
        assert wait_until(lambda: query(prom, 'sgais_stream:model_probability:max{stream="cp"}'), 60, 0.5)

        assert c.post("/v1/streams/cp/chunks", json=second).status_code == 202
        wait_until(lambda: caught_up(c, "cp", 2), timeout=180)
        raised = c.get("/v1/alerts", params={"stream": "cp"}).json()["items"]
        assert raised, "the +8 shift raised no alert"
    drops = sum(1 for a in raised if a["kind"] == "evidence_drop")
    assert drops >= 1
    # the counter reaches the API's count (a scrape may fall between two of the alerts' commits)
    wait_until(
        lambda: query(prom, f'sgais_stream_alerts_total{{stream="cp",kind="evidence_drop"}} == {drops}'), 60, 0.5
    )
    firing = wait_until(lambda: query(prom, 'ALERTS{alertname="SgaisChangePoint",alertstate="firing"}'), 90, 0.5)
    assert [(a["metric"]["tenant"], a["metric"]["stream"]) for a in firing] == [("t1", "cp")]
    delivered = wait_until(lambda: webhook.alerts("SgaisChangePoint"), timeout=90, interval=0.5)
    assert delivered[0]["labels"]["stream"] == "cp" and delivered[0]["labels"]["tenant"] == "t1"
    assert delivered[0]["status"] == "firing" and "cp" in delivered[0]["annotations"]["summary"]


def test_prometheus_without_the_metrics_key_sees_only_aggregates(request, tmp_path, sgais):
    api_url, worker_port = sgais
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "anon", "static_configs": [{"targets": [api_url.removeprefix("http://")]}]}],
    }
    cfg = tmp_path / "anon.yml"
    cfg.write_text(yaml.safe_dump(config))
    log = tmp_path / "anon.log"
    proc = spawn(
        request,
        [
            PROMETHEUS,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb-anon'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log,
    )
    prom = f"http://127.0.0.1:{port}"
    wait_http(f"{prom}/-/ready", proc, log)
    with api(api_url) as c:
        body = {"name": "hidden", **MODEL, "sampler": SAMPLER}
        assert c.post("/v1/models", json=body).status_code == 201
    try:
        wait_until(lambda: query(prom, 'sum(sgais_models{status=~"pending|ok"}) == 1'), timeout=60, interval=0.5)
    except AssertionError:
        targets = httpx.get(f"{prom}/api/v1/targets").json()["data"]["activeTargets"]
        raise AssertionError(f"targets: {[t['lastError'] for t in targets]}") from None
    assert query(prom, '{tenant!=""}') == [] and query(prom, '{model!=""}') == []
