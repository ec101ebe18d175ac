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
