"""End to end over real HTTP: ``sgais serve`` in a subprocess (embedded Redis), the Python client,
and the quick demo (one series, two models) with its plots and summary."""

from __future__ import annotations

import csv
import math
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from service.client import ApiError, SgaisClient
from service.demo import free_port, local_service, run_demo
from tests.conftest import wait_until

SAMPLER = {"particles": 10, "burn_in": 5, "block_size": 10, "seed": 1}


@pytest.fixture(scope="module")
def service_url():
    with local_service(workers=1) as url:
        yield url


def test_demo_past_its_time_limit_reports_what_it_has_and_what_is_missing(service_url, tmp_path):
    """Issue 9 §6: a time limit never discards finished work.  With a limit shorter than the report's reserve
    the demo stops waiting at once: it still writes the summary and the plot, and names what is missing."""
    result = run_demo(tmp_path, quick=True, url=service_url, timeout=1.0)
    assert result["missing"] and set(result["missing"]) == {"UKCoalEmploy"}
    assert set(result["missing"]["UKCoalEmploy"]) == {"ar1", "gmm1"}
    assert "**Incomplete**" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "summary.csv").exists() and list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_quick_demo_writes_plots_summary_and_alerts(service_url, tmp_path):
    result = run_demo(tmp_path, quick=True, url=service_url, timeout=240)
    summary = tmp_path / "summary.csv"
    assert summary.exists() and (tmp_path / "summary.md").stat().st_size > 0
    rows = list(csv.DictReader(summary.open()))
    assert [r["series"] for r in rows] == ["UKCoalEmploy"]
    row = rows[0]
    assert int(row["observations"]) == 105
    assert row["most_probable"] in {"ar1", "gmm1"}
    assert 0.5 <= float(row["probability"]) <= 1.0  # the leader of two models
    for key in ("alerts", "change_point", "evidence_drop", "annealing_spike", "model_switch"):
        assert key in row and int(row[key]) >= 0
    assert math.isfinite(float(row["logZ_ar1"])) and math.isfinite(float(row["logZ_gmm1"]))
    # every degraded model's reason is in the summary, and nothing else is listed there
    text = (tmp_path / "summary.md").read_text()
    listed = re.findall(r"^- UKCoalEmploy (\S+): (.+)$", text, flags=re.M)
    assert sorted(m for m, _ in listed) == sorted(row["degraded"].split())
    assert all(reason != "no reason given" for _, reason in listed)
    png = tmp_path / row["plot"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # the alerts the demo counted are the service's, each with the contract's fields
    with SgaisClient(service_url) as c:
        items = c.alerts(stream=row["stream"])
        post = c.stream_posterior(row["stream"])
    assert len(items) == int(row["alerts"])
    assert sum(a["kind"] == "change_point" for a in items) == int(row["change_point"])
    # the models the summary calls degraded are those the service reports so
    assert row["degraded"].split() == [m["model"].split(".")[-1] for m in post["models"] if m["status"] == "degraded"]
    for a in items:
        assert {
            "id",
            "stream",
            "model",
            "kind",
            "observation_index",
            "detected_at_index",
            "score",
            "message",
            "created_at",
        } <= set(a)
    assert result["seconds"] < 240


def test_client_round_trip_and_errors(service_url):
    with SgaisClient(service_url) as c:
        m = c.create_model("cl-a", stream="cl-s", family="autoregressive", params={"order": 1}, sampler=SAMPLER)
        assert m["name"] == "cl-a" and m["stream"] == "cl-s" and m["sampler"]["block_size"] == 10
        with pytest.raises(ApiError) as err:
            c.create_model("cl-a", stream="cl-s", family="autoregressive", params={"order": 1})
        assert err.value.status == 409
        with pytest.raises(ApiError) as err:
            c.create_model("cl-b", family="autoregressive", params={"order": 1, "nonsense": 2})
        assert err.value.status == 422
        with pytest.raises(ApiError) as err:
            c.get_model("no-such-model")
        assert err.value.status == 404
        assert "cl-a" in [x["name"] for x in c.list_models()]

        # live events: subscribe before posting, collect in a thread
        events: list[dict] = []
        ready = threading.Event()

        def listen():
            gen = c.events("cl-s", timeout=20)
            ready.set()
            for ev in gen:
                events.append(ev)
                if ev.get("type") == "evidence" and ev.get("observations") == 60:
                    return

        t = threading.Thread(target=listen, daemon=True)
        t.start()
        ready.wait(5)
        y = [0.1 * math.sin(i / 3) for i in range(60)]
        ack = c.post_chunk("cl-s", y=y[:30], seq=1)
        assert ack["first_index"] == 0 and ack["n_observations"] == 30 and not ack["duplicate"]
        assert c.post_chunk("cl-s", y=y[:30], seq=1)["duplicate"] is True
        assert c.post_chunk(model="cl-a", y=y[30:], seq=2)["first_index"] == 30
        st = c.wait_until_processed("cl-s", timeout=120)
        assert st["observations"] == 60

        ev = c.evidence("cl-a")
        assert ev["observations"] == 60 and ev["chunks_pending"] == 0
        rows = c.full_trace("cl-a", page=2)  # paging: the 2 first values alone (workers/engine.py), blocks of 10
        assert [r["observations"] for r in rows] == [1, 2, 12, 22, 30, 40, 50, 60]
        assert rows[-1]["log_evidence"] == pytest.approx(ev["log_evidence"])
        assert c.posterior("cl-a")["parameters"]
        assert c.stream_posterior("cl-s")["models"][0]["probability"] == pytest.approx(1.0)
        t.join(30)
        assert any(e.get("type") == "evidence" for e in events), events

        c.delete_model("cl-a")
        with pytest.raises(ApiError) as err:
            c.evidence("cl-a")
        assert err.value.status == 404


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slow
def test_serve_stops_its_workers_and_embedded_redis_on_sigterm(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from service.cli import app; app()",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
            "--workers",
            "1",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, SGAIS_API_KEYS=""),
    )
    try:
        with SgaisClient(f"http://127.0.0.1:{port}") as c:
            wait_until(lambda: proc.poll() is not None or c.readyz(), timeout=120)
        assert proc.poll() is None, log.read_text()
        url = re.search(r"embedded Redis at (\S+)", log.read_text()).group(1)
        redis_pid = int(redis.Redis.from_url(url).info("server")["process_id"])
        workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(workers) == 1 and _alive(redis_pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        wait_until(lambda: not any(_alive(pid) for pid in [*workers, redis_pid]), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
