"""The client-side ``sgais`` commands (models, post, watch formatting) against a real service."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.cli_client import format_event, read_csv_columns
from service.client import SgaisClient
from service.demo import local_service

runner = CliRunner()


@pytest.fixture(scope="module")
def url():
    with local_service(workers=1) as u:
        yield u


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_models_create_list_show_delete(url):
    r = invoke(
        "models",
        "create",
        "cli-m",
        "--family",
        "autoregressive",
        "--params",
        '{"order": 1}',
        "--sampler",
        '{"particles": 10, "burn_in": 5, "block_size": 10}',
        "--url",
        url,
    )
    assert r.exit_code == 0, r.output
    assert '"cli-m"' in r.output
    r = invoke("models", "create", "cli-m", "--family", "autoregressive", "--params", '{"order": 1}', "--url", url)
    assert r.exit_code == 1 and "409" in r.output
    r = invoke("models", "list", "--url", url)
    assert r.exit_code == 0 and "cli-m" in r.output
    r = invoke("models", "create", "cli-bad", "--family", "autoregressive", "--params", "{not json", "--url", url)
    assert r.exit_code != 0
    r = invoke("models", "delete", "cli-m", "--url", url)
    assert r.exit_code == 0
    r = invoke("models", "show", "cli-m", "--url", url)
    assert r.exit_code == 1 and "404" in r.output


@pytest.mark.slow
def test_post_csv_in_chunks(url, tmp_path):
    csv_path = tmp_path / "data.csv"
    lines = ["t,a,b,y"] + [f"{i},{i * 0.1:.2f},{(-1) ** i},{0.5 * i - 1:.3f}" for i in range(23)]
    csv_path.write_text("\n".join(lines) + "\n")
    r = invoke(
        "models",
        "create",
        "cli-lr",
        "--stream",
        "cli-lr-s",
        "--family",
        "linear_regression",
        "--params",
        '{"features": 2}',
        "--sampler",
        '{"particles": 10, "burn_in": 5, "block_size": 10}',
        "--url",
        url,
    )
    assert r.exit_code == 0, r.output
    r = invoke(
        "post",
        str(csv_path),
        "--stream",
        "cli-lr-s",
        "-x",
        "a",
        "-x",
        "b",
        "-y",
        "y",
        "--chunk-size",
        "10",
        "--first-seq",
        "1",
        "--url",
        url,
    )
    assert r.exit_code == 0, r.output
    assert "posted 23 observations" in r.output
    with SgaisClient(url) as c:
        st = c.wait_until_processed("cli-lr-s", timeout=60)
        assert st["observations"] == 23 and st["chunks"] == 3
        assert c.evidence("cli-lr")["observations"] == 23
    # re-posting the same file with the same seqs is a no-op (duplicates)
    r = invoke(
        "post",
        str(csv_path),
        "--stream",
        "cli-lr-s",
        "-x",
        "a",
        "-x",
        "b",
        "-y",
        "y",
        "--chunk-size",
        "10",
        "--first-seq",
        "1",
        "--url",
        url,
    )
    assert r.exit_code == 0
    with SgaisClient(url) as c:
        assert c.stream("cli-lr-s")["observations"] == 23


def test_read_csv_columns(tmp_path):
    p = tmp_path / "v.csv"
    p.write_text("u,v,w\n1,2,3\n4,5,6\n")
    x, y = read_csv_columns(p, None, None)
    assert x is None and y == [3.0, 6.0]
    x, y = read_csv_columns(p, ["u"], ["v", "w"])
    assert x == [[1.0], [4.0]] and y == [[2.0, 3.0], [5.0, 6.0]]
    import typer

    with pytest.raises(typer.BadParameter):
        read_csv_columns(p, ["nope"], None)


def test_format_event():
    ev = {
        "type": "alert",
        "kind": "evidence_drop",
        "model": "m",
        "observation_index": 1000,
        "detected_at_index": 1499,
        "score": 12.5,
        "message": "drop",
    }
    assert "evidence_drop" in format_event(ev) and "1000" in format_event(ev)
    post = {"type": "posterior", "observations": 10, "models": [{"model": "a", "probability": 0.25}]}
    assert "a=0.250" in format_event(post)
    ev = {
        "type": "evidence",
        "model": "m",
        "observations": 10,
        "log_evidence": -3.0,
        "log_evidence_per_observation": -0.3,
        "last_block": {"annealing_steps": 2, "ess": 8.0},
    }
    assert "log Z=-3.000" in format_event(ev)
    assert json.loads(format_event({"type": "other", "x": 1})) == {"type": "other", "x": 1}


# ----- frictions of issue 14: re-run of post, unreachable server, wrong key, watch, export, plot ----------------
SHIFT_MODEL = ["--family", "linear_regression", "--params", '{"features": 2}']
SAMPLER = ["--sampler", '{"particles": 10, "burn_in": 5, "block_size": 10}']


def write_csv(path, rows: int, shift_from: int | None = None, seed: int = 0):
    import random

    rnd = random.Random(seed)
    lines = ["a,b,y"]
    for i in range(rows):
        a, b = rnd.gauss(0, 1), rnd.gauss(0, 1)
        y = a + 2 * b + 0.5 + rnd.gauss(0, 1) + (8.0 if shift_from is not None and i >= shift_from else 0.0)
        lines.append(f"{a:.6f},{b:.6f},{y:.6f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def post_args(path, stream, url, *extra):
    return [
        "post",
        str(path),
        "--stream",
        stream,
        "-x",
        "a",
        "-x",
        "b",
        "-y",
        "y",
        "--chunk-size",
        "10",
        *extra,
        "--url",
        url,
    ]


def test_post_rerun_never_doubles_and_continues(url, tmp_path):
    assert invoke("models", "create", "rr-m", "--stream", "rr", *SHIFT_MODEL, *SAMPLER, "--url", url).exit_code == 0
    full = write_csv(tmp_path / "full.csv", 23)
    head = tmp_path / "head.csv"
    head.write_text("\n".join(full.read_text().splitlines()[:21]) + "\n")  # the first 20 rows: 2 chunks
    r = invoke(*post_args(head, "rr", url))
    assert r.exit_code == 0 and "posted 20 observations" in r.output, r.output
    r = invoke(*post_args(full, "rr", url))  # continues after the 2 chunks the stream holds
    assert r.exit_code == 0 and "posted 3 observations" in r.output and "20 already on the stream" in r.output
    r = invoke(*post_args(full, "rr", url))  # a re-run posts nothing
    assert r.exit_code == 0 and "posted 0 observations" in r.output and "23 already" in r.output, r.output
    with SgaisClient(url) as c:
        assert c.stream("rr")["observations"] == 23 and c.stream("rr")["chunks"] == 3
    other = write_csv(tmp_path / "other.csv", 30, seed=9)
    r = invoke(*post_args(other, "rr", url))  # other data: refused in one line, nothing posted
    assert r.exit_code == 1 and "--append" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = invoke(*post_args(other, "rr", url, "--append"))
    assert r.exit_code == 0 and "posted 30 observations" in r.output
    with SgaisClient(url) as c:
        assert c.stream("rr")["observations"] == 53


@pytest.mark.parametrize("command", [["models", "list"], ["watch", "s"], ["export", "s"], ["predict", "m"]])
def test_unreachable_server_is_one_line(command, tmp_path):
    from service.demo import free_port

    r = invoke(*command, "--url", f"http://127.0.0.1:{free_port()}")
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the sgais service" in lines[0] and "SGAIS_URL" in lines[0], r.output


def test_unreachable_server_post_is_one_line(tmp_path):
    from service.demo import free_port

    r = invoke(*post_args(write_csv(tmp_path / "d.csv", 5), "s", f"http://127.0.0.1:{free_port()}"))
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and "cannot reach" in r.output


@pytest.fixture(scope="module")
def keyed_url(tmp_path_factory):
    """``sgais serve --workers 0`` with an embedded Redis and the API key ``alpha=ka``."""
    import os
    import subprocess
    import sys

    from service.demo import free_port
    from tests.conftest import wait_until

    tmp = tmp_path_factory.mktemp("keyed")
    port = free_port()
    env = dict(os.environ, SGAIS_API_KEYS="alpha=ka")
    env.pop("SGAIS_REDIS_URL", None)
    cmd = [sys.executable, "-c", "from service.cli import app; app()", "serve", "--port", str(port)]
    with (tmp / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [*cmd, "--data-dir", str(tmp / "data"), "--workers", "0"], stdout=log, stderr=log, env=env
        )
    u = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is None and SgaisClient(u).healthz(), timeout=90, interval=0.3)
        yield u
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_wrong_key_is_one_line(keyed_url):
    for command in (["models", "list"], ["watch", "s"], ["export", "s"]):
        r = invoke(*command, "--url", keyed_url, "--api-key", "wrong")
        assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
        assert "rejected the API key (401)" in r.output
    assert invoke("models", "list", "--url", keyed_url, "--api-key", "ka").exit_code == 0


def test_watch_waits_for_the_stream_then_prints_state_and_events(url, tmp_path):
    import subprocess
    import sys

    from tests.conftest import wait_until

    log = tmp_path / "watch.log"
    cmd = [sys.executable, "-c", "from service.cli import app; app()", "watch", "wt", "--timeout", "20", "--url", url]
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env={**__import__("os").environ, "COLUMNS": "200"}
        )
    try:
        wait_until(lambda: "waiting for stream wt" in log.read_text(), timeout=60, interval=0.2)
        assert proc.poll() is None  # still waiting, not a 404 exit
        assert invoke("models", "create", "wt-m", "--stream", "wt", *SHIFT_MODEL, *SAMPLER, "--url", url).exit_code == 0
        wait_until(lambda: "wt: 0 observations" in log.read_text(), timeout=60, interval=0.2)  # the state first
        assert invoke(*post_args(write_csv(tmp_path / "w.csv", 20), "wt", url)).exit_code == 0
        wait_until(lambda: "evidence wt-m: n=20" in log.read_text(), timeout=120, interval=0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # attaching to a stream that has data prints its current state at once
    r = invoke("watch", "wt", "--timeout", "1", "--url", url)
    assert r.exit_code == 0
    assert "wt: 20 observations in 2 chunks" in r.output and "evidence wt-m: n=20" in r.output
    assert "posterior n=20: wt-m=1.000" in r.output


def test_export_and_plot(url, tmp_path):
    import csv as csv_mod

    args = ["--stream", "ex", *SAMPLER, "--url", url]
    assert invoke("models", "create", "ex-a", *SHIFT_MODEL, *args).exit_code == 0
    assert (
        invoke(
            "models", "create", "ex-b", *SHIFT_MODEL[:2], "--params", '{"features": 2, "noise_std": 3.0}', *args
        ).exit_code
        == 0
    )
    data = write_csv(tmp_path / "ex.csv", 60, shift_from=40)
    assert invoke(*post_args(data, "ex", url)).exit_code == 0
    with SgaisClient(url) as c:
        c.wait_until_processed("ex", timeout=120)
        traces = {m: c.full_trace(m) for m in ("ex-a", "ex-b")}
        alerts = c.alerts(stream="ex")
    out = tmp_path / "ex-results.csv"
    r = invoke("export", "ex", "--out", str(out), "--url", url)
    assert r.exit_code == 0, r.output
    rows = list(csv_mod.DictReader(out.open()))
    evidence = [x for x in rows if x["record"] == "evidence"]
    # 6 blocks of 10 per model, the first split 1 + 1 + 8 (workers.engine.SINGLE_OBSERVATION_BLOCKS)
    assert len(evidence) == sum(len(t) for t in traces.values()) == 16
    by = {(x["model"], int(x["observations"])): x for x in evidence}
    for m, trace in traces.items():
        for t in trace:
            assert float(by[(m, t["observations"])]["log_evidence"]) == t["log_evidence"]
    for n in (10, 60):
        assert float(by[("ex-a", n)]["probability"]) + float(by[("ex-b", n)]["probability"]) == pytest.approx(1.0)
    assert len([x for x in rows if x["record"] == "alert"]) == len(alerts)
    r = invoke("export", "ex", "--url", url)  # to standard output
    assert r.output.startswith("record,model,observations,log_evidence")

    png = tmp_path / "ex.png"
    r = invoke("plot", "ex", "--out", str(png), "--csv", str(data), "-y", "y", "--url", url)
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    r = invoke("plot", "ex", "--out", str(tmp_path / "bare.png"), "--url", url)  # without the series itself
    assert r.exit_code == 0 and (tmp_path / "bare.png").stat().st_size > 20_000


def test_predict_command(url):
    with SgaisClient(url) as c:
        c.create_model("pr", family="autoregressive", params={"order": 1, "noise_std": 1.0}, sampler={"particles": 10})
        c.post_chunk("pr", y=[0.1, 0.3, -0.2, 0.4, 0.0])
        c.wait_until_processed("pr", timeout=120)
    r = invoke("predict", "pr", "--horizon", "2", "--url", url)
    assert r.exit_code == 0, r.output
    assert "pr after 5 observations" in r.output and "step 2: mean" in r.output and "90% [" in r.output
    with SgaisClient(url) as c:
        c.create_model("pr-lin", family="linear_regression", params={"features": 2}, sampler={"particles": 10})
        c.post_chunk("pr-lin", x=[[0.0, 1.0]], y=[2.0])
        c.wait_until_processed("pr-lin", timeout=120)
    r = invoke("predict", "pr-lin", "--url", url)  # a regression model predicts at covariate rows
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and "x" in r.output, r.output
    r = invoke("predict", "pr-lin", "--x", "[[0.0, 0.0], [1.0, 1.0]]", "--url", url)
    assert r.exit_code == 0 and "step 2: mean" in r.output, r.output


def test_export_scores_models_on_the_stream_posteriors_observations(url):
    """``export`` (and ``plot``) compare the models on the observations after the stream's ``conditioned_on``, as
    the stream posterior does: an AR(2) model beside an i.i.d. one, the export's probabilities at the last common
    count equal the stream posterior's."""
    from service.cli_stream import export_rows, stream_results

    sampler = {"particles": 10, "burn_in": 5, "block_size": 10}
    with SgaisClient(url) as c:
        c.create_model("exc-ar", family="autoregressive", params={"order": 2}, stream="exc", sampler=sampler)
        c.create_model("exc-g", family="gmm", params={"dim": 1, "components": 1}, stream="exc", sampler=sampler)
        ys = [3.0, -2.5] + [0.1 * ((7 * i) % 11 - 5) for i in range(28)]  # extreme first values (issue 10)
        c.post_chunk("exc", y=ys)
        c.wait_until_processed("exc", timeout=120)
        res = stream_results(c, "exc")
        post = c.stream_posterior("exc")
    assert res.conditioned_on == post["conditioned_on"] == 2
    rows = export_rows(res)
    n = post["observations"]
    exported = {r["model"]: r["probability"] for r in rows if r["record"] == "evidence" and r["observations"] == n}
    for m in post["models"]:
        assert exported[m["model"]] == pytest.approx(m["probability"], rel=1e-9, abs=1e-12)
