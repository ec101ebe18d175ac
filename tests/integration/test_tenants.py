"""Tenant isolation: no key 401; another tenant's model or stream 404 on every route and the WebSocket."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from service.app import create_app
from tests.conftest import SMALL_MODEL

ALICE, BOB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
CHUNK = {"x": [[1.0, 2.0]], "y": [0.5]}

SCOPED = [  # routes naming alice's model "a" or stream "s"
    ("GET", "/v1/models/a", None),
    ("DELETE", "/v1/models/a", None),
    ("POST", "/v1/models/a/chunks", CHUNK),
    ("GET", "/v1/models/a/evidence", None),
    ("GET", "/v1/models/a/trace", None),
    ("GET", "/v1/models/a/posterior", None),
    ("POST", "/v1/streams/s/chunks", CHUNK),
    ("GET", "/v1/streams/s", None),
    ("GET", "/v1/streams/s/posterior", None),
]
UNSCOPED = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/models", {"name": "z", **SMALL_MODEL}),
    ("GET", "/v1/alerts", None),
]


@pytest.fixture
def client(settings):
    s = settings.model_copy(update={"api_keys": "alice=ka,bob=kb"})
    with TestClient(create_app(s, workers=0)) as c:
        assert c.post("/v1/models", json={"name": "a", "stream": "s", **SMALL_MODEL}, headers=ALICE).status_code == 201
        assert c.post("/v1/streams/s/chunks", json=CHUNK, headers=ALICE).status_code == 202
        yield c


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic ka"}])
def test_missing_or_wrong_key_is_401_everywhere(client, headers):
    for method, path, body in SCOPED + UNSCOPED:
        res = client.request(method, path, json=body, headers=headers)
        assert res.status_code == 401, (method, path, res.text)
        assert res.headers["www-authenticate"] == "Bearer"


def test_other_tenants_resources_are_404(client):
    for method, path, body in SCOPED:
        res = client.request(method, path, json=body, headers=BOB)
        assert res.status_code == 404, (method, path, res.text)
    assert client.get("/v1/models", headers=BOB).json()["items"] == []
    assert client.get("/v1/alerts", headers=BOB).json()["items"] == []
    # the same names are free in bob's namespace, and alice's model is untouched
    assert client.post("/v1/models", json={"name": "a", "stream": "s", **SMALL_MODEL}, headers=BOB).status_code == 201
    assert client.get("/v1/streams/s", headers=BOB).json()["chunks"] == 0
    assert client.get("/v1/streams/s", headers=ALICE).json()["chunks"] == 1


def test_websocket_auth(client):
    with pytest.raises(WebSocketDenialResponse) as denied:
        with client.websocket_connect("/v1/streams/s/events"):
            pass
    assert denied.value.status_code == 401
    with pytest.raises(WebSocketDenialResponse) as denied:
        with client.websocket_connect("/v1/streams/s/events?token=kb"):
            pass
    assert denied.value.status_code == 404
    with client.websocket_connect("/v1/streams/s/events?token=ka") as ws:
        ws.send_json({"type": "chunk", **CHUNK})
        assert ws.receive_json()["type"] == "ack"
    with client.websocket_connect("/v1/streams/s/events", headers=ALICE) as ws:
        ws.send_json({"type": "chunk", **CHUNK})
        assert ws.receive_json()["seq"] == 3
