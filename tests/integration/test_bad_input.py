"""Malformed requests get the right 4xx, a message naming the field, and change no state."""

from __future__ import annotations

import json

import pytest
import redis
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import SMALL_MODEL

GOOD = {"seq": 1, "x": [[0.5, 1.0], [1.5, -2.0]], "y": [1.0, 2.0]}
CHUNKS = "/v1/streams/s/chunks"

# (id, method, path, body (dict or raw str), status, text the detail must contain)
CASES = [
    ("nan", "POST", CHUNKS, '{"x": [[1, 2]], "y": [NaN]}', 422, "y[0]"),
    ("inf", "POST", CHUNKS, '{"x": [[1, 2], [1, Infinity]], "y": [1, 2]}', 422, "x[1]"),
    ("wrong-dimension", "POST", CHUNKS, {"x": [[1, 2, 3]], "y": [1]}, 422, "x[0]"),
    ("ragged-rows", "POST", CHUNKS, {"x": [[1, 2], [1]], "y": [1, 2]}, 422, "x[1]"),
    ("x-y-length", "POST", CHUNKS, {"x": [[1, 2]], "y": [1, 2]}, 422, '"x"'),
    ("label-out-of-range", "POST", "/v1/streams/c/chunks", {"x": [[1, 2], [0, 0]], "y": [0, 3]}, 422, "y[1]"),
    ("label-not-integer", "POST", "/v1/streams/c/chunks", {"x": [[1, 2]], "y": [0.5]}, 422, "y[0]"),
    ("empty-y", "POST", CHUNKS, {"x": [], "y": []}, 422, '"y"'),
    ("missing-x", "POST", CHUNKS, {"y": [1.0]}, 422, '"x"'),
    ("missing-y", "POST", CHUNKS, {"x": [[1, 2]]}, 422, '"y"'),
    ("unknown-field", "POST", CHUNKS, {**GOOD, "seq": 2, "extra": 1}, 422, "extra"),
    (
        "oversize-body",
        "POST",
        CHUNKS,
        {"x": [[1.0, 2.0]] * 40, "y": [1.0] * 40, "pad": "z" * 4096},
        413,
        "SGAIS_MAX_BODY_BYTES",
    ),
    ("too-many-observations", "POST", CHUNKS, {"x": [[1, 2]] * 51, "y": [1] * 51}, 413, "y: 51 observations"),
    ("seq-gap", "POST", CHUNKS, {**GOOD, "seq": 3}, 409, "seq"),
    ("seq-replay-different", "POST", CHUNKS, {**GOOD, "y": [1.0, 2.5]}, 409, "seq"),
    ("seq-string", "POST", CHUNKS, {**GOOD, "seq": "2"}, 422, "seq"),
    ("seq-zero", "POST", CHUNKS, {**GOOD, "seq": 0}, 422, "seq"),
    ("y-string", "POST", CHUNKS, {"x": [[1, 2]], "y": ["a"]}, 422, "y[0]"),
    ("y-not-list", "POST", CHUNKS, {"x": [[1, 2]], "y": 3}, 422, '"y"'),
    ("invalid-json", "POST", CHUNKS, '{"x": [[1, 2]], "y": [1]', 422, "json"),
    ("unknown-stream", "POST", "/v1/streams/nope/chunks", {"x": [[1, 2]], "y": [1]}, 404, "nope"),
    ("invalid-stream-name", "POST", "/v1/streams/Bad!/chunks", {"x": [[1, 2]], "y": [1]}, 422, "stream"),
    ("unknown-family", "POST", "/v1/models", {"name": "m2", "family": "nope"}, 422, "family"),
    (
        "unknown-param",
        "POST",
        "/v1/models",
        {"name": "m2", "family": "linear_regression", "params": {"features": 2, "bogus": 1}},
        422,
        "bogus",
    ),
    ("missing-param", "POST", "/v1/models", {"name": "m2", "family": "linear_regression"}, 422, "features"),
    (
        "unknown-sampler-setting",
        "POST",
        "/v1/models",
        {"name": "m2", **SMALL_MODEL, "sampler": {"particlez": 5}},
        422,
        "particlez",
    ),
    (
        "bad-sampler-value",
        "POST",
        "/v1/models",
        {"name": "m2", **SMALL_MODEL, "sampler": {"particles": 1}},
        422,
        "particles",
    ),
    ("unknown-alert-setting", "POST", "/v1/models", {"name": "m2", **SMALL_MODEL, "alerts": {"x": 1}}, 422, "alerts"),
    ("invalid-name", "POST", "/v1/models", {"name": "Bad Name", **SMALL_MODEL}, 422, "name"),
    (
        "negative-prior",
        "POST",
        "/v1/models",
        {"name": "m2", **SMALL_MODEL, "prior_probability": -1},
        422,
        "prior_probability",
    ),
    (
        "wrong-type-params",
        "POST",
        "/v1/models",
        {"name": "m2", "family": "linear_regression", "params": [2]},
        422,
        "params",
    ),
    (
        "schema-mismatch",
        "POST",
        "/v1/models",
        {"name": "m2", "stream": "s", "family": "linear_regression", "params": {"features": 5}},
        422,
        "params",
    ),
    ("duplicate-model", "POST", "/v1/models", {"name": "a", "stream": "s", **SMALL_MODEL}, 409, "exists"),
    ("trace-limit", "GET", "/v1/models/a/trace?limit=0", None, 422, "limit"),
    ("unknown-model", "DELETE", "/v1/models/zz", None, 404, "zz"),
]


def dump(r: redis.Redis, prefix: str) -> dict[bytes, bytes]:
    return {k: r.dump(k) for k in sorted(r.scan_iter(match=f"{prefix}:*", count=1000))}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_rejected_without_trace(settings, case):
    name, method, path, body, status, needle = case
    s = settings.model_copy(update={"max_body_bytes": 2048, "max_chunk_observations": 50})
    r = redis.Redis.from_url(s.redis_url)
    with TestClient(create_app(s, workers=0)) as c:
        assert c.post("/v1/models", json={"name": "a", "stream": "s", **SMALL_MODEL}).status_code == 201
        assert (
            c.post(
                "/v1/models",
                json={
                    "name": "clf",
                    "stream": "c",
                    "family": "logistic_regression",
                    "params": {"features": 2, "classes": 3},
                },
            ).status_code
            == 201
        )
        assert c.post(CHUNKS, json=GOOD).status_code == 202
        before = dump(r, s.key_prefix)
        kwargs = (
            {"content": body, "headers": {"content-type": "application/json"}}
            if isinstance(body, str)
            else ({"json": body} if body is not None else {})
        )
        res = c.request(method, path, **kwargs)
        assert res.status_code == status, res.text
        detail = json.dumps(res.json()["detail"])
        assert needle.lower() in detail.lower(), detail
        assert dump(r, s.key_prefix) == before
