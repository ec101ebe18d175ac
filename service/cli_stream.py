"""Client-side ``sgais`` commands about one stream's results: ``export`` (CSV), ``plot`` (PNG), ``predict``."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import typer

from service.cli import app
from service.cli_common import API_KEY, URL, _client, console, handled
from service.client import SgaisClient

EXPORT_COLUMNS = [
    "record",
    "model",
    "observations",
    "log_evidence",
    "log_evidence_se",
    "log_predictive",
    "probability",
    "kind",
    "observation_index",
    "detected_at_index",
    "score",
    "message",
    "created_at",
]


class StreamResults(NamedTuple):
    """What ``export`` and ``plot`` draw from: every model's full trace, the models' prior weights, the
    stream's alerts and its posterior (``conditioned_on``: the models are compared on the observations
    after it, API.md "Model comparison")."""

    traces: dict[str, list[dict]]
    priors: dict[str, float]
    alerts: list[dict]
    posterior: dict[str, Any]

    @property
    def conditioned_on(self) -> int:
        return int(self.posterior.get("conditioned_on") or 0)


def stream_results(c: SgaisClient, stream: str) -> StreamResults:
    st = c.stream(stream)
    names = [m["name"] for m in st["models"]]
    traces = {m: c.full_trace(m) for m in names}
    priors = {m: c.get_model(m).get("prior_probability", 1.0) for m in names}
    return StreamResults(traces, priors, c.alerts(stream=stream), c.stream_posterior(stream))


def export_rows(res: StreamResults) -> list[dict[str, Any]]:
    """``evidence`` rows (one per processed block of each model; ``probability`` at the counts every model
    has reached, on the observations after the stream's ``conditioned_on``,
    :func:`service.plots.probabilities_over_time`) then ``alert`` rows."""
    from service.plots import probabilities_over_time

    traces, alerts = res.traces, res.alerts
    counts, probs = probabilities_over_time(traces, res.priors, res.conditioned_on)
    at = {m: dict(zip(counts.tolist(), p.tolist(), strict=True)) for m, p in probs.items()}
    rows: list[dict[str, Any]] = []
    for m, trace in traces.items():
        for r in trace:
            rows.append(
                {
                    "record": "evidence",
                    "model": m,
                    "observations": r["observations"],
                    "log_evidence": r["log_evidence"],
                    "log_evidence_se": r.get("log_evidence_se"),
                    "log_predictive": r.get("log_predictive"),
                    "probability": at.get(m, {}).get(r["observations"]),
                }
            )
    rows.sort(key=lambda r: (r["observations"], r["model"]))
    for a in alerts:
        rows.append({"record": "alert", **{k: a.get(k) for k in EXPORT_COLUMNS[7:]}, "model": a.get("model")})
    return rows


@app.command("export")
def export(
    stream: str = typer.Argument(..., help="stream to export"),
    out: Path | None = typer.Option(None, "--out", "-o", help="CSV file (default: standard output)"),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """CSV of a stream's evidence per block, model probabilities and alerts.

    One ``evidence`` row per processed block of each model (running log-evidence, its standard error, the
    block's log-predictive, the model's probability where every model has reached that count), then one
    ``alert`` row per alert; the column ``record`` says which."""
    with _client(url, api_key) as c, handled(url):
        rows = export_rows(stream_results(c, stream))
    fh = out.open("w", newline="") if out else sys.stdout
    try:
        writer = csv.DictWriter(fh, fieldnames=EXPORT_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    finally:
        if out:
            fh.close()
    if out:
        console.print(f"wrote {len(rows)} rows to {out}", highlight=False)


@app.command("plot")
def plot(
    stream: str = typer.Argument(..., help="stream to plot"),
    out: Path = typer.Option(None, "--out", "-o", help="PNG file (default: STREAM.png)"),
    csv_file: Path | None = typer.Option(
        None, "--csv", exists=True, dir_okay=False, help="the CSV posted to the stream, to draw the series itself"
    ),
    y_col: str | None = typer.Option(None, "--y-col", "-y", help="observation column of --csv (default: the last)"),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """The demo's figure for any stream (PNG).

    Panels: the series (from --csv, if given) with the alerts, each model's log-evidence relative to the
    models' mean, and the model probabilities over time."""
    from service.plots import series_figure

    out = out or Path(f"{stream}.png")
    values = np.array([])
    if csv_file is not None:
        from service.cli_client import read_csv_columns

        _, ys = read_csv_columns(csv_file, None, [y_col] if y_col else None)
        values = np.asarray(ys, dtype=float)
        if values.ndim > 1:
            raise typer.BadParameter("plot draws one observation column: give --y-col")
    with _client(url, api_key) as c, handled(url):
        res = stream_results(c, stream)
    leader = max(res.posterior["models"], key=lambda m: m.get("probability") or 0.0, default=None)
    title = f"{stream}: {len(res.alerts)} alerts" + (f"; most probable {leader['model']}" if leader else "")
    series_figure(
        out,
        title=title,
        values=values,
        annotations={},
        traces=res.traces,
        alerts=res.alerts,
        priors=res.priors,
        conditioned_on=res.conditioned_on,
    )
    console.print(f"wrote {out}", highlight=False)


@app.command("predict")
def predict(
    model: str = typer.Argument(..., help="model name"),
    horizon: int = typer.Option(1, "--horizon", "-h", min=1, help="steps ahead (families without covariates)"),
    x: str | None = typer.Option(None, "--x", help="covariate rows as JSON, e.g. '[[0.1, 2.0]]' (regression)"),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """Posterior predictive of the next observations: mean, std and the 90% interval per step."""
    rows = None
    if x is not None:
        try:
            rows = json.loads(x)
        except json.JSONDecodeError as err:
            raise typer.BadParameter(f"--x is not JSON: {err}") from None
    with _client(url, api_key) as c, handled(url):
        body = c.predictive(model, horizon=horizon, x=rows)
    console.print(f"{model} after {body['observations']} observations ({body['draws']} simulated values per step)")
    for s in body["steps"]:
        console.print(
            f"step {s['step']}: mean {_fmt(s['mean'])} ± {_fmt(s['mean_se'])}  std {_fmt(s['std'])}  "
            f"90% [{_fmt(s['q05'])}, {_fmt(s['q95'])}]",
            highlight=False,
        )


def _fmt(v: float | list[float]) -> str:
    return f"{v:.4g}" if isinstance(v, float | int) else "[" + ", ".join(f"{u:.4g}" for u in v) + "]"
