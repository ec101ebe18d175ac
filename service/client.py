"""Python client for the SGAIS HTTP API (/work/shared/API.md, version 1).

Synchronous, on ``httpx``; the live event stream uses the ``websockets`` sync client.

>>> c = SgaisClient("http://127.0.0.1:8000")                      # doctest: +SKIP
>>> c.create_model("ar1", family="autoregressive", params={"order": 1})  # doctest: +SKIP
>>> c.post_chunk("ar1", y=[0.1, 0.3, -0.2], seq=1)                # doctest: +SKIP
>>> c.wait_until_processed("ar1")                                  # doctest: +SKIP
>>> c.stream_posterior("ar1")["models"]                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx

__all__ = ["ApiError", "ModelFailedError", "SgaisClient"]


class ApiError(Exception):
    """A 4xx/5xx answer: ``status`` (HTTP code) and ``detail`` (the body's ``detail``, or its text)."""

    def __init__(self, status: int, detail: Any, method: str = "", url: str = ""):
        self.status = status
        self.detail = detail
        super().__init__(f"{method} {url} -> {status}: {detail}")


class ModelFailedError(RuntimeError):
    """A model stopped with status ``error``: ``stream``, ``model``, ``error`` (the service's message, e.g.
    ``NumericalError: SGHMC diverged ...``) and ``evidence`` (its evidence body)."""

    def __init__(self, stream: str, model: str, error: str, evidence: dict[str, Any] | None = None):
        self.stream = stream
        self.model = model
        self.error = error
        self.evidence = evidence or {}
        super().__init__(f"stream {stream}: model {model} failed: {error}")


def _ws_url(base_url: str) -> str:
    if base_url.startswith("https://"):
        return "wss://" + base_url[len("https://") :]
    if base_url.startswith("http://"):
        return "ws://" + base_url[len("http://") :]
    return base_url


class SgaisClient:
    """Client for one SGAIS service.

    Parameters
    ----------
    base_url : str
        e.g. ``http://127.0.0.1:8000`` (the ``/v1`` prefix is added here).
    api_key : str | None
        Bearer key (``SGAIS_API_KEYS`` on the server); None for an open service.
    timeout : float
        Per-request timeout (seconds).
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, *, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    # ----- plumbing ---------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SgaisClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request; raise :class:`ApiError` on 4xx/5xx, ``httpx.TransportError`` if unreachable."""
        r = self._http.request(method, path, **kwargs)
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except (ValueError, AttributeError):
                detail = r.text
            raise ApiError(r.status_code, detail, method, str(r.url))
        return r

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self._request(method, path, **kwargs)
        return None if r.status_code == 204 or not r.content else r.json()

    # ----- operations -------------------------------------------------------------------------
    def healthz(self) -> bool:
        """True when ``GET /healthz`` answers 2xx (False when unreachable)."""
        try:
            return self._http.get("/healthz").status_code < 300
        except httpx.TransportError:
            return False

    def readyz(self) -> bool:
        """True when ``GET /readyz`` answers 2xx (Redis reachable, a worker alive)."""
        try:
            return self._http.get("/readyz").status_code < 300
        except httpx.TransportError:
            return False

    def live_workers(self) -> int:
        """Workers with a fresh heartbeat (``GET /readyz``'s ``workers``; 0 when unreachable or not ready)."""
        try:
            r = self._http.get("/readyz")
        except httpx.TransportError:
            return 0
        return int(r.json().get("workers", 0)) if r.status_code < 300 else 0

    def metrics(self) -> str:
        """Prometheus text of ``GET /metrics``."""
        return self._request("GET", "/metrics").text

    # ----- models -----------------------------------------------------------------------------
    def create_model(
        self,
        name: str,
        *,
        family: str,
        params: dict[str, Any] | None = None,
        stream: str | None = None,
        sampler: dict[str, Any] | None = None,
        prior_probability: float | None = None,
        alerts: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/models`` → the model resource. 409 duplicate, 422 invalid (as :class:`ApiError`)."""
        body: dict[str, Any] = {"name": name, "family": family, "params": params or {}}
        if stream is not None:
            body["stream"] = stream
        if sampler is not None:
            body["sampler"] = sampler
        if prior_probability is not None:
            body["prior_probability"] = prior_probability
        if alerts is not None:
            body["alerts"] = alerts
        return self._json("POST", "/v1/models", json=body)

    def list_models(self) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/models")["items"]

    def get_model(self, name: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/models/{name}")

    def delete_model(self, name: str) -> None:
        self._json("DELETE", f"/v1/models/{name}")

    # ----- chunks -----------------------------------------------------------------------------
    def post_chunk(
        self,
        stream: str | None = None,
        *,
        y: list[Any],
        x: list[list[float]] | None = None,
        seq: int | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """Post a chunk to ``stream`` (or to ``model``'s stream): ``{"stream", "seq", "first_index", ...}``."""
        if (stream is None) == (model is None):
            raise ValueError("give exactly one of stream or model")
        body: dict[str, Any] = {"y": y}
        if x is not None:
            body["x"] = x
        if seq is not None:
            body["seq"] = seq
        path = f"/v1/streams/{stream}/chunks" if stream is not None else f"/v1/models/{model}/chunks"
        return self._json("POST", path, json=body)

    # ----- streams, evidence, posterior -------------------------------------------------------
    def stream(self, stream: str) -> dict[str, Any]:
        """``GET /v1/streams/{stream}``: schema, chunks, observations, per-model progress."""
        return self._json("GET", f"/v1/streams/{stream}")

    def evidence(self, model: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/models/{model}/evidence")

    def trace(self, model: str, *, since_index: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        """One page of ``GET /v1/models/{model}/trace``."""
        return self._json("GET", f"/v1/models/{model}/trace", params={"since_index": since_index, "limit": limit})[
            "items"
        ]

    def full_trace(self, model: str, *, page: int = 1000) -> list[dict[str, Any]]:
        """Every trace row, following the pages (the next page starts at the last row's ``observations``)."""
        rows: list[dict[str, Any]] = []
        since = 0
        while True:
            items = self.trace(model, since_index=since, limit=page)
            rows.extend(items)
            if len(items) < page:
                return rows
            since = items[-1]["observations"]

    def posterior(self, model: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/models/{model}/posterior")

    def predictive(self, model: str, *, horizon: int = 1, x: list[list[float]] | None = None) -> dict[str, Any]:
        """Posterior predictive of the next ``horizon`` observations, or of one observation per covariate row
        ``x`` (regression families): ``{"model", "stream", "observations", "horizon", "draws", "steps": [{"step",
        "mean", "std", "q05", "q95", "mean_se"}]}``."""
        if x is not None:
            return self._json("POST", f"/v1/models/{model}/predictive", json={"x": x})
        return self._json("GET", f"/v1/models/{model}/predictive", params={"horizon": horizon})

    def stream_posterior(self, stream: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/streams/{stream}/posterior")

    def alerts(
        self,
        *,
        stream: str | None = None,
        model: str | None = None,
        kind: str | None = None,
        since: str | int | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            k: v for k, v in {"stream": stream, "model": model, "kind": kind, "since": since}.items() if v is not None
        }
        return self._json("GET", "/v1/alerts", params=params)["items"]

    def wait_until_processed(self, stream: str, *, timeout: float = 300.0, poll: float = 0.2) -> dict[str, Any]:
        """Poll ``GET /v1/streams/{stream}`` until every model has processed every observation.

        A model that has not caught up is checked (``GET /v1/models/{model}/evidence``): a model in
        ``error`` will never catch up, so it is reported at once instead of waiting for the timeout.

        Returns the last stream body.

        Raises
        ------
        ModelFailedError
            A model of the stream is in ``error`` (its name and its error message are attributes).
        TimeoutError
            The models have not caught up after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            body = self.stream(stream)
            lagging = [m for m in body["models"] if m["observations_processed"] < body["observations"]]
            if not lagging:
                return body
            for m in lagging:
                ev = self.evidence(m["name"])
                if ev["status"] == "error":
                    raise ModelFailedError(stream, m["name"], ev.get("error") or "", ev)
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {stream}: models not caught up after {timeout:.0f} s: {body['models']}")
            time.sleep(poll)

    # ----- live events ------------------------------------------------------------------------
    def events(self, stream: str, *, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Yield the JSON events of ``WS /v1/streams/{stream}/events`` (evidence, alert, posterior).

        ``timeout``: seconds to wait for each message (None = forever); a quiet socket then
        ends the iteration. The socket closes when the generator is closed. A refused
        handshake (e.g. 401, 404) raises :class:`ApiError`.
        """
        from websockets.exceptions import ConnectionClosed, InvalidStatus
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        url = f"{_ws_url(self.base_url)}/v1/streams/{stream}/events"
        try:
            ws = connect(url, additional_headers=headers)
        except InvalidStatus as err:  # the handshake was refused (401, 404, ...)
            raise ApiError(err.response.status_code, err.response.body.decode(errors="replace"), "WS", url) from None
        with ws:
            while True:
                try:
                    msg = ws.recv(timeout=timeout)
                except (TimeoutError, ConnectionClosed):
                    return
                yield json.loads(msg)
